//! The supervisor's effects: it owns the processes, cgroups, notify sockets and logs of the
//! services, and performs what the decision core (`machine.rs`) asks for. Every input — a child
//! exit, output, a readiness message, a control request, a signal, a deadline — goes to the core,
//! and the actions it returns are carried out here until none are left. Nothing here polls, and
//! nothing waits on a service: every wait is a deadline the core set.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Instant;

use nasos_board::plan::{Plan, Readiness};
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot};

pub use nasos_api::ShutdownKind;
use nasos_api::{LogPage, ServiceInfo, Status, TimelineEntry};

use crate::cgroup::{self, CgroupRoot};
use crate::console::Console;
use crate::logs::{CappedFile, LineSplitter, Ring};
use crate::machine::{Action, Core, Helper};
use crate::process;
use crate::view;

/// Bytes of recent output kept in memory per service.
const RING_BYTES: usize = 64 * 1024;
/// Size at which a service's log file is rotated.
const LOG_FILE_CAP: u64 = 1 << 20;

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
    /// Development images only: stop the event loop, as a hung PID 1 would.
    Freeze(oneshot::Sender<Result<(), String>>),
    /// Development images only: reboot, and hang the shutdown after the services stopped,
    /// before the filesystems are synced (as a wedged device would).
    HangShutdown(oneshot::Sender<Result<(), String>>),
}

/// What the per-service I/O tasks report.
pub enum Event {
    Output { svc: usize, line: String },
    Notify { svc: usize, message: String },
    ReadyFd { svc: usize, generation: u64 },
}

/// The operating-system side of one service.
struct Handles {
    pid: Option<Pid>,
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
    pub facts: view::BootFacts,
}

pub struct Supervisor {
    core: Core,
    handles: Vec<Handles>,
    plan: Plan,
    run_dir: PathBuf,
    cgroups: Option<CgroupRoot>,
    pid1: bool,
    facts: view::BootFacts,
    orphans_reaped: u64,
    console: Console,
    events: mpsc::Sender<Event>,
    frozen: bool,
    hang_shutdown: bool,
    end: Option<nasos_layout::state::BootEnd>,
    /// The watchdog is no longer fed: health's fatal condition outlasted its grace.
    starving: bool,
    /// When this boot became ready, seconds since the epoch (0 before).
    ready_since_unix: u64,
}

impl Supervisor {
    pub fn new(config: Config, t0: Instant, console: Console, events: mpsc::Sender<Event>) -> Self {
        let Config { plan, run_dir, log_dir, cgroups, pid1, facts } = config;
        let mut core = Core::new(plan.services.clone(), t0);
        let deadline = plan.liveness.ready_deadline_seconds;
        if deadline > 0 {
            core.ready_deadline = Some(t0 + std::time::Duration::from_secs(u64::from(deadline)));
        }
        let handles = core
            .services
            .iter()
            .map(|s| {
                let file = log_dir
                    .as_ref()
                    .and_then(|d| CappedFile::open(d.join(format!("{}.log", s.spec.name)), LOG_FILE_CAP).ok());
                Handles {
                    pid: None,
                    helper: None,
                    cgroup: None,
                    cgroup_procs: None,
                    notify_path: None,
                    log: Ring::new(RING_BYTES, file),
                }
            })
            .collect();
        let mut sup = Supervisor {
            core,
            handles,
            plan,
            run_dir,
            cgroups,
            pid1,
            facts,
            orphans_reaped: 0,
            console,
            events,
            frozen: false,
            hang_shutdown: false,
            end: None,
            starving: false,
            ready_since_unix: 0,
        };
        sup.perform();
        sup
    }

    /// Carries out what the core asked for, and what it asks for in turn, until nothing is left.
    fn perform(&mut self) {
        loop {
            let actions = self.core.take_actions();
            if actions.is_empty() {
                return;
            }
            for a in actions {
                self.act(a);
            }
        }
    }

