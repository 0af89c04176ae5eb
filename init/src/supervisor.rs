//! The supervisor: one owner of all service state, driven only by events (child exits, output,
//! readiness messages, control requests, signals) and by the next deadline it computes itself.
//! Nothing here polls, and nothing waits on a service: every wait is a deadline.

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nasos_board::plan::{Plan, Readiness, Restart, Service};
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot};

use crate::cgroup::{self, CgroupRoot};
use crate::console::Console;
use crate::graph;
use crate::logs::{CappedFile, LineSplitter, Ring};
use crate::process;
pub use nasos_api::ShutdownKind;
use nasos_api::{LogPage, ServiceInfo, Status, TimelineEntry};

/// Bytes of recent output kept in memory per service.
const RING_BYTES: usize = 64 * 1024;
/// Size at which a service's log file is rotated.
const LOG_FILE_CAP: u64 = 1 << 20;
/// A service that stayed up this long starts its backoff afresh when it next fails.
const STABLE_AFTER: Duration = Duration::from_secs(10);

/// Requests from the control API. Each carries the channel its answer goes back on.
pub enum Request {
    Status(oneshot::Sender<Status>),
    Services(oneshot::Sender<Vec<ServiceInfo>>),
    Start(String, oneshot::Sender<Result<(), String>>),
    Stop(String, oneshot::Sender<Result<(), String>>),
    Restart(String, oneshot::Sender<Result<(), String>>),
    Logs(String, u64, u32, oneshot::Sender<Result<LogPage, String>>),
    Timeline(oneshot::Sender<Vec<TimelineEntry>>),
    Shutdown(ShutdownKind, oneshot::Sender<()>),
}

/// What the per-service I/O tasks report.
pub enum Event {
    Output { svc: usize, line: String },
    Notify { svc: usize, message: String },
    ReadyFd { svc: usize, generation: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not started: waiting for dependencies (or not wanted).
    Waiting,
    /// Running, not ready yet.
    Starting,
    /// Running and ready.
    Running,
    /// A oneshot that exited 0.
    Done,
    /// Waiting to be restarted.
    Backoff,
    Stopping,
    Stopped,
    Failed,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Waiting => "waiting",
            State::Starting => "starting",
            State::Running => "running",
            State::Done => "done",
            State::Backoff => "backoff",
            State::Stopping => "stopping",
            State::Stopped => "stopped",
            State::Failed => "failed",
        }
    }
}

/// Phases of stopping one service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopPhase {
    /// The service's stop command runs.
    StopCommand,
    /// SIGTERM sent to the cgroup; waiting for the main process.
    Term,
    /// SIGKILL sent; waiting for the kernel to deliver it.
    Kill,
}

struct Svc {
    spec: Service,
    deps: Vec<usize>,
    state: State,
    wanted: bool,
    restart_requested: bool,
    pid: Option<Pid>,
    generation: u64,
    restarts: u32,
    failures_in_row: u32,
    recent_starts: VecDeque<Instant>,
    since: Instant,
    first_start: Option<Instant>,
    first_ready: Option<Instant>,
    ready_since: Option<Instant>,
    last_exit: String,
    detail: String,
    deadline: Option<Instant>,
    stop_phase: Option<StopPhase>,
    helper: Option<Pid>,
    cgroup: Option<PathBuf>,
    cgroup_procs: Option<OwnedFd>,
    notify_path: Option<PathBuf>,
    log: Ring,
}

#[derive(Clone)]
pub struct Config {
    pub plan: Plan,
    pub run_dir: PathBuf,
    pub log_dir: Option<PathBuf>,
    pub cgroups: Option<CgroupRoot>,
    pub pid1: bool,
    pub kernel_ms: i64,
}

pub struct Supervisor {
    plan: Plan,
    services: Vec<Svc>,
    by_name: HashMap<String, usize>,
    run_dir: PathBuf,
    cgroups: Option<CgroupRoot>,
    pid1: bool,
    kernel_ms: i64,
    t0: Instant,
    ready_at: Option<Instant>,
    announced_degraded: bool,
    shutdown: Option<ShutdownKind>,
    orphans_reaped: u64,
    console: Console,
    events: mpsc::Sender<Event>,
    plan_error: Option<String>,
}

