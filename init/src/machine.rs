//! The supervisor's decisions, with no I/O. Inputs (a process started or exited, a readiness
//! message, a deadline passed, an operator's request) change the state of the services and
//! queue [`Action`]s; the effects layer (`supervisor.rs`) performs them and reports back. Time is
//! an argument, so tests drive this with a virtual clock and random event sequences.
//!
//! Invariants (checked by the property tests in `tests/machine.rs`):
//! - a service starts only when everything in its `after` list is ready;
//! - in a shutdown, a service begins to stop only after every service that depends on it has
//!   stopped (reverse dependency order);
//! - every stopping service has a deadline, so a stop never waits forever;
//! - after any input, no wanted service is left waiting whose dependencies are all ready, so a
//!   service in a crash loop never keeps the others from starting.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use nasos_api::ShutdownKind;
use nasos_board::plan::{Readiness, Restart, Service};

use crate::graph;

/// A service that stayed up this long starts its backoff afresh when it next fails.
pub const STABLE_AFTER: Duration = Duration::from_secs(10);
/// After SIGKILL, how long to wait for the kernel before giving up on a process (one stuck in
/// uninterruptible sleep cannot be waited for forever).
pub const KILL_GRACE: Duration = Duration::from_secs(5);
/// Services with a boot niceness run at it at most this long after nasinit starts, even if the
/// services on the way to serving never all become ready (one that fails must not leave zed
/// or the console starved for the rest of the boot).
pub const BOOT_NICE_LIMIT: Duration = Duration::from_secs(60);
/// How soon a readiness check that could not be started is tried again.
pub const CHECK_RETRY: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Not started: waiting for dependencies (or not wanted).
    Waiting,
    /// Started (or being started), not ready yet.
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
    pub fn name(self) -> &'static str {
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

    pub fn is_ready(self) -> bool {
        matches!(self, State::Running | State::Done)
    }

    fn is_down(self) -> bool {
        matches!(self, State::Stopped | State::Failed)
    }
}

/// Phases of stopping one service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopPhase {
    /// The service's stop command runs.
    StopCommand,
    /// SIGTERM sent; waiting for the main process.
    Term,
    /// SIGKILL sent; waiting for the kernel to deliver it.
    Kill,
}

/// The short-lived helper processes a service may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Helper {
    /// Its stop command.
    Stop,
    /// Its readiness check.
    Check,
}

/// What the effects layer is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Start the service's main process; report [`Core::started`] or [`Core::start_failed`].
    Start(usize),
    /// Run a helper; report [`Core::helper_exited`] or [`Core::helper_failed`].
    StartHelper(usize, Helper),
    /// SIGKILL the running helper.
    KillHelper(usize),
    /// SIGTERM to everything the service runs.
    Terminate(usize),
    /// SIGKILL to everything the service runs (also: what a main process left behind).
    Kill(usize),
    /// The main process cannot be waited for any longer; forget it.
    Abandon(usize),
    /// A line on the console.
    Say(String),
    /// A line in the service's log.
    Log(usize, String),
    /// Every service is ready (the first time this boot).
    BecameReady,
    /// The appliance was not ready by its boot deadline (once per boot).
    MissedReadyDeadline,
    /// The boot is over for the services with a boot niceness: from now on they run at 0
    /// (once per boot; see [`Core::boot_niced`]).
    EndBootNice,
}

