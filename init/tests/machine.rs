//! Property tests of the supervisor's decision core: random service graphs driven by random
//! sequences of process exits, readiness messages, requests, signals and passing time, through a
//! simulated world that carries out the core's actions. After every step the invariants of
//! `init/src/machine.rs` must hold, and a shutdown must always complete.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nasos_api::ShutdownKind;
use nasos_board::plan::{Readiness, Restart, RestartPolicy, Service};
use nasos_init::machine::{self, Action, Core, Helper, State};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Svc {
    after: Vec<usize>,
    readiness: u8,
    restart: u8,
    backoff_ms: u64,
    start_limit: u32,
    stop_command: bool,
    stop_timeout_ms: u64,
    start_timeout_ms: Option<u64>,
    /// Ignores SIGTERM.
    stubborn: bool,
    /// Survives SIGKILL (a process stuck in D state).
    unkillable: bool,
}

#[derive(Debug, Clone)]
enum Op {
    Exit(usize, bool),
    Ready(usize),
    HelperExit(usize, bool),
    Reap,
    Advance(u64),
    Start(usize),
    Stop(usize),
    Restart(usize),
    Shutdown,
}

fn svc(n: usize) -> impl Strategy<Value = Svc> {
    (
        proptest::collection::vec(0..n.max(1), 0..3),
        0u8..5,
        0u8..3,
        prop_oneof![Just(0u64), Just(100), Just(1000)],
        1u32..5,
        any::<bool>(),
        (100u64..3000, proptest::option::of(500u64..8000)),
        any::<bool>(),
        proptest::bool::weighted(0.1),
    )
        .prop_map(
            |(
                after,
                readiness,
                restart,
                backoff_ms,
                start_limit,
                stop_command,
                (stop_timeout_ms, start_timeout_ms),
                stubborn,
                unkillable,
            )| {
                Svc {
                    after,
                    readiness,
                    restart,
                    backoff_ms,
                    start_limit,
                    stop_command,
                    stop_timeout_ms,
                    start_timeout_ms,
                    stubborn,
                    unkillable,
                }
            },
        )
}

fn op(n: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..n, any::<bool>()).prop_map(|(i, ok)| Op::Exit(i, ok)),
        4 => (0..n).prop_map(Op::Ready),
        2 => (0..n, any::<bool>()).prop_map(|(i, ok)| Op::HelperExit(i, ok)),
        4 => Just(Op::Reap),
        4 => (1u64..4000).prop_map(Op::Advance),
        1 => (0..n).prop_map(Op::Start),
        1 => (0..n).prop_map(Op::Stop),
        1 => (0..n).prop_map(Op::Restart),
        1 => Just(Op::Shutdown),
    ]
}

fn name(i: usize) -> String {
    format!("s{i}")
}

/// Service `i` may only come after services before it, so every graph is acyclic.
fn plan(svcs: &[Svc]) -> Vec<Service> {
    svcs.iter()
        .enumerate()
        .map(|(i, s)| {
            let mut after: Vec<String> = s.after.iter().filter(|&&d| d < i).map(|&d| name(d)).collect();
            after.dedup();
            Service {
                name: name(i),
                command: vec!["/bin/service".into()],
                after,
                readiness: match s.readiness {
                    0 => Readiness::Started,
                    1 => Readiness::Exited,
                    2 => Readiness::Notify,
                    3 => Readiness::Fd { fd: 3 },
                    _ => Readiness::Check { command: vec!["/bin/check".into()], interval_ms: 200 },
                },
                restart: RestartPolicy {
                    when: [Restart::Always, Restart::OnFailure, Restart::Never][s.restart as usize],
                    backoff_initial_ms: s.backoff_ms,
                    backoff_max_ms: 5_000,
                    start_limit: s.start_limit,
                    start_limit_window_ms: 60_000,
                },
                stop_command: s.stop_command.then(|| vec!["/bin/stop".into()]),
                stop_timeout_ms: s.stop_timeout_ms,
                start_timeout_ms: s.start_timeout_ms,
                environment: BTreeMap::new(),
                user: None,
                working_directory: None,
                // Every third service yields while the box boots.
                boot_nice: if i % 3 == 2 { 19 } else { 0 },
            }
        })
        .collect()
}