impl Supervisor {
    pub fn new(config: Config, t0: Instant, console: Console, events: mpsc::Sender<Event>) -> Self {
        let Config { plan, run_dir, log_dir, cgroups, pid1, kernel_ms } = config;
        let plan_error = graph::check(&plan.services).err();
        let specs = if plan_error.is_some() { Vec::new() } else { plan.services.clone() };
        let by_name: HashMap<String, usize> = specs.iter().enumerate().map(|(i, s)| (s.name.clone(), i)).collect();
        let services = specs
            .into_iter()
            .map(|spec| {
                let deps = spec.after.iter().filter_map(|a| by_name.get(a).copied()).collect();
                let file = log_dir
                    .as_ref()
                    .and_then(|d| CappedFile::open(d.join(format!("{}.log", spec.name)), LOG_FILE_CAP).ok());
                Svc {
                    deps,
                    state: State::Waiting,
                    wanted: true,
                    restart_requested: false,
                    pid: None,
                    generation: 0,
                    restarts: 0,
                    failures_in_row: 0,
                    recent_starts: VecDeque::new(),
                    since: t0,
                    first_start: None,
                    first_ready: None,
                    ready_since: None,
                    last_exit: String::new(),
                    detail: String::new(),
                    deadline: None,
                    stop_phase: None,
                    helper: None,
                    cgroup: None,
                    cgroup_procs: None,
                    notify_path: None,
                    log: Ring::new(RING_BYTES, file),
                    spec,
                }
            })
            .collect();
        if let Some(e) = &plan_error {
            console.say(&format!("the plan's service graph is unusable, starting nothing: {e}"));
        }
        Supervisor {
            plan,
            services,
            by_name,
            run_dir,
            cgroups,
            pid1,
            kernel_ms,
            t0,
            ready_at: None,
            announced_degraded: false,
            shutdown: None,
            orphans_reaped: 0,
            console,
            events,
            plan_error,
        }
    }

    fn ms(&self, t: Option<Instant>) -> i64 {
        t.map_or(-1, |t| t.duration_since(self.t0).as_millis() as i64)
    }

    fn set_state(&mut self, i: usize, state: State, detail: impl Into<String>) {
        let s = &mut self.services[i];
        s.state = state;
        s.since = Instant::now();
        s.detail = detail.into();
        if state != State::Running && state != State::Done {
            s.ready_since = None;
        }
    }

    fn is_ready(&self, i: usize) -> bool {
        matches!(self.services[i].state, State::Running | State::Done)
    }

    /// Starts every service that is wanted, not running, and whose dependencies are ready.
    pub fn schedule(&mut self) {
        if self.shutdown.is_some() {
            return;
        }
        for i in 0..self.services.len() {
            let s = &self.services[i];
            if s.state != State::Waiting || !s.wanted {
                continue;
            }
            let blocked: Vec<String> =
                s.deps.iter().filter(|&&d| !self.is_ready(d)).map(|&d| self.services[d].spec.name.clone()).collect();
            if blocked.is_empty() {
                self.start(i);
            } else {
                self.services[i].detail = format!("waiting for {}", blocked.join(", "));
            }
        }
        self.check_overall();
    }