#[derive(Debug, Clone)]
pub struct Svc {
    pub spec: Service,
    pub deps: Vec<usize>,
    pub state: State,
    pub wanted: bool,
    restart_requested: bool,
    /// The next start is an operator's (`nasctl start`/`restart`): not counted in `restarts`,
    /// which health reads as a sign of trouble.
    asked: bool,
    /// Its main process runs.
    pub running: bool,
    pub helper: Option<Helper>,
    /// Counts start attempts; readiness from an earlier run is ignored.
    pub generation: u64,
    pub restarts: u32,
    failures_in_row: u32,
    recent_starts: VecDeque<Instant>,
    pub since: Instant,
    pub first_start: Option<Instant>,
    pub first_ready: Option<Instant>,
    ready_since: Option<Instant>,
    pub last_exit: String,
    pub detail: String,
    pub deadline: Option<Instant>,
    pub stop_phase: Option<StopPhase>,
    /// When it must be ready by, while it starts.
    pub start_deadline: Option<Instant>,
    /// Why it is being stopped as a failure (it did not become ready in time).
    failing: Option<String>,
}

pub struct Core {
    pub services: Vec<Svc>,
    by_name: HashMap<String, usize>,
    pub t0: Instant,
    pub ready_at: Option<Instant>,
    /// When every service without a boot niceness was first ready (or [`BOOT_NICE_LIMIT`]
    /// passed): from then on nothing starts niced.
    pub boot_over_at: Option<Instant>,
    announced_degraded: bool,
    pub shutdown: Option<ShutdownKind>,
    pub plan_error: Option<String>,
    /// When the appliance must be ready by; `None`: no deadline.
    pub ready_deadline: Option<Instant>,
    deadline_missed: bool,
    out: Vec<Action>,
}

impl Core {
    /// A core for these services; an unusable graph (a cycle, a missing dependency) starts
    /// nothing and says why.
    pub fn new(specs: Vec<Service>, t0: Instant) -> Core {
        let plan_error = graph::check(&specs).err();
        let specs = if plan_error.is_some() { Vec::new() } else { specs };
        let by_name: HashMap<String, usize> = specs.iter().enumerate().map(|(i, s)| (s.name.clone(), i)).collect();
        let services = specs
            .into_iter()
            .map(|spec| Svc {
                deps: spec.after.iter().filter_map(|a| by_name.get(a).copied()).collect(),
                state: State::Waiting,
                wanted: true,
                restart_requested: false,
                asked: false,
                running: false,
                helper: None,
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
                start_deadline: None,
                failing: None,
                spec,
            })
            .collect();
        let mut out = Vec::new();
        if let Some(e) = &plan_error {
            out.push(Action::Say(format!("the plan's service graph is unusable, starting nothing: {e}")));
        }
        Core {
            services,
            by_name,
            t0,
            ready_at: None,
            boot_over_at: None,
            announced_degraded: false,
            shutdown: None,
            plan_error,
            ready_deadline: None,
            deadline_missed: false,
            out,
        }
    }