/// Processes as the simulated kernel sees them.
#[derive(Default, Clone)]
struct Proc {
    main: bool,
    /// Signalled and will be reaped at the next `Reap`.
    main_dying: bool,
    helper: Option<Helper>,
    helper_dying: bool,
}

struct World {
    core: Core,
    svcs: Vec<Svc>,
    procs: Vec<Proc>,
    now: Instant,
    spawn_fails: std::iter::Cycle<std::vec::IntoIter<bool>>,
    boot_nice_ended: bool,
}

impl World {
    fn deps_ready(&self, i: usize) -> bool {
        self.core.services[i].deps.iter().all(|&d| self.core.services[d].state.is_ready())
    }

    /// Carries out the core's actions, checking what must hold at the moment of each.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        loop {
            let actions = self.core.take_actions();
            if actions.is_empty() {
                return Ok(());
            }
            for a in actions {
                match a {
                    // A shutdown begun within this batch (a missed deadline): the start is called off.
                    Action::Start(i) if self.core.shutdown.is_some() => self.core.start_cancelled(i, self.now),
                    Action::Start(i) => {
                        prop_assert!(self.deps_ready(i), "s{i} started before its dependencies were ready");
                        prop_assert!(!self.procs[i].main, "s{i} started twice");
                        if self.spawn_fails.next().unwrap_or(false) {
                            self.core.start_failed(i, "no such file", self.now);
                        } else {
                            self.procs[i].main = true;
                            self.procs[i].main_dying = false;
                            self.core.started(i, self.now);
                        }
                    }
                    Action::StartHelper(i, kind) => {
                        self.procs[i].helper = Some(kind);
                        self.procs[i].helper_dying = false;
                    }
                    Action::KillHelper(i) => self.procs[i].helper_dying = self.procs[i].helper.is_some(),
                    Action::Terminate(i) => {
                        if self.procs[i].main && !self.svcs[i].stubborn {
                            self.procs[i].main_dying = true;
                        }
                    }
                    Action::Kill(i) => {
                        if self.procs[i].main && !self.svcs[i].unkillable {
                            self.procs[i].main_dying = true;
                        }
                    }
                    Action::Abandon(i) => self.procs[i] = Proc { helper: self.procs[i].helper, ..Proc::default() },
                    Action::Say(_) | Action::Log(..) | Action::BecameReady => {}
                    Action::EndBootNice => {
                        prop_assert!(!self.boot_nice_ended, "the boot ended twice");
                        prop_assert!(self.core.services.iter().any(|s| s.spec.boot_nice != 0));
                        prop_assert!(self.core.boot_over_at.is_some());
                        self.boot_nice_ended = true;
                    }
                    // What the effects layer does under the guard's count: reboot.
                    Action::MissedReadyDeadline => {
                        prop_assert!(self.core.ready_at.is_none(), "a deadline missed by a ready appliance");
                        self.core.begin_shutdown(ShutdownKind::Reboot, self.now);
                    }
                }
            }
        }
    }

    fn reap(&mut self) {
        for i in 0..self.procs.len() {
            if self.procs[i].main && self.procs[i].main_dying {
                self.procs[i].main = false;
                self.procs[i].main_dying = false;
                self.core.main_exited(i, false, "signal 9", self.now);
            }
            if self.procs[i].helper.is_some() && self.procs[i].helper_dying {
                self.procs[i].helper = None;
                self.procs[i].helper_dying = false;
                self.core.helper_exited(i, false, "signal 9", self.now);
            }
        }
    }

    fn advance(&mut self, ms: u64) {
        self.now += Duration::from_millis(ms);
        if self.core.next_deadline().is_some_and(|d| d <= self.now) {
            self.core.deadline(self.now);
        }
    }

    fn step(&mut self, op: &Op) {
        let now = self.now;
        match *op {
            Op::Exit(i, ok) => {
                if self.procs[i].main {
                    self.procs[i].main = false;
                    self.core.main_exited(i, ok, if ok { "exit 0" } else { "exit 1" }, now);
                }
            }
            Op::Ready(i) => {
                if self.procs[i].main {
                    let generation = self.core.services[i].generation;
                    self.core.notify(i, "READY=1", now);
                    self.core.ready_fd(i, generation, now);
                }
            }
            Op::HelperExit(i, ok) => {
                if self.procs[i].helper.take().is_some() {
                    self.core.helper_exited(i, ok, "exit", now);
                }
            }
            Op::Reap => self.reap(),
            Op::Advance(ms) => self.advance(ms),
            Op::Start(i) => {
                let _ = self.core.request_start(&name(i), now);
            }
            Op::Stop(i) => {
                let _ = self.core.request_stop(&name(i), now);
            }
            Op::Restart(i) => {
                let _ = self.core.request_restart(&name(i), now);
            }
            Op::Shutdown => self.core.begin_shutdown(ShutdownKind::Poweroff, now),
        }
    }

    /// What must hold between steps.
    fn check(&self, before: &[State]) -> Result<(), TestCaseError> {
        let core = &self.core;
        // The boot ends as soon as every service on the way to serving is ready, or at the limit.
        if core.boot_over_at.is_none() && core.shutdown.is_none() {
            let others_ready = core.services.iter().all(|s| s.spec.boot_nice != 0 || s.state.is_ready() || !s.wanted);
            prop_assert!(!others_ready, "every service on the way to serving is ready, and the boot is not over");
            prop_assert!(self.now < core.t0 + machine::BOOT_NICE_LIMIT, "the boot outlived its limit");
        }
        for (i, s) in core.services.iter().enumerate() {
            if s.state == State::Stopping {
                prop_assert!(s.deadline.is_some(), "s{i} is stopping with no deadline");
            }
            if core.shutdown.is_none() {
                let startable = s.state == State::Waiting && s.wanted && self.deps_ready(i);
                prop_assert!(!startable, "s{i} could start but was left waiting");
            } else if s.state == State::Stopping && before[i] != State::Stopping {
                for (j, d) in core.services.iter().enumerate() {
                    if d.deps.contains(&i) {
                        prop_assert!(
                            matches!(d.state, State::Stopped | State::Failed),
                            "s{i} began to stop while s{j}, which depends on it, was {:?}",
                            d.state
                        );
                    }
                }
            }
            prop_assert_eq!(s.running, self.procs[i].main, "s{} running flag", i);
        }
        Ok(())
    }
}