    fn start(&mut self, i: usize) {
        let now = Instant::now();
        let name = self.services[i].spec.name.clone();
        if self.services[i].cgroup.is_none()
            && let Some(root) = &self.cgroups
        {
            match root.prepare(&name) {
                Ok((dir, procs)) => {
                    self.services[i].cgroup = Some(dir);
                    self.services[i].cgroup_procs = Some(procs);
                }
                Err(e) => {
                    self.console.say(&format!("{name}: no cgroup ({e}); its processes are tracked by session only"))
                }
            }
        }
        if let Some(cg) = &self.services[i].cgroup {
            // Nothing of a previous run may linger into the next.
            cgroup::kill_all(cg);
        }
        if self.services[i].spec.readiness == Readiness::Notify && self.services[i].notify_path.is_none() {
            match self.bind_notify(i) {
                Ok(path) => self.services[i].notify_path = Some(path),
                Err(e) => self.console.say(&format!("{name}: cannot create its notify socket: {e}")),
            }
        }
        let ready_fd = match self.services[i].spec.readiness {
            Readiness::Fd { fd } => Some(fd),
            _ => None,
        };
        let s = &self.services[i];
        let spec = process::Spec {
            command: &s.spec.command,
            environment: &s.spec.environment,
            user: s.spec.user.as_deref(),
            working_directory: s.spec.working_directory.as_deref(),
            cgroup_procs: s.cgroup_procs.as_ref(),
            notify_socket: s.notify_path.as_deref(),
            ready_fd,
        };
        let result = process::spawn(&spec);
        let s = &mut self.services[i];
        if s.first_start.is_some() {
            s.restarts += 1;
        }
        s.first_start.get_or_insert(now);
        s.recent_starts.push_back(now);
        s.generation += 1;
        match result {
            Err(e) => {
                s.last_exit = format!("could not start: {e}");
                s.log.push(&format!("nasinit: could not start {}: {e}", s.spec.command.join(" ")));
                self.after_exit(i, false);
            }
            Ok(spawned) => {
                s.pid = Some(spawned.pid);
                let generation = s.generation;
                self.read_output(i, spawned.output);
                if let Some(r) = spawned.ready {
                    self.read_ready_fd(i, generation, r);
                }
                match self.services[i].spec.readiness.clone() {
                    Readiness::Started => self.became_ready(i),
                    Readiness::Check { .. } => {
                        self.set_state(i, State::Starting, "readiness check pending");
                        self.services[i].deadline = Some(now);
                    }
                    _ => self.set_state(i, State::Starting, "waiting for readiness"),
                }
            }
        }
    }

    fn became_ready(&mut self, i: usize) {
        let now = Instant::now();
        let oneshot = self.services[i].spec.readiness == Readiness::Exited;
        self.set_state(i, if oneshot { State::Done } else { State::Running }, "");
        let s = &mut self.services[i];
        s.first_ready.get_or_insert(now);
        s.ready_since = Some(now);
        s.deadline = None;
        self.schedule();
    }

    fn check_overall(&mut self) {
        if self.ready_at.is_none()
            && self.shutdown.is_none()
            && self.plan_error.is_none()
            && (0..self.services.len()).all(|i| self.is_ready(i) || !self.services[i].wanted)
        {
            let now = Instant::now();
            self.ready_at = Some(now);
            self.console.say(&format!("ready in {:.2}s", now.duration_since(self.t0).as_secs_f64()));
        }
        if !self.announced_degraded
            && let Some(f) = self.services.iter().find(|s| s.state == State::Failed)
        {
            self.announced_degraded = true;
            self.console.say(&format!("degraded: service {} failed ({})", f.spec.name, f.detail));
        }
    }