    fn act(&mut self, action: Action) {
        let now = Instant::now();
        match action {
            Action::Start(i) if self.core.shutdown.is_some() => self.core.start_cancelled(i, now),
            Action::Start(i) => match self.spawn(i) {
                Ok(()) => self.core.started(i, now),
                Err(e) => self.core.start_failed(i, &e.to_string(), now),
            },
            Action::StartHelper(i, kind) => {
                let spec = &self.core.services[i].spec;
                let command = match (kind, &spec.stop_command, &spec.readiness) {
                    (Helper::Stop, Some(c), _) => c.clone(),
                    (Helper::Check, _, Readiness::Check { command, .. }) => command.clone(),
                    _ => return self.core.helper_failed(i, kind, "no command for it in the plan", now),
                };
                match process::spawn_helper(&command, &spec.environment) {
                    Ok(pid) => self.handles[i].helper = Some(pid),
                    Err(e) => self.core.helper_failed(i, kind, &e.to_string(), now),
                }
            }
            Action::KillHelper(i) => {
                if let Some(h) = self.handles[i].helper {
                    let _ = kill(h, Signal::SIGKILL);
                }
            }
            Action::Terminate(i) => self.signal_service(i, Signal::SIGTERM),
            Action::Kill(i) => self.signal_service(i, Signal::SIGKILL),
            Action::Abandon(i) => self.handles[i].pid = None,
            Action::Say(line) => self.console.say(&line),
            Action::Log(i, line) => self.handles[i].log.push(&line),
            Action::BecameReady => {
                self.ready_since_unix = unix_now();
                if let Some(st) = self.state() {
                    let _ = std::fs::remove_file(st.path(nasos_layout::state::FAILED_BOOTS));
                }
            }
            Action::MissedReadyDeadline => self.missed_deadline(now),
            Action::EndBootNice => {
                let mut reniced = Vec::new();
                for (i, s) in self.core.services.iter().enumerate() {
                    if s.spec.boot_nice == 0 {
                        continue;
                    }
                    if let Some(cg) = &self.handles[i].cgroup {
                        cgroup::renice_all(cg, 0);
                    } else if let Some(pid) = self.handles[i].pid {
                        // No cgroup: the main process at least (its later children inherit).
                        // SAFETY: plain integers in, no memory touched.
                        unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, pid.as_raw() as nix::libc::id_t, 0) };
                    }
                    reniced.push(s.spec.name.as_str());
                }
                let at = now.duration_since(self.core.t0).as_secs_f64();
                self.console.say(&format!("boot over at {at:.2}s: {} now run at full priority", reniced.join(", ")));
                if self.pid1 {
                    mark_boot_over(&self.console);
                }
            }
        }
    }

    /// Everything the service runs gets `sig`: through its cgroup, else its session.
    fn signal_service(&self, i: usize, sig: Signal) {
        let h = &self.handles[i];
        match (&h.cgroup, h.pid) {
            (Some(cg), _) if sig == Signal::SIGKILL => cgroup::kill_all(cg),
            (Some(cg), _) => cgroup::signal_all(cg, sig),
            (None, Some(pid)) => {
                let _ = kill(Pid::from_raw(-pid.as_raw()), sig);
            }
            (None, None) => {}
        }
    }

    fn spawn(&mut self, i: usize) -> std::io::Result<()> {
        let name = self.core.services[i].spec.name.clone();
        if self.handles[i].cgroup.is_none()
            && let Some(root) = &self.cgroups
        {
            match root.prepare(&name) {
                Ok((dir, procs)) => {
                    self.handles[i].cgroup = Some(dir);
                    self.handles[i].cgroup_procs = Some(procs);
                }
                Err(e) => {
                    self.console.say(&format!("{name}: no cgroup ({e}); its processes are tracked by session only"))
                }
            }
        }
        if let Some(cg) = &self.handles[i].cgroup {
            // Nothing of a previous run may linger into the next.
            cgroup::kill_all(cg);
        }
        let spec = &self.core.services[i].spec;
        if spec.readiness == Readiness::Notify && self.handles[i].notify_path.is_none() {
            match self.bind_notify(i) {
                Ok(path) => self.handles[i].notify_path = Some(path),
                Err(e) => self.console.say(&format!("{name}: cannot create its notify socket: {e}")),
            }
        }
        let ready_fd = match spec.readiness {
            Readiness::Fd { fd } => Some(fd),
            _ => None,
        };
        let h = &self.handles[i];
        let spawned = process::spawn(&process::Spec {
            command: &spec.command,
            environment: &spec.environment,
            user: spec.user.as_deref(),
            working_directory: spec.working_directory.as_deref(),
            cgroup_procs: h.cgroup_procs.as_ref(),
            notify_socket: h.notify_path.as_deref(),
            ready_fd,
            nice: self.core.boot_niced(i),
        })?;
        self.handles[i].pid = Some(spawned.pid);
        self.read_output(i, spawned.output);
        if let Some(r) = spawned.ready {
            self.read_ready_fd(i, self.core.services[i].generation, r);
        }
        Ok(())
    }

    /// Starts what can start (the first input of a boot).
    pub fn schedule(&mut self) {
        self.core.schedule(Instant::now());
        self.perform();
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
                    let now = Instant::now();
                    if let Some(i) = self.handles.iter().position(|h| h.pid == Some(pid)) {
                        self.handles[i].pid = None;
                        self.core.main_exited(i, ok, &text, now);
                    } else if let Some(i) = self.handles.iter().position(|h| h.helper == Some(pid)) {
                        self.handles[i].helper = None;
                        self.core.helper_exited(i, ok, &text, now);
                    } else {
                        self.orphans_reaped += 1;
                    }
                    self.perform();
                }
            }
        }
    }

    /// The earliest instant at which something is due, if anything is.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.core.next_deadline()
    }

    /// Handles every deadline that has passed.
    pub fn on_deadline(&mut self) {
        self.core.deadline(Instant::now());
        self.perform();
    }

    pub fn event(&mut self, ev: Event) {
        let now = Instant::now();
        match ev {
            Event::Output { svc, line } => {
                if let Some(h) = self.handles.get_mut(svc) {
                    h.log.push(&line);
                }
            }
            Event::Notify { svc, message } => self.core.notify(svc, &message, now),
            Event::ReadyFd { svc, generation } => self.core.ready_fd(svc, generation, now),
        }
        self.perform();
    }

    pub fn request(&mut self, req: Request) {
        let now = Instant::now();
        match req {
            Request::Status(tx) => {
                let _ = tx.send(self.status());
            }
            Request::Services(tx) => {
                let pids: Vec<Option<Pid>> = self.handles.iter().map(|h| h.pid).collect();
                let _ = tx.send(view::services(&self.core, &pids));
            }
            Request::Start(name, tx) => {
                let _ = tx.send(self.core.request_start(&name, now));
            }
            Request::Stop(name, tx) => {
                let _ = tx.send(self.core.request_stop(&name, now));
            }
            Request::Restart(name, tx) => {
                let _ = tx.send(self.core.request_restart(&name, now));
            }
            Request::Logs(name, cursor, max, tx) => {
                let r = self.core.lookup(&name).map(|i| self.handles[i].log.page(cursor, max.min(10_000)));
                let _ = tx.send(r);
            }
            Request::Timeline(tx) => {
                let _ = tx.send(view::timeline(&self.core));
            }
            Request::Shutdown(kind, tx) => {
                self.core.begin_shutdown(kind, now);
                let _ = tx.send(());
            }
            Request::Freeze(tx) => {
                let r = if self.plan.image.development {
                    self.frozen = true;
                    Ok(())
                } else {
                    Err("refused: debug freeze is a fault injection for development images only".to_string())
                };
                let _ = tx.send(r);
            }
            Request::HangShutdown(tx) => {
                let r = if self.plan.image.development {
                    self.hang_shutdown = true;
                    self.core.begin_shutdown(ShutdownKind::Reboot, now);
                    Ok(())
                } else {
                    Err("refused: debug hang-shutdown is a fault injection for development images only".to_string())
                };
                let _ = tx.send(r);
            }
        }
        self.perform();
    }

    pub fn status(&self) -> Status {
        let hostname = nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
        view::status(
            &self.core,
            &view::Box { hostname, plan: &self.plan, pid1: self.pid1, facts: &self.facts },
            self.orphans_reaped,
        )
    }

    /// Stops services in reverse dependency order.
    pub fn begin_shutdown(&mut self, kind: ShutdownKind) {
        self.core.begin_shutdown(kind, Instant::now());
        self.perform();
    }

    fn state(&self) -> Option<nasos_layout::state::State> {
        self.facts.state_root.as_ref().map(nasos_layout::state::State::at)
    }

    /// The appliance was not ready by its deadline: say what it waits for, count the failed boot,
    /// and reboot, unless that many boots in a row already missed it; then stay up and say why.
    fn missed_deadline(&mut self, now: Instant) {
        let secs = self.plan.liveness.ready_deadline_seconds;
        let waiting: Vec<String> = self
            .core
            .services
            .iter()
            .filter(|s| !s.state.is_ready() && s.wanted)
            .map(|s| {
                if s.detail.is_empty() {
                    format!("{} ({})", s.spec.name, s.state.name())
                } else {
                    format!("{} ({}: {})", s.spec.name, s.state.name(), s.detail)
                }
            })
            .collect();
        self.console.say(&format!("missed the boot deadline ({secs}s); not ready: {}", waiting.join(", ")));
        let guard = self.plan.liveness.failed_boots_before_staying_up.max(1);
        let counter = self.state().map(|st| {
            let path = st.path(nasos_layout::state::FAILED_BOOTS);
            let n = std::fs::read_to_string(&path).ok().and_then(|s| s.trim().parse::<u32>().ok()).unwrap_or(0) + 1;
            let _ = crate::state::write_atomic(&path, format!("{n}\n").as_bytes());
            n
        });
        let trial = on_trial();
        match counter {
            Some(n) if stays_up(n, guard, trial.is_some()) => {
                let why = format!(
                    "{n} boots in a row missed their {secs}s deadline; staying up instead of rebooting again. Not ready: {}. See nasctl services and nasctl logs; nasctl reboot tries again",
                    waiting.join(", ")
                );
                self.console.say(&why);
                self.facts.why_not_ready = why;
            }
            n => {
                let count = match (&trial, n) {
                    (Some(entry), _) => format!(" ({entry} is on trial: its boot tries, not the guard, end this)"),
                    (None, Some(n)) => format!(" ({n} of {guard} in a row)"),
                    (None, None) => String::new(),
                };
                self.console.say(&format!("rebooting{count}: a boot that misses its deadline counts as failed"));
                self.end = Some(nasos_layout::state::BootEnd::Deadline);
                self.core.begin_shutdown(ShutdownKind::Reboot, now);
            }
        }
    }

    /// How this boot ends when it is not what the shutdown kind says (a missed deadline).
    pub fn end(&self) -> Option<nasos_layout::state::BootEnd> {
        self.end
    }

    /// The watchdog says it reset the machine: what that says of the previous boot (see
    /// [`crate::state::after_watchdog_reset`]) is recorded and said.
    pub fn watchdog_reset_before_this_boot(&mut self) {
        use nasos_layout::state::State;
        let (said, record) = match &self.facts.previous {
            Some((root, prev)) => {
                let st = State::at(root);
                let why = std::fs::read_to_string(st.fatal_file(*prev)).unwrap_or_default();
                let (said, record) = crate::state::after_watchdog_reset(st.boot_end(*prev), &why);
                (said, record.map(|end| (st, *prev, end)))
            }
            None => (crate::state::after_watchdog_reset(None, "").0, None),
        };
        if let Some((st, prev, end)) = record {
            crate::state::record_end(&st, prev, end);
        }
        self.console.say(&format!("the last boot ended: {said}"));
        self.facts.last_boot = said;
    }

    /// Reads health's verdict (each watchdog tick) and decides whether to keep feeding the
    /// watchdog. Only a ready appliance is judged (before that, the boot deadline rules), never
    /// during a shutdown (its own deadline rules). Returns true when the watchdog is to starve.
    pub fn health_starves_watchdog(&mut self, now_unix: u64) -> bool {
        use nasos_layout::state::{BootEnd, FATAL_RESETS};
        if self.core.ready_at.is_none() || self.core.shutdown.is_some() || self.starving {
            return self.starving;
        }
        let grace = u64::from(self.plan.health.fatal_grace_seconds);
        let verdict = nasos_api::HealthVerdict::read(std::path::Path::new(nasos_layout::paths::HEALTH_VERDICT));
        let st = self.state();
        let resets = st
            .as_ref()
            .and_then(|st| std::fs::read_to_string(st.path(FATAL_RESETS)).ok())
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(0);
        match fatal_decision(
            &verdict,
            now_unix,
            grace,
            resets,
            self.plan.liveness.failed_boots_before_staying_up.max(1),
            self.ready_since_unix,
        ) {
            FatalDecision::Feed => false,
            FatalDecision::Healthy => {
                if resets > 0
                    && let Some(st) = &st
                {
                    let _ = std::fs::remove_file(st.path(FATAL_RESETS));
                }
                false
            }
            FatalDecision::StayUp(why) => {
                if self.facts.why_not_ready != why {
                    self.console.say(&why);
                    self.facts.why_not_ready = why;
                }
                false
            }
            FatalDecision::Starve(f) => {
                let held = now_unix.saturating_sub(f.since);
                let why = format!("{} (for {held}s, grace {grace}s)", f.message);
                self.console.say(&format!(
                    "health: {why}: only a reset can fix this; no longer feeding the watchdog ({} of {} resets in a row before staying up)",
                    resets + 1,
                    self.plan.liveness.failed_boots_before_staying_up.max(1)
                ));
                if let Some(st) = &st {
                    let _ = crate::state::write_atomic(&st.path(FATAL_RESETS), format!("{}\n", resets + 1).as_bytes());
                    let _ = crate::state::write_atomic(&st.fatal_file(self.facts.boot), format!("{why}\n").as_bytes());
                    crate::state::record_end(st, self.facts.boot, BootEnd::Fatal);
                    nix::unistd::sync();
                }
                self.starving = true;
                true
            }
        }
    }

    /// Whether a debug freeze was asked for (the loop then stops).
    /// Whether the shutdown is to hang (a development-only fault injection).
    pub fn hang_shutdown(&self) -> bool {
        self.hang_shutdown
    }

    pub fn frozen(&self) -> bool {
        self.frozen
    }

    /// The shutdown kind once every service has stopped; `None` while some still run.
    pub fn shutdown_complete(&self) -> Option<ShutdownKind> {
        self.core.shutdown_complete()
    }

    pub fn cgroups(&self) -> Option<&CgroupRoot> {
        self.cgroups.as_ref()
    }

    fn bind_notify(&self, i: usize) -> std::io::Result<PathBuf> {
        let dir = self.run_dir.join("notify");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(&self.core.services[i].spec.name);
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

/// Tells the services the boot is over ([`nasos_layout::paths::BOOT_OVER`]): one small file on a
/// tmpfs, and a failure is said, not fatal (what waits for it gives up after a while).
fn mark_boot_over(console: &Console) {
    let path = std::path::Path::new(nasos_layout::paths::BOOT_OVER);
    let made = path.parent().map_or(Ok(()), std::fs::create_dir_all).and_then(|()| std::fs::write(path, b""));
    if let Err(e) = made {
        console.say(&format!("cannot create {}: {e}", path.display()));
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

/// Seconds since the epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// What to do about health's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FatalDecision {
    /// Keep feeding; something may be fatal but not for long enough.
    Feed,
    /// Nothing fatal, and the box has been ready for a grace period: the guard's count clears.
    Healthy,
    /// Starve the watchdog for this condition.
    Starve(nasos_api::Fatal),
    /// The guard: this many resets in a row did not clear it; stay up and say why.
    StayUp(String),
}

/// The decision, apart from I/O: `resets` in a row so far, `guard` the reboot-loop guard's
/// count, `ready_since` when this boot became ready (seconds since the epoch).
pub fn fatal_decision(
    verdict: &nasos_api::HealthVerdict,
    now: u64,
    grace: u64,
    resets: u32,
    guard: u32,
    ready_since: u64,
) -> FatalDecision {
    match verdict.outlasting(now, grace) {
        Some(f) if resets >= guard => FatalDecision::StayUp(format!(
            "{resets} watchdog resets in a row did not clear a fatal condition: {}; staying up. See nasctl health; nasctl reboot tries again",
            f.message
        )),
        Some(f) => FatalDecision::Starve(f.clone()),
        None if verdict.fatal.is_empty() && now.saturating_sub(ready_since) >= grace => FatalDecision::Healthy,
        None => FatalDecision::Feed,
    }
}

/// Whether a boot that missed its deadline stays up instead of rebooting. A version on trial
/// always reboots: systemd-boot counts its tries and boots the previous version once they are
/// used up, so staying up would keep the box on the bad version. A blessed version stays up after
/// `guard` misses in a row (there is nothing to fall back to; rebooting forever helps nobody).
pub fn stays_up(misses_in_a_row: u32, guard: u32, on_trial: bool) -> bool {
    !on_trial && misses_in_a_row >= guard
}

/// The boot entry systemd-boot started, if it is on trial (read from its EFI variables; efivarfs
/// is mounted here when nothing has yet).
fn on_trial() -> Option<String> {
    let dir = std::path::Path::new(nasos_layout::entry::EFIVARS);
    if std::fs::read_dir(dir).map(|mut d| d.next().is_none()).unwrap_or(true) {
        let _ = nasos_exec::Tool::new("modprobe").arg("efivarfs").timeout(std::time::Duration::from_secs(20)).run();
        let _ = nix::mount::mount(Some("efivarfs"), dir, Some("efivarfs"), nix::mount::MsFlags::empty(), None::<&str>);
    }
    nasos_layout::entry::booted_on_trial(dir, &std::fs::read_to_string("/proc/cmdline").unwrap_or_default())
        .filter(|e| nasos_layout::entry::parse(e).is_some_and(|p| p.counter.is_some()))
}

#[cfg(test)]
mod fatal_tests {
    use super::{FatalDecision, fatal_decision};
    use nasos_api::{Fatal, HealthVerdict};

    #[test]
    fn only_a_fatal_condition_past_its_grace_starves_the_watchdog_and_the_guard_stops_a_loop() {
        let nfs = Fatal { id: "nfs.listeners".into(), message: "NFS is not listening".into(), since: 1000 };
        let v = HealthVerdict { at: 1000, fatal: vec![nfs.clone()] };
        assert_eq!(fatal_decision(&v, 1019, 20, 0, 3, 900), FatalDecision::Feed, "within its grace");
        assert_eq!(fatal_decision(&v, 1020, 20, 0, 3, 900), FatalDecision::Starve(nfs.clone()));
        assert_eq!(fatal_decision(&v, 1020, 20, 2, 3, 900), FatalDecision::Starve(nfs));
        assert!(
            matches!(fatal_decision(&v, 1020, 20, 3, 3, 900), FatalDecision::StayUp(w) if w.contains("3 watchdog resets in a row"))
        );
        let none = HealthVerdict::default();
        assert_eq!(fatal_decision(&none, 1000, 20, 2, 3, 990), FatalDecision::Feed, "ready only 10 s");
        assert_eq!(fatal_decision(&none, 1010, 20, 2, 3, 990), FatalDecision::Healthy);
    }
}

#[cfg(test)]
mod guard_tests {
    use super::stays_up;

    #[test]
    fn a_version_on_trial_always_reboots_and_a_blessed_one_stays_up_after_the_guard() {
        assert!(!stays_up(1, 3, false));
        assert!(!stays_up(2, 3, false));
        assert!(stays_up(3, 3, false));
        assert!(stays_up(7, 3, false));
        for n in [1, 3, 7] {
            assert!(!stays_up(n, 3, true), "{n} misses on trial");
        }
    }
}