    /// The actions queued by the inputs so far, oldest first.
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.out)
    }

    pub fn lookup(&self, name: &str) -> Result<usize, String> {
        self.by_name.get(name).copied().ok_or_else(|| {
            let names: Vec<&str> = self.services.iter().map(|s| s.spec.name.as_str()).collect();
            format!("no service named `{name}` (services: {})", names.join(", "))
        })
    }

    /// The niceness `i` starts at: its boot niceness while the boot is not over, else 0.
    pub fn boot_niced(&self, i: usize) -> i8 {
        if self.boot_over_at.is_none() { self.services[i].spec.boot_nice } else { 0 }
    }

    pub fn is_ready(&self, i: usize) -> bool {
        self.services[i].state.is_ready()
    }

    /// The earliest instant at which something is due, if anything is.
    pub fn next_deadline(&self) -> Option<Instant> {
        // Not during a shutdown: `deadline` ignores it then, and past due it would stay due (the
        // loop would spin until the shutdown ends).
        let ready =
            self.ready_deadline.filter(|_| self.ready_at.is_none() && !self.deadline_missed && self.shutdown.is_none());
        // Only while `check_overall` can still end it: past due otherwise, it would be due forever.
        let boot_nice = (self.boot_over_at.is_none() && self.shutdown.is_none() && self.plan_error.is_none())
            .then(|| self.t0 + BOOT_NICE_LIMIT);
        let ready = ready.into_iter().chain(boot_nice).min();
        // Start timeouts do not act during a shutdown (see `deadline`), so they are not due then.
        let starting = |s: &Svc| s.start_deadline.filter(|_| self.shutdown.is_none());
        self.services.iter().flat_map(|s| [s.deadline, starting(s)]).flatten().chain(ready).min()
    }

    /// The shutdown kind once every service has stopped; `None` while some still run.
    pub fn shutdown_complete(&self) -> Option<ShutdownKind> {
        let kind = self.shutdown?;
        self.services.iter().all(|s| s.state.is_down() && !s.running && s.helper.is_none()).then_some(kind)
    }

    fn set_state(&mut self, i: usize, state: State, detail: impl Into<String>, now: Instant) {
        let s = &mut self.services[i];
        s.state = state;
        s.since = now;
        s.detail = detail.into();
        if !state.is_ready() {
            s.ready_since = None;
        }
        if state != State::Starting {
            s.start_deadline = None;
        }
    }

    /// Starts what can start and moves a shutdown on; every input ends here.
    fn settle(&mut self, now: Instant) {
        self.schedule(now);
        self.advance_shutdown(now);
    }

    /// Starts every service that is wanted, waiting, and whose dependencies are ready.
    pub fn schedule(&mut self, now: Instant) {
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
                self.start(i, now);
            } else {
                self.services[i].detail = format!("waiting for {}", blocked.join(", "));
            }
        }
        self.check_overall(now);
    }

    fn start(&mut self, i: usize, now: Instant) {
        let s = &mut self.services[i];
        if s.first_start.is_some() && !s.asked {
            s.restarts += 1;
        }
        s.asked = false;
        s.first_start.get_or_insert(now);
        s.recent_starts.push_back(now);
        s.generation += 1;
        s.deadline = None;
        self.set_state(i, State::Starting, "starting", now);
        self.out.push(Action::Start(i));
    }

    /// The main process of `i` runs.
    pub fn started(&mut self, i: usize, now: Instant) {
        self.services[i].running = true;
        match self.services[i].spec.readiness {
            Readiness::Started => self.became_ready(i, now),
            Readiness::Check { .. } => {
                self.set_state(i, State::Starting, "readiness check pending", now);
                self.services[i].deadline = Some(now);
            }
            _ => self.set_state(i, State::Starting, "waiting for readiness", now),
        }
        if self.services[i].state == State::Starting {
            self.services[i].start_deadline =
                self.services[i].spec.start_timeout_ms.map(|ms| now + Duration::from_millis(ms));
        }
        self.settle(now);
    }

    /// A start the core asked for was not carried out because a shutdown began meanwhile (in the
    /// same batch of actions): the service is simply stopped.
    pub fn start_cancelled(&mut self, i: usize, now: Instant) {
        // The shutdown may already have begun to stop it (its stop command queued): it never
        // ran, so the stop is finished here, helper and all.
        self.finish_stop(i, now);
        self.services[i].detail = "not started: shutting down".into();
        self.settle(now);
    }

    /// The main process of `i` could not be started.
    pub fn start_failed(&mut self, i: usize, error: &str, now: Instant) {
        let line = format!("nasinit: could not start {}: {error}", self.services[i].spec.command.join(" "));
        self.services[i].last_exit = format!("could not start: {error}");
        self.out.push(Action::Log(i, line));
        self.after_exit(i, false, now);
        self.settle(now);
    }

    fn became_ready(&mut self, i: usize, now: Instant) {
        let oneshot = self.services[i].spec.readiness == Readiness::Exited;
        self.set_state(i, if oneshot { State::Done } else { State::Running }, "", now);
        let s = &mut self.services[i];
        s.first_ready.get_or_insert(now);
        s.ready_since = Some(now);
        s.deadline = None;
    }

    fn check_overall(&mut self, now: Instant) {
        if self.boot_over_at.is_none()
            && self.plan_error.is_none()
            && (now >= self.t0 + BOOT_NICE_LIMIT
                || self.services.iter().all(|s| s.spec.boot_nice != 0 || s.state.is_ready() || !s.wanted))
        {
            self.boot_over_at = Some(now);
            if self.services.iter().any(|s| s.spec.boot_nice != 0) {
                self.out.push(Action::EndBootNice);
            }
        }
        if self.ready_at.is_none()
            && self.shutdown.is_none()
            && self.plan_error.is_none()
            && self.services.iter().all(|s| s.state.is_ready() || !s.wanted)
        {
            self.ready_at = Some(now);
            self.out.push(Action::Say(format!("ready in {:.2}s", now.duration_since(self.t0).as_secs_f64())));
            self.out.push(Action::BecameReady);
        }
        if !self.announced_degraded
            && let Some(f) = self.services.iter().find(|s| s.state == State::Failed)
        {
            self.announced_degraded = true;
            let line = format!("degraded: service {} failed ({})", f.spec.name, f.detail);
            self.out.push(Action::Say(line));
        }
    }

    /// The main process of `i` exited (`ok`: status 0); `how` says how ("exit 3", "signal 9").
    pub fn main_exited(&mut self, i: usize, ok: bool, how: &str, now: Instant) {
        self.services[i].running = false;
        self.services[i].last_exit = how.to_string();
        // The main process is gone; whatever it left behind goes with it, and a readiness check
        // of it has nothing left to check.
        self.out.push(Action::Kill(i));
        if self.services[i].helper == Some(Helper::Check) {
            self.services[i].helper = None;
            self.out.push(Action::KillHelper(i));
        }
        if self.services[i].state == State::Stopping {
            // During the stop command the service may exit by itself; the stop command's own
            // exit (or its deadline) then finishes the stop.
            if self.services[i].stop_phase != Some(StopPhase::StopCommand) {
                self.finish_stop(i, now);
            }
            return self.settle(now);
        }
        self.services[i].deadline = None;
        if self.services[i].spec.readiness == Readiness::Exited && ok {
            self.services[i].failures_in_row = 0;
            self.became_ready(i, now);
        } else {
            self.after_exit(i, ok, now);
        }
        self.settle(now);
    }

    fn stop_timeout(&self, i: usize) -> Duration {
        Duration::from_millis(self.services[i].spec.stop_timeout_ms)
    }

    /// Decides what follows an unplanned exit (or a failed start): restart after backoff, or stop.
    fn after_exit(&mut self, i: usize, ok: bool, now: Instant) {
        let stopping_all = self.shutdown.is_some();
        let s = &mut self.services[i];
        let policy = s.spec.restart.clone();
        let restart = match policy.when {
            Restart::Always => true,
            Restart::OnFailure => !ok,
            Restart::Never => false,
        };
        if stopping_all || !s.wanted {
            return self.set_state(i, State::Stopped, "", now);
        }
        if !restart {
            let last = s.last_exit.clone();
            // A service that became ready and then finished its work (a watcher that is done)
            // is done, not stopped: it still counts as ready.
            if ok && s.ready_since.is_some() {
                return self.set_state(i, State::Done, "", now);
            }
            return if ok {
                self.set_state(i, State::Stopped, "exited", now)
            } else {
                self.set_state(i, State::Failed, format!("{last}; restart policy {:?}", policy.when), now)
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
            return self.set_state(i, State::Failed, detail, now);
        }
        if s.ready_since.is_some_and(|t| now.duration_since(t) >= STABLE_AFTER) {
            s.failures_in_row = 0;
        }
        s.failures_in_row = s.failures_in_row.saturating_add(1);
        let shift = (s.failures_in_row - 1).min(20);
        let delay = policy.backoff_initial_ms.saturating_mul(1 << shift).min(policy.backoff_max_ms);
        let last = s.last_exit.clone();
        if delay == 0 {
            s.deadline = None;
            self.set_state(i, State::Waiting, "", now);
        } else {
            s.deadline = Some(now + Duration::from_millis(delay));
            self.set_state(i, State::Backoff, format!("{last}; restarting in {delay} ms"), now);
        }
    }

    /// A helper of `i` exited.
    pub fn helper_exited(&mut self, i: usize, ok: bool, how: &str, now: Instant) {
        let Some(kind) = self.services[i].helper.take() else { return };
        match (kind, self.services[i].state) {
            (Helper::Stop, State::Stopping) if self.services[i].stop_phase == Some(StopPhase::StopCommand) => {
                if !ok {
                    self.out.push(Action::Log(i, format!("nasinit: stop command {how}")));
                }
                self.terminate(i, now);
            }
            (Helper::Check, State::Starting) => {
                if ok {
                    self.became_ready(i, now);
                } else if let Readiness::Check { interval_ms, .. } = self.services[i].spec.readiness {
                    self.services[i].deadline = Some(now + Duration::from_millis(interval_ms));
                }
            }
            _ => {}
        }
        self.settle(now);
    }

    /// A helper of `i` could not be started.
    pub fn helper_failed(&mut self, i: usize, kind: Helper, error: &str, now: Instant) {
        self.services[i].helper = None;
        match kind {
            Helper::Stop => {
                self.out.push(Action::Log(i, format!("nasinit: stop command failed to start: {error}")));
                self.terminate(i, now);
            }
            Helper::Check => {
                self.out.push(Action::Log(i, format!("nasinit: readiness check failed to start: {error}")));
                if self.services[i].state == State::Starting {
                    self.services[i].deadline = Some(now + CHECK_RETRY);
                }
            }
        }
        self.settle(now);
    }

    /// A notify message (`READY=1`, `STATUS=…`) from `i`.
    pub fn notify(&mut self, i: usize, message: &str, now: Instant) {
        let Some(s) = self.services.get_mut(i) else { return };
        for field in message.lines() {
            if let Some(status) = field.strip_prefix("STATUS=") {
                s.detail = status.to_string();
            }
        }
        let notify = s.spec.readiness == Readiness::Notify;
        if notify && message.lines().any(|l| l == "READY=1") && s.state == State::Starting && s.running {
            self.became_ready(i, now);
        }
        self.settle(now);
    }

    /// `i` wrote its readiness newline in run `generation`.
    pub fn ready_fd(&mut self, i: usize, generation: u64, now: Instant) {
        let current = self.services.get(i).is_some_and(|s| {
            matches!(s.spec.readiness, Readiness::Fd { .. })
                && s.generation == generation
                && s.state == State::Starting
                && s.running
        });
        if current {
            self.became_ready(i, now);
        }
        self.settle(now);
    }

    /// Handles every deadline that has passed.
    pub fn deadline(&mut self, now: Instant) {
        if let Some(at) = self.ready_deadline
            && now >= at
            && self.ready_at.is_none()
            && !self.deadline_missed
            && self.shutdown.is_none()
        {
            self.deadline_missed = true;
            self.out.push(Action::MissedReadyDeadline);
            // The effects layer may answer with a reboot, whose stops go in reverse dependency
            // order. Anything else due now waits for the next call (it is still due then, see
            // `next_deadline`): a start timing out in this same instant would otherwise stop a
            // service while what depends on it is still up (a dependency an operator restarted
            // under a running dependent).
            return self.settle(now);
        }
        for i in 0..self.services.len() {
            // In a shutdown, stopping follows the reverse order instead.
            if self.shutdown.is_none()
                && self.services[i].state == State::Starting
                && self.services[i].start_deadline.is_some_and(|d| d <= now)
            {
                self.start_timed_out(i, now);
            }
        }
        for i in 0..self.services.len() {
            if self.services[i].deadline.is_none_or(|d| d > now) {
                continue;
            }
            self.services[i].deadline = None;
            match (self.services[i].state, self.services[i].stop_phase) {
                (State::Backoff, _) => self.set_state(i, State::Waiting, "", now),
                (State::Starting, _)
                    if matches!(self.services[i].spec.readiness, Readiness::Check { .. })
                        && self.services[i].helper.is_none()
                        && self.services[i].running =>
                {
                    self.services[i].helper = Some(Helper::Check);
                    self.out.push(Action::StartHelper(i, Helper::Check));
                }
                (State::Stopping, Some(StopPhase::StopCommand)) => {
                    if self.services[i].helper.take().is_some() {
                        self.out.push(Action::KillHelper(i));
                    }
                    self.out.push(Action::Log(i, "nasinit: stop command timed out".into()));
                    self.terminate(i, now);
                }
                (State::Stopping, Some(StopPhase::Term)) => {
                    let name = self.services[i].spec.name.clone();
                    self.out.push(Action::Log(i, "nasinit: stop timed out, killing the service's cgroup".into()));
                    self.out.push(Action::Say(format!("{name}: did not stop in time, killed")));
                    self.out.push(Action::Kill(i));
                    self.services[i].stop_phase = Some(StopPhase::Kill);
                    self.services[i].deadline = Some(now + KILL_GRACE);
                }
                (State::Stopping, Some(StopPhase::Kill)) => {
                    // SIGKILL cannot be ignored; a process in uninterruptible sleep (D state) is
                    // what remains. Do not wait on it forever.
                    let name = self.services[i].spec.name.clone();
                    self.out.push(Action::Say(format!("{name}: still not gone after SIGKILL, giving up on it")));
                    self.out.push(Action::Abandon(i));
                    self.services[i].running = false;
                    self.finish_stop(i, now);
                }
                _ => {}
            }
        }
        self.settle(now);
    }

    /// A service that did not become ready in time is stopped (without its stop command: it never
    /// got going) and then counts as a failure for its restart policy.
    fn start_timed_out(&mut self, i: usize, now: Instant) {
        let secs = self.services[i].spec.start_timeout_ms.unwrap_or(0) / 1000;
        let why = format!("did not become ready within {secs}s");
        let name = self.services[i].spec.name.clone();
        self.out.push(Action::Log(i, format!("nasinit: {why}; stopping it")));
        self.out.push(Action::Say(format!("{name}: {why}; stopping it (counted as a failure)")));
        self.services[i].failing = Some(why);
        if self.services[i].helper.take().is_some() {
            self.out.push(Action::KillHelper(i));
        }
        self.set_state(i, State::Stopping, "", now);
        self.terminate(i, now);
    }

    /// Begins stopping a service: its stop command first (if any), then SIGTERM, then SIGKILL.
    fn begin_stop(&mut self, i: usize, now: Instant) {
        let s = &self.services[i];
        let stop_cmd = s.spec.stop_command.is_some();
        match s.state {
            State::Stopping | State::Stopped | State::Failed => return,
            State::Waiting | State::Backoff => {
                self.services[i].deadline = None;
                return self.set_state(i, State::Stopped, "", now);
            }
            State::Done if !stop_cmd => return self.set_state(i, State::Stopped, "", now),
            _ => {}
        }
        self.set_state(i, State::Stopping, "", now);
        if stop_cmd {
            if self.services[i].helper.take().is_some() {
                // A readiness check still running has nothing more to say.
                self.out.push(Action::KillHelper(i));
            }
            self.services[i].helper = Some(Helper::Stop);
            self.services[i].stop_phase = Some(StopPhase::StopCommand);
            self.services[i].deadline = Some(now + self.stop_timeout(i));
            self.out.push(Action::StartHelper(i, Helper::Stop));
            return;
        }
        self.terminate(i, now);
    }

    fn terminate(&mut self, i: usize, now: Instant) {
        if !self.services[i].running {
            return self.finish_stop(i, now);
        }
        self.out.push(Action::Terminate(i));
        self.services[i].stop_phase = Some(StopPhase::Term);
        self.services[i].deadline = Some(now + self.stop_timeout(i));
    }

    fn finish_stop(&mut self, i: usize, now: Instant) {
        self.out.push(Action::Kill(i));
        if self.services[i].helper.take().is_some() {
            self.out.push(Action::KillHelper(i));
        }
        self.services[i].stop_phase = None;
        self.services[i].deadline = None;
        if let Some(why) = self.services[i].failing.take() {
            self.services[i].last_exit = why;
            return self.after_exit(i, false, now);
        }
        if self.services[i].restart_requested && self.shutdown.is_none() {
            self.services[i].restart_requested = false;
            self.services[i].asked = true;
            self.services[i].failures_in_row = 0;
            self.services[i].recent_starts.clear();
            self.set_state(i, State::Waiting, "", now);
        } else {
            self.set_state(i, State::Stopped, "", now);
        }
    }

    /// During a shutdown services stop in reverse dependency order and nothing starts: an
    /// operator's start or restart then is refused, and a stop is what is happening anyway.
    fn refuse_during_shutdown(&self) -> Result<(), String> {
        match self.shutdown {
            Some(kind) => Err(format!("the appliance is shutting down ({}); nothing is started now", kind.as_str())),
            None => Ok(()),
        }
    }

    /// `nasctl start NAME`.
    pub fn request_start(&mut self, name: &str, now: Instant) -> Result<(), String> {
        let i = self.lookup(name)?;
        self.refuse_during_shutdown()?;
        self.services[i].wanted = true;
        if self.services[i].state.is_down() {
            self.services[i].asked = true;
            self.services[i].failures_in_row = 0;
            self.services[i].recent_starts.clear();
            self.set_state(i, State::Waiting, "", now);
        }
        self.settle(now);
        Ok(())
    }

    /// `nasctl stop NAME`: stopped until started again.
    pub fn request_stop(&mut self, name: &str, now: Instant) -> Result<(), String> {
        let i = self.lookup(name)?;
        self.services[i].wanted = false;
        if self.shutdown.is_none() {
            self.begin_stop(i, now);
        }
        self.settle(now);
        Ok(())
    }

    /// `nasctl restart NAME`.
    pub fn request_restart(&mut self, name: &str, now: Instant) -> Result<(), String> {
        let i = self.lookup(name)?;
        self.refuse_during_shutdown()?;
        self.services[i].wanted = true;
        match self.services[i].state {
            State::Starting | State::Running | State::Done => {
                self.services[i].restart_requested = true;
                self.begin_stop(i, now);
            }
            State::Stopping => self.services[i].restart_requested = true,
            _ => {
                self.services[i].asked = true;
                self.services[i].failures_in_row = 0;
                self.services[i].recent_starts.clear();
                self.services[i].deadline = None;
                self.set_state(i, State::Waiting, "", now);
            }
        }
        self.settle(now);
        Ok(())
    }

    /// Stops services in reverse dependency order, then the effects layer finishes the kind.
    pub fn begin_shutdown(&mut self, kind: ShutdownKind, now: Instant) {
        if self.shutdown.is_none() {
            self.out.push(Action::Say(format!("{} requested: stopping services", kind.as_str())));
        }
        self.shutdown = Some(kind);
        self.settle(now);
    }

    /// A service stops once everything that depends on it has stopped.
    fn advance_shutdown(&mut self, now: Instant) {
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
                    .all(|j| self.services[j].state.is_down());
                if dependents_down {
                    self.begin_stop(i, now);
                }
            }
            if self.services.iter().map(|s| s.state).eq(before) {
                break;
            }
        }
    }
}