    /// Reaps every exited child; called on SIGCHLD. Orphans re-parented to nasinit are reaped too.
    pub fn reap(&mut self) {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => break,
                Err(Errno::EINTR) => continue,
                Err(_) => break,
                Ok(status) => {
                    let Some(pid) = status.pid() else { continue };
                    let (ok, text) = describe(&status);
                    if let Some(i) = self.services.iter().position(|s| s.pid == Some(pid)) {
                        self.services[i].pid = None;
                        self.services[i].last_exit = text;
                        self.on_main_exit(i, ok);
                    } else if let Some(i) = self.services.iter().position(|s| s.helper == Some(pid)) {
                        self.services[i].helper = None;
                        self.on_helper_exit(i, ok, &text);
                    } else {
                        self.orphans_reaped += 1;
                    }
                }
            }
        }
        self.schedule();
        self.maybe_finish_shutdown();
    }

    fn on_main_exit(&mut self, i: usize, ok: bool) {
        if let Some(cg) = &self.services[i].cgroup {
            // The main process is gone; whatever it left behind goes with it.
            cgroup::kill_all(cg);
        }
        self.services[i].deadline = None;
        if self.services[i].state == State::Stopping {
            // During the stop command the service may exit by itself; the stop command's own
            // exit then finishes the stop.
            if self.services[i].stop_phase != Some(StopPhase::StopCommand) {
                self.finish_stop(i);
            }
            return;
        }
        if self.services[i].spec.readiness == Readiness::Exited && ok {
            self.services[i].failures_in_row = 0;
            self.became_ready(i);
            return;
        }
        self.after_exit(i, ok);
    }

    /// Decides what follows an unplanned exit (or a failed start): restart after backoff, or stop.
    fn after_exit(&mut self, i: usize, ok: bool) {
        let now = Instant::now();
        let s = &mut self.services[i];
        let policy = s.spec.restart.clone();
        let restart = match policy.when {
            Restart::Always => true,
            Restart::OnFailure => !ok,
            Restart::Never => false,
        };
        if self.shutdown.is_some() || !s.wanted {
            return self.set_state(i, State::Stopped, "");
        }
        if !restart {
            let last = s.last_exit.clone();
            return if ok {
                self.set_state(i, State::Stopped, "exited")
            } else {
                self.set_state(i, State::Failed, format!("{last}; restart policy {:?}", policy.when))
            };
        }
        let window = Duration::from_millis(policy.start_limit_window_ms);
        while s.recent_starts.front().is_some_and(|t| now.duration_since(*t) > window) {
            s.recent_starts.pop_front();
        }
        if s.recent_starts.len() >= policy.start_limit as usize {
            let detail = format!(
                "start limit: {} starts within {}s, last {}",
                s.recent_starts.len(),
                window.as_secs(),
                s.last_exit
            );
            self.set_state(i, State::Failed, detail);
            self.check_overall();
            return;
        }
        if s.ready_since.is_some_and(|t| now.duration_since(t) >= STABLE_AFTER) {
            s.failures_in_row = 0;
        }
        s.failures_in_row = s.failures_in_row.saturating_add(1);
        let shift = (s.failures_in_row - 1).min(20);
        let delay = policy.backoff_initial_ms.saturating_mul(1 << shift).min(policy.backoff_max_ms);
        s.deadline = Some(now + Duration::from_millis(delay));
        let last = s.last_exit.clone();
        self.set_state(i, State::Backoff, format!("{last}; restarting in {delay} ms"));
        if delay == 0 {
            self.services[i].deadline = None;
            self.set_state(i, State::Waiting, "");
        }
    }

    fn on_helper_exit(&mut self, i: usize, ok: bool, text: &str) {
        match (self.services[i].state, self.services[i].stop_phase) {
            (State::Stopping, Some(StopPhase::StopCommand)) => {
                if !ok {
                    let line = format!("nasinit: stop command {text}");
                    self.services[i].log.push(&line);
                }
                self.terminate(i);
            }
            (State::Starting, _) if matches!(self.services[i].spec.readiness, Readiness::Check { .. }) => {
                if ok {
                    self.became_ready(i);
                } else if let Readiness::Check { interval_ms, .. } = self.services[i].spec.readiness {
                    self.services[i].deadline = Some(Instant::now() + Duration::from_millis(interval_ms));
                }
            }
            _ => {}
        }
    }

    /// The earliest instant at which something is due, if anything is.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.services.iter().filter_map(|s| s.deadline).min()
    }

    /// Handles every deadline that has passed.
    pub fn on_deadline(&mut self) {
        let now = Instant::now();
        for i in 0..self.services.len() {
            if self.services[i].deadline.is_none_or(|d| d > now) {
                continue;
            }
            self.services[i].deadline = None;
            match (self.services[i].state, self.services[i].stop_phase) {
                (State::Backoff, _) => self.set_state(i, State::Waiting, ""),
                (State::Starting, _) => {
                    if let Readiness::Check { command, .. } = self.services[i].spec.readiness.clone()
                        && self.services[i].helper.is_none()
                    {
                        match process::spawn_helper(&command, &self.services[i].spec.environment) {
                            Ok(pid) => self.services[i].helper = Some(pid),
                            Err(e) => {
                                let line = format!("nasinit: readiness check failed to start: {e}");
                                self.services[i].log.push(&line);
                                self.services[i].deadline = Some(now + Duration::from_secs(1));
                            }
                        }
                    }
                }
                (State::Stopping, Some(StopPhase::StopCommand)) => {
                    if let Some(h) = self.services[i].helper.take() {
                        let _ = kill(h, Signal::SIGKILL);
                    }
                    self.services[i].log.push("nasinit: stop command timed out");
                    self.terminate(i);
                }
                (State::Stopping, Some(StopPhase::Term)) => {
                    let name = self.services[i].spec.name.clone();
                    self.services[i].log.push("nasinit: stop timed out, killing the service's cgroup");
                    self.console.say(&format!("{name}: did not stop in time, killed"));
                    self.kill_service(i);
                    self.services[i].stop_phase = Some(StopPhase::Kill);
                    self.services[i].deadline = Some(now + Duration::from_secs(5));
                }
                (State::Stopping, Some(StopPhase::Kill)) => {
                    // SIGKILL cannot be ignored; a process in uninterruptible sleep (D state) is
                    // what remains. Do not wait on it forever.
                    let name = self.services[i].spec.name.clone();
                    self.console.say(&format!("{name}: still not gone after SIGKILL, giving up on it"));
                    self.services[i].pid = None;
                    self.finish_stop(i);
                }
                _ => {}
            }
        }
        self.schedule();
        self.maybe_finish_shutdown();
    }

    fn kill_service(&mut self, i: usize) {
        match (&self.services[i].cgroup, self.services[i].pid) {
            (Some(cg), _) => cgroup::kill_all(cg),
            (None, Some(pid)) => {
                let _ = kill(Pid::from_raw(-pid.as_raw()), Signal::SIGKILL);
            }
            (None, None) => {}
        }
    }

    /// Begins stopping a service: its stop command first (if any), then SIGTERM, then SIGKILL.
    fn begin_stop(&mut self, i: usize) {
        let s = &self.services[i];
        let running = s.pid.is_some();
        let stop_cmd = s.spec.stop_command.clone();
        match s.state {
            State::Stopping | State::Stopped | State::Failed => return,
            State::Waiting | State::Backoff => {
                self.services[i].deadline = None;
                return self.set_state(i, State::Stopped, "");
            }
            State::Done if stop_cmd.is_none() => return self.set_state(i, State::Stopped, ""),
            _ => {}
        }
        self.set_state(i, State::Stopping, "");
        let timeout = Duration::from_millis(self.services[i].spec.stop_timeout_ms);
        if let Some(cmd) = stop_cmd {
            match process::spawn_helper(&cmd, &self.services[i].spec.environment) {
                Ok(pid) => {
                    self.services[i].helper = Some(pid);
                    self.services[i].stop_phase = Some(StopPhase::StopCommand);
                    self.services[i].deadline = Some(Instant::now() + timeout);
                    return;
                }
                Err(e) => self.services[i].log.push(&format!("nasinit: stop command failed to start: {e}")),
            }
        }
        if running {
            self.terminate(i);
        } else {
            self.finish_stop(i);
        }
    }

    fn terminate(&mut self, i: usize) {
        let Some(pid) = self.services[i].pid else { return self.finish_stop(i) };
        match &self.services[i].cgroup {
            Some(cg) => cgroup::signal_all(cg, Signal::SIGTERM),
            None => {
                let _ = kill(Pid::from_raw(-pid.as_raw()), Signal::SIGTERM);
            }
        }
        self.services[i].stop_phase = Some(StopPhase::Term);
        let timeout = Duration::from_millis(self.services[i].spec.stop_timeout_ms);
        self.services[i].deadline = Some(Instant::now() + timeout);
    }

    fn finish_stop(&mut self, i: usize) {
        self.kill_service(i);
        self.services[i].stop_phase = None;
        self.services[i].deadline = None;
        if self.services[i].restart_requested && self.shutdown.is_none() {
            self.services[i].restart_requested = false;
            self.services[i].failures_in_row = 0;
            self.services[i].recent_starts.clear();
            self.set_state(i, State::Waiting, "");
        } else {
            self.set_state(i, State::Stopped, "");
        }
    }

    pub fn event(&mut self, ev: Event) {
        match ev {
            Event::Output { svc, line } => {
                if let Some(s) = self.services.get_mut(svc) {
                    s.log.push(&line);
                }
            }
            Event::Notify { svc, message } => {
                let Some(s) = self.services.get_mut(svc) else { return };
                for field in message.lines() {
                    if let Some(status) = field.strip_prefix("STATUS=") {
                        s.detail = status.to_string();
                    }
                }
                if message.lines().any(|l| l == "READY=1") && s.state == State::Starting {
                    self.became_ready(svc);
                }
            }
            Event::ReadyFd { svc, generation } => {
                let current =
                    self.services.get(svc).is_some_and(|s| s.generation == generation && s.state == State::Starting);
                if current {
                    self.became_ready(svc);
                }
            }
        }
    }

    pub fn request(&mut self, req: Request) {
        match req {
            Request::Status(tx) => {
                let _ = tx.send(self.status());
            }
            Request::Services(tx) => {
                let _ = tx.send(self.service_infos());
            }
            Request::Start(name, tx) => {
                let r = self.lookup(&name).map(|i| {
                    self.services[i].wanted = true;
                    if matches!(self.services[i].state, State::Stopped | State::Failed) {
                        self.services[i].failures_in_row = 0;
                        self.services[i].recent_starts.clear();
                        self.set_state(i, State::Waiting, "");
                    }
                    self.schedule();
                });
                let _ = tx.send(r);
            }
            Request::Stop(name, tx) => {
                let r = self.lookup(&name).map(|i| {
                    self.services[i].wanted = false;
                    self.begin_stop(i);
                });
                let _ = tx.send(r);
            }
            Request::Restart(name, tx) => {
                let r = self.lookup(&name).map(|i| {
                    self.services[i].wanted = true;
                    match self.services[i].state {
                        State::Starting | State::Running | State::Done => {
                            self.services[i].restart_requested = true;
                            self.begin_stop(i);
                        }
                        State::Stopping => self.services[i].restart_requested = true,
                        _ => {
                            self.services[i].failures_in_row = 0;
                            self.services[i].recent_starts.clear();
                            self.services[i].deadline = None;
                            self.set_state(i, State::Waiting, "");
                        }
                    }
                    self.schedule();
                });
                let _ = tx.send(r);
            }
            Request::Logs(name, cursor, max, tx) => {
                let r = self.lookup(&name).map(|i| self.services[i].log.page(cursor, max.min(10_000)));
                let _ = tx.send(r);
            }
            Request::Timeline(tx) => {
                let t = self
                    .services
                    .iter()
                    .map(|s| TimelineEntry {
                        name: s.spec.name.clone(),
                        started_ms: self.ms(s.first_start),
                        ready_ms: self.ms(s.first_ready),
                    })
                    .collect();
                let _ = tx.send(t);
            }
            Request::Shutdown(kind, tx) => {
                self.begin_shutdown(kind);
                let _ = tx.send(());
            }
        }
    }

    fn lookup(&self, name: &str) -> Result<usize, String> {
        self.by_name.get(name).copied().ok_or_else(|| {
            let names: Vec<&str> = self.services.iter().map(|s| s.spec.name.as_str()).collect();
            format!("no service named `{name}` (services: {})", names.join(", "))
        })
    }

    pub fn status(&self) -> Status {
        let failed = self.services.iter().filter(|s| s.state == State::Failed).count() as u32;
        let state = if self.shutdown.is_some() {
            "stopping"
        } else if self.plan_error.is_some() || failed > 0 {
            "degraded"
        } else if self.ready_at.is_some() {
            "ready"
        } else {
            "starting"
        };
        Status {
            state: state.to_string(),
            hostname: nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default(),
            image: self.plan.image.name.clone(),
            version: self.plan.image.version.clone(),
            pid1: self.pid1,
            uptime_ms: self.t0.elapsed().as_millis() as i64,
            ready_ms: self.ms(self.ready_at),
            kernel_ms: self.kernel_ms,
            services: self.services.len() as u32,
            services_ready: (0..self.services.len()).filter(|&i| self.is_ready(i)).count() as u32,
            services_failed: failed,
            orphans_reaped: self.orphans_reaped,
        }
    }

    fn service_infos(&self) -> Vec<ServiceInfo> {
        self.services
            .iter()
            .map(|s| ServiceInfo {
                name: s.spec.name.clone(),
                state: s.state.name().to_string(),
                pid: s.pid.map_or(0, |p| p.as_raw() as u32),
                restarts: s.restarts,
                since_ms: self.ms(Some(s.since)),
                started_ms: self.ms(s.first_start),
                ready_ms: self.ms(s.first_ready),
                last_exit: s.last_exit.clone(),
                detail: s.detail.clone(),
            })
            .collect()
    }

    /// Stops services in reverse dependency order: a service stops once everything that depends
    /// on it has stopped.
    pub fn begin_shutdown(&mut self, kind: ShutdownKind) {
        if self.shutdown.is_none() {
            self.console.say(&format!("{kind:?} requested: stopping services").to_lowercase());
        }
        self.shutdown = Some(kind);
        self.advance_shutdown();
    }

    fn advance_shutdown(&mut self) {
        if self.shutdown.is_none() {
            return;
        }
        // Stopping one service may complete at once (it was not running) and free its
        // dependencies in turn: repeat until nothing more can begin.
        loop {
            let before: Vec<State> = self.services.iter().map(|s| s.state).collect();
            for i in (0..self.services.len()).rev() {
                let dependents_down = (0..self.services.len())
                    .filter(|&j| self.services[j].deps.contains(&i))
                    .all(|j| matches!(self.services[j].state, State::Stopped | State::Failed));
                if dependents_down {
                    self.begin_stop(i);
                }
            }
            if self.services.iter().map(|s| s.state).eq(before) {
                break;
            }
        }
    }

    fn maybe_finish_shutdown(&mut self) {
        self.advance_shutdown();
    }

    /// The shutdown kind once every service has stopped; `None` while some still run.
    pub fn shutdown_complete(&self) -> Option<ShutdownKind> {
        let kind = self.shutdown?;
        let done = self.services.iter().all(|s| matches!(s.state, State::Stopped | State::Failed) && s.pid.is_none());
        done.then_some(kind)
    }

    pub fn cgroups(&self) -> Option<&CgroupRoot> {
        self.cgroups.as_ref()
    }

    fn bind_notify(&self, i: usize) -> std::io::Result<PathBuf> {
        let dir = self.run_dir.join("notify");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(&self.services[i].spec.name);
        let _ = std::fs::remove_file(&path);
        let sock = tokio::net::UnixDatagram::bind(&path)?;
        let tx = self.events.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            while let Ok(n) = sock.recv(&mut buf).await {
                let message = String::from_utf8_lossy(&buf[..n]).into_owned();
                if tx.send(Event::Notify { svc: i, message }).await.is_err() {
                    break;
                }
            }
        });
        Ok(path)
    }

    fn read_output(&self, i: usize, fd: OwnedFd) {
        let tx = self.events.clone();
        tokio::spawn(async move {
            let Ok(mut pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else { return };
            let mut split = LineSplitter::default();
            let mut buf = vec![0u8; 8192];
            let mut lines = Vec::new();
            loop {
                match pipe.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => split.feed(&buf[..n], |l| lines.push(l.to_string())),
                }
                for line in lines.drain(..) {
                    if tx.send(Event::Output { svc: i, line }).await.is_err() {
                        return;
                    }
                }
            }
            split.finish(|l| lines.push(l.to_string()));
            for line in lines {
                let _ = tx.send(Event::Output { svc: i, line }).await;
            }
        });
    }

    fn read_ready_fd(&self, i: usize, generation: u64, fd: OwnedFd) {
        let tx = self.events.clone();
        tokio::spawn(async move {
            let Ok(mut pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else { return };
            let mut buf = [0u8; 64];
            loop {
                match pipe.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) if buf[..n].contains(&b'\n') => {
                        let _ = tx.send(Event::ReadyFd { svc: i, generation }).await;
                        return;
                    }
                    Ok(_) => {}
                }
            }
        });
    }
}

fn describe(status: &WaitStatus) -> (bool, String) {
    match status {
        WaitStatus::Exited(_, 0) => (true, "exit 0".to_string()),
        WaitStatus::Exited(_, code) => (false, format!("exit {code}")),
        WaitStatus::Signaled(_, sig, core) => {
            (false, format!("signal {}{}", *sig as i32, if *core { " (core dumped)" } else { "" }))
        }
        other => (false, format!("{other:?}")),
    }
}