fn world(svcs: Vec<Svc>, spawn_fails: Vec<bool>) -> World {
    let t0 = Instant::now();
    let n = svcs.len();
    let mut fails = spawn_fails;
    fails.push(false);
    let mut core = Core::new(plan(&svcs), t0);
    // A boot deadline some graphs miss and some meet.
    core.ready_deadline = Some(t0 + Duration::from_secs(20));
    World {
        core,
        svcs,
        procs: vec![Proc::default(); n],
        now: t0,
        spawn_fails: fails.into_iter().cycle(),
        boot_nice_ended: false,
    }
}

fn services_and_ops() -> impl Strategy<Value = (Vec<Svc>, Vec<Op>, Vec<bool>)> {
    (2usize..7).prop_flat_map(|n| {
        (
            proptest::collection::vec(svc(n), n),
            proptest::collection::vec(op(n), 0..120),
            proptest::collection::vec(proptest::bool::weighted(0.15), 1..20),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_and_shutdown_completes((svcs, ops, fails) in services_and_ops()) {
        let mut w = world(svcs, fails);
        w.core.schedule(w.now);
        w.drain()?;
        w.check(&vec![State::Waiting; w.svcs.len()])?;
        for op in &ops {
            let before: Vec<State> = w.core.services.iter().map(|s| s.state).collect();
            w.step(op);
            w.drain()?;
            w.check(&before)?;
        }
        // However it got here, a shutdown ends: processes that ignore SIGTERM are killed, ones
        // that survive SIGKILL are given up on, stop commands that hang time out.
        let before: Vec<State> = w.core.services.iter().map(|s| s.state).collect();
        w.core.begin_shutdown(ShutdownKind::Reboot, w.now);
        w.drain()?;
        w.check(&before)?;
        for _ in 0..200 {
            if w.core.shutdown_complete().is_some() {
                break;
            }
            let before: Vec<State> = w.core.services.iter().map(|s| s.state).collect();
            w.reap();
            w.drain()?;
            w.advance(1000);
            w.drain()?;
            w.check(&before)?;
        }
        prop_assert_eq!(w.core.shutdown_complete(), Some(ShutdownKind::Reboot), "shutdown did not complete: {:?}",
            w.core.services.iter().map(|s| (s.state, s.running, s.helper)).collect::<Vec<_>>());
    }
}

/// A service that fails at once, forever, with no backoff, does not keep an unrelated service
/// from starting and becoming ready; it ends up failed by its start limit.
/// A service started at once, ready when started, always restarted.
fn plain() -> Svc {
    Svc {
        after: vec![],
        readiness: 0,
        restart: 0,
        backoff_ms: 0,
        start_limit: 4,
        stop_command: false,
        stop_timeout_ms: 1000,
        start_timeout_ms: None,
        stubborn: false,
        unkillable: false,
    }
}

#[test]
fn a_crash_loop_does_not_starve_the_others() {
    let crash = plain();
    let mut other = crash.clone();
    other.readiness = 2;
    let mut w = world(vec![crash, other], vec![true, false, true, true, true]);
    w.core.schedule(w.now);
    w.drain().expect("invariants");
    assert_eq!(w.core.services[0].state, State::Failed, "{:?}", w.core.services[0].detail);
    assert!(w.core.services[0].detail.starts_with("start limit: 4 starts"), "{}", w.core.services[0].detail);
    assert_eq!(w.core.services[1].state, State::Starting);
    w.step(&Op::Ready(1));
    w.drain().expect("invariants");
    assert_eq!(w.core.services[1].state, State::Running);
}

/// A service that never becomes ready is stopped when its start timeout passes and counts as a
/// failure: its restart policy restarts it (after backoff), and the start limit ends it.
#[test]
fn a_start_that_never_finishes_times_out_and_counts_as_a_failure() {
    let hang = Svc {
        after: vec![],
        // A oneshot that never exits.
        readiness: 1,
        restart: 1,
        backoff_ms: 100,
        start_limit: 2,
        stop_command: true,
        stop_timeout_ms: 1000,
        start_timeout_ms: Some(5000),
        stubborn: false,
        unkillable: false,
    };
    let mut w = world(vec![hang], vec![]);
    w.core.schedule(w.now);
    w.drain().expect("invariants");
    assert_eq!(w.core.services[0].state, State::Starting);
    w.advance(5001);
    let actions = w.core.take_actions();
    assert!(actions.contains(&Action::Terminate(0)), "{actions:?}");
    assert!(!actions.contains(&Action::StartHelper(0, Helper::Stop)), "a start that timed out skips the stop command");
    assert_eq!(w.core.services[0].state, State::Stopping);
    w.procs[0].main_dying = true;
    w.reap();
    w.drain().expect("invariants");
    assert_eq!(w.core.services[0].state, State::Backoff);
    assert_eq!(w.core.services[0].last_exit, "did not become ready within 5s");
    w.advance(200);
    w.drain().expect("invariants");
    assert_eq!(w.core.services[0].state, State::Starting, "restarted after backoff");
    w.advance(5001);
    w.drain().expect("invariants");
    w.reap();
    w.drain().expect("invariants");
    assert_eq!(w.core.services[0].state, State::Failed, "{}", w.core.services[0].detail);
    assert!(w.core.services[0].detail.starts_with("start limit"), "{}", w.core.services[0].detail);
}

/// The boot deadline passes once, and only while the appliance is not ready.
#[test]
fn the_boot_deadline_is_missed_once() {
    let svc = Svc {
        after: vec![],
        readiness: 2,
        restart: 0,
        backoff_ms: 100,
        start_limit: 3,
        stop_command: false,
        stop_timeout_ms: 1000,
        start_timeout_ms: None,
        stubborn: false,
        unkillable: false,
    };
    let mut w = world(vec![svc.clone()], vec![]);
    w.core.schedule(w.now);
    w.drain().expect("invariants");
    w.advance(19_000);
    assert!(!w.core.take_actions().contains(&Action::MissedReadyDeadline));
    w.advance(1_500);
    assert_eq!(w.core.take_actions().iter().filter(|a| **a == Action::MissedReadyDeadline).count(), 1);
    w.advance(5_000);
    assert!(!w.core.take_actions().contains(&Action::MissedReadyDeadline), "said once");
    // A box that became ready in time misses nothing.
    let mut w = world(vec![svc], vec![]);
    w.core.schedule(w.now);
    w.drain().expect("invariants");
    w.step(&Op::Ready(0));
    assert!(w.core.take_actions().contains(&Action::BecameReady));
    w.advance(30_000);
    assert!(!w.core.take_actions().contains(&Action::MissedReadyDeadline));
}

/// A service on the way to serving that never becomes ready leaves the others niced only until
/// the limit; a shutdown before then leaves no boot deadline behind (past due, the loop would
/// spin on it).
#[test]
fn the_boot_niceness_ends_at_the_limit_and_a_shutdown_drops_its_deadline() {
    // s0 (on the way to serving) says it is ready when told; s2 yields while the box boots.
    let notify = Svc { readiness: 2, ..plain() };
    let mut w = world(vec![notify.clone(), plain(), plain()], vec![]);
    assert_eq!(w.core.services[2].spec.boot_nice, 19);
    w.core.schedule(w.now);
    w.drain().expect("invariants");
    assert_eq!((w.core.boot_niced(2), w.boot_nice_ended), (19, false));
    w.step(&Op::Ready(0));
    w.drain().expect("invariants");
    assert_eq!((w.core.boot_niced(2), w.boot_nice_ended), (0, true), "ends once the others are ready");
    // s0 never becomes ready: the niceness ends at the limit all the same.
    let never_ready = notify;
    let mut w = world(vec![never_ready.clone(), plain(), plain()], vec![]);
    w.core.ready_deadline = None;
    w.core.schedule(w.now);
    w.drain().expect("invariants");
    assert_eq!(w.core.boot_niced(2), 19);
    w.advance(59_000);
    w.drain().expect("invariants");
    assert!(w.core.boot_over_at.is_none());
    w.advance(1_500);
    w.drain().expect("invariants");
    assert!(w.boot_nice_ended && w.core.boot_over_at.is_some());
    assert_eq!(w.core.boot_niced(2), 0);

    let mut w = world(vec![never_ready, plain(), plain()], vec![]);
    w.core.schedule(w.now);
    w.drain().expect("invariants");
    w.core.begin_shutdown(ShutdownKind::Poweroff, w.now);
    w.drain().expect("invariants");
    w.reap();
    w.drain().expect("invariants");
    w.advance(70_000);
    w.drain().expect("invariants");
    w.reap();
    w.drain().expect("invariants");
    assert!(w.core.next_deadline().is_none_or(|d| d > w.now), "a deadline left in the past");
    assert!(!w.boot_nice_ended, "a shut-down boot never ends its niceness");
}

/// `restarts` is what health reads as trouble: a crash counts, an operator's restart does not.
#[test]
fn an_operators_restart_is_not_counted_as_a_restart() {
    let one = plain();
    let mut w = world(vec![one], vec![]);
    w.core.schedule(w.now);
    w.drain().expect("invariants");
    assert_eq!((w.core.services[0].state, w.core.services[0].restarts), (State::Running, 0));
    w.step(&Op::Restart(0));
    w.drain().expect("invariants");
    w.step(&Op::Reap);
    w.drain().expect("invariants");
    assert_eq!((w.core.services[0].state, w.core.services[0].restarts), (State::Running, 0), "asked for");
    w.step(&Op::Exit(0, false));
    w.drain().expect("invariants");
    assert_eq!((w.core.services[0].state, w.core.services[0].restarts), (State::Running, 1), "a crash");
    w.step(&Op::Stop(0));
    w.drain().expect("invariants");
    w.step(&Op::Reap);
    w.drain().expect("invariants");
    w.step(&Op::Start(0));
    w.drain().expect("invariants");
    assert_eq!((w.core.services[0].state, w.core.services[0].restarts), (State::Running, 1), "stopped and started");
}
