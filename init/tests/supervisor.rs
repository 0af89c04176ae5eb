//! The supervisor on the host, as a child subreaper: ordering, readiness, restarts, stops,
//! reaping and shutdown, each observed through the control API and /proc.

mod common;

use std::time::{Duration, Instant};

use common::{Nasinit, after, alive, open_fds, read_pids, rss_kib, sh, zombies_of};
use nasos_board::plan::{Readiness, Restart};

const T: Duration = Duration::from_secs(15);

#[test]
fn dependencies_start_only_once_what_they_need_is_ready() {
    let mut a = sh("a", "sleep 0.6; echo >&3; exec sleep 1000");
    a.readiness = Readiness::Fd { fd: 3 };
    let b = after(sh("b", "exec sleep 1000"), &["a"]);
    let c = after(sh("c", "exec sleep 1000"), &["b"]);
    let n = Nasinit::start("deps", vec![c, b, a]);
    // While `a` is not ready, `b` waits for it and says so.
    let b_waiting = n.service("b");
    assert_eq!(b_waiting.state, "waiting", "{b_waiting:?}");
    assert_eq!(b_waiting.detail, "waiting for a");
    let a = n.wait_for("a", T, |s| s.state == "running");
    let b = n.wait_for("b", T, |s| s.state == "running");
    assert!(a.ready_ms >= 550, "a signalled readiness after 0.6 s: {a:?}");
    assert!(b.started_ms >= a.ready_ms, "b started before a was ready: {a:?} {b:?}");
    let c = n.wait_for("c", T, |s| s.state == "running");
    assert!(c.started_ms >= b.ready_ms, "{b:?} {c:?}");
    assert_eq!(n.poweroff(), Some(0));
}

#[test]
fn a_started_service_that_finishes_its_work_is_done_and_still_ready() {
    let mut w = sh("watch", "sleep 0.3; exit 0");
    w.readiness = Readiness::Started;
    w.restart.when = Restart::Never;
    let mut early = sh("early", "exit 0");
    early.readiness = Readiness::Check { command: vec!["/bin/false".into()], interval_ms: 50 };
    early.restart.when = Restart::Never;
    let n = Nasinit::start("done", vec![w, early]);
    let w = n.wait_for("watch", T, |s| s.state == "done");
    assert_eq!(w.last_exit, "exit 0", "{w:?}");
    // One that exits before it was ever ready is stopped, not done.
    let e = n.wait_for("early", T, |s| s.state != "waiting" && s.state != "starting");
    assert_eq!(e.state, "stopped", "{e:?}");
    n.poweroff();
}

#[test]
fn readiness_check_gates_dependents_until_it_passes() {
    let dir_flag = std::env::temp_dir().join(format!("nasinit-flag-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir_flag);
    let mut db = sh("db", &format!("sleep 0.5; touch {}; exec sleep 1000", dir_flag.display()));
    db.readiness = Readiness::Check {
        command: vec!["/bin/sh".into(), "-c".into(), format!("test -f {}", dir_flag.display())],
        interval_ms: 50,
    };
    let app = after(sh("app", "exec sleep 1000"), &["db"]);
    let n = Nasinit::start("check", vec![db, app]);
    let s = n.wait_for("db", T, |s| s.state == "starting" || s.state == "running");
    if s.state == "starting" {
        assert_eq!(n.service("app").state, "waiting");
    }
    let db = n.wait_for("db", T, |s| s.state == "running");
    let app = n.wait_for("app", T, |s| s.state == "running");
    assert!(db.ready_ms >= 450 && app.started_ms >= db.ready_ms, "{db:?} {app:?}");
    let _ = std::fs::remove_file(&dir_flag);
    n.poweroff();
}

#[test]
fn notify_socket_readiness_works_like_sd_notify() {
    // Python's socket module speaks the sd_notify datagram protocol in one line.
    let mut s = sh(
        "notify",
        "sleep 0.3; python3 -c 'import os,socket; s=socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.sendto(b\"STATUS=serving\\nREADY=1\", os.environ[\"NOTIFY_SOCKET\"])'; exec sleep 1000",
    );
    s.readiness = Readiness::Notify;
    let n = Nasinit::start("notify", vec![s]);
    assert_eq!(n.service("notify").state, "starting");
    let s = n.wait_for("notify", T, |s| s.state == "running");
    assert_eq!(s.detail, "", "state change clears the detail");
    assert!(s.ready_ms >= 250, "{s:?}");
    let out = n.console();
    assert!(out.contains("nasinit: ready in "), "{out}");
    n.poweroff();
}

#[test]
fn a_crashing_service_backs_off_exponentially_then_fails_while_others_run() {
    let stamps = std::env::temp_dir().join(format!("nasinit-crash-stamps-{}", std::process::id()));
    let _ = std::fs::remove_file(&stamps);
    let mut crash = sh("crash", &format!("date +%s%N >> {}; echo boom; exit 3", stamps.display()));
    crash.restart.backoff_initial_ms = 100;
    crash.restart.backoff_max_ms = 1000;
    crash.restart.start_limit = 6;
    let steady = sh("steady", "exec sleep 1000");
    let n = Nasinit::start("crash", vec![crash, steady]);
    let steady_before = n.wait_for("steady", T, |s| s.state == "running");
    let failed = n.wait_for("crash", T, |s| s.state == "failed");
    assert_eq!(failed.restarts, 5, "{failed:?}");
    assert_eq!(failed.last_exit, "exit 3");
    assert!(failed.detail.contains("start limit: 6 starts"), "{failed:?}");
    // Gaps between starts double: 100, 200, 400, 800, 1000 (capped) ms, plus the cost of a start.
    let t: Vec<u128> = std::fs::read_to_string(&stamps)
        .expect("stamps")
        .lines()
        .filter_map(|l| l.trim().parse::<u128>().ok())
        .collect();
    assert_eq!(t.len(), 6, "{t:?}");
    let gaps: Vec<u128> = t.windows(2).map(|w| (w[1] - w[0]) / 1_000_000).collect();
    for (gap, want) in gaps.iter().zip([100u128, 200, 400, 800, 1000]) {
        assert!(*gap >= want && *gap < want + 400, "gaps {gaps:?} should follow 100, 200, 400, 800, 1000 ms");
    }
    // The other service never noticed.
    let steady_after = n.service("steady");
    assert_eq!((steady_after.pid, steady_after.restarts), (steady_before.pid, 0));
    assert_eq!(steady_after.state, "running");
    let status = n.rt.block_on(n.client.status()).expect("status");
    assert_eq!((status.state.as_str(), status.services_failed), ("degraded", 1));
    assert!(n.console().contains("nasinit: degraded: service crash failed"), "{}", n.console());
    let logs = n.rt.block_on(n.client.logs("crash", 0, 100)).expect("logs");
    assert_eq!(logs.lines.iter().filter(|l| l.text == "boom").count(), 6);
    let _ = std::fs::remove_file(&stamps);
    n.poweroff();
}

#[test]
fn a_double_forking_daemon_is_stopped_with_its_whole_cgroup() {
    let pids = std::env::temp_dir().join(format!("nasinit-daemon-pids-{}", std::process::id()));
    let _ = std::fs::remove_file(&pids);
    let p = pids.display();
    // Two grandchildren leave the session with setsid and are re-parented when their parents exit.
    let script = format!(
        "(setsid sh -c 'echo $$ >> {p}; exec sleep 1000' &) ; (setsid sh -c 'echo $$ >> {p}; exec sleep 1000' &) ; echo $$ >> {p}; exec sleep 1000"
    );
    let n = Nasinit::start("daemon", vec![sh("daemon", &script)]);
    n.wait_for("daemon", T, |s| s.state == "running");
    let deadline = Instant::now() + T;
    while read_pids(&pids).len() < 3 {
        assert!(Instant::now() < deadline, "daemon did not write its pids");
        std::thread::sleep(Duration::from_millis(20));
    }
    let all = read_pids(&pids);
    assert!(all.iter().all(|&p| alive(p)), "{all:?}");
    n.rt.block_on(n.client.stop("daemon")).expect("stop");
    let s = n.wait_for("daemon", T, |s| s.state == "stopped");
    assert_eq!(s.pid, 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while all.iter().any(|&p| alive(p)) {
        assert!(
            Instant::now() < deadline,
            "processes escaped the stop: {:?}",
            all.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(&pids);
    n.poweroff();
}

#[test]
fn orphans_are_reaped_and_no_zombie_stays() {
    // Each round leaves an orphan that exits shortly after being re-parented to nasinit.
    let n = Nasinit::start(
        "orphans",
        vec![sh("spawner", "for i in 1 2 3 4 5 6 7 8; do (sleep 0.05 &) ; sleep 0.05; done; exec sleep 1000")],
    );
    n.wait_for("spawner", T, |s| s.state == "running");
    let deadline = Instant::now() + T;
    loop {
        let st = n.rt.block_on(n.client.status()).expect("status");
        if st.orphans_reaped >= 8 {
            break;
        }
        assert!(Instant::now() < deadline, "only {} orphans reaped", st.orphans_reaped);
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(zombies_of(n.pid()), Vec::<i32>::new());
    n.poweroff();
}

#[test]
fn a_stop_that_times_out_escalates_to_sigkill() {
    let mut stubborn = sh("stubborn", "trap '' TERM; sleep 1000 & wait; exec sleep 1000");
    stubborn.stop_timeout_ms = 700;
    let n = Nasinit::start("stubborn", vec![stubborn]);
    let s = n.wait_for("stubborn", T, |s| s.state == "running");
    let pid = s.pid as i32;
    let t = Instant::now();
    n.rt.block_on(n.client.stop("stubborn")).expect("stop");
    assert_eq!(n.service("stubborn").state, "stopping");
    n.wait_for("stubborn", T, |s| s.state == "stopped");
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(650) && took < Duration::from_secs(4), "stop took {took:?}");
    assert!(!alive(pid));
    let logs = n.rt.block_on(n.client.logs("stubborn", 0, 100)).expect("logs");
    assert!(logs.lines.iter().any(|l| l.text.contains("stop timed out")), "{logs:?}");
    n.poweroff();
}

#[test]
fn shutdown_stops_services_in_reverse_dependency_order() {
    let order = std::env::temp_dir().join(format!("nasinit-order-{}", std::process::id()));
    let _ = std::fs::remove_file(&order);
    let mk = |name: &str, deps: &[&str]| {
        let mut s = after(sh(name, "exec sleep 1000"), deps);
        s.stop_command = Some(vec!["/bin/sh".into(), "-c".into(), format!("echo {name} >> {}", order.display())]);
        s
    };
    // A oneshot with a stop command (like storage exporting its pools) is stopped too.
    let mut storage = sh("storage", "exit 0");
    storage.readiness = Readiness::Exited;
    storage.stop_command = Some(vec!["/bin/sh".into(), "-c".into(), format!("echo storage >> {}", order.display())]);
    let n = Nasinit::start(
        "order",
        vec![
            storage,
            after(mk("fabric", &[]), &["storage"]),
            mk("nfs", &["fabric", "storage"]),
            mk("health", &["nfs"]),
        ],
    );
    n.wait_for("health", T, |s| s.state == "running");
    assert_eq!(n.service("storage").state, "done");
    let code = n.poweroff();
    assert_eq!(code, Some(0));
    let got = std::fs::read_to_string(&order).expect("order file");
    assert_eq!(got.lines().collect::<Vec<_>>(), vec!["health", "nfs", "fabric", "storage"]);
    let _ = std::fs::remove_file(&order);
}

#[test]
fn a_thousand_crash_cycles_leave_no_zombie_and_no_growth() {
    let mut flapper = sh("flapper", "exit 1");
    flapper.command = vec!["/bin/false".into()];
    flapper.restart.when = Restart::Always;
    flapper.restart.backoff_initial_ms = 0;
    flapper.restart.backoff_max_ms = 0;
    flapper.restart.start_limit = 1_000_000;
    flapper.restart.start_limit_window_ms = 1000;
    let n = Nasinit::start("thousand", vec![flapper, sh("steady", "exec sleep 1000")]);
    // Compare at quiet points (flapper stopped), so no in-flight spawn's pipes are counted.
    let quiet = |n: &Nasinit| {
        n.rt.block_on(n.client.stop("flapper")).expect("stop");
        n.wait_for("flapper", T, |s| s.state == "stopped");
        std::thread::sleep(Duration::from_millis(200));
        (open_fds(n.pid()), rss_kib(n.pid()))
    };
    n.wait_for("flapper", Duration::from_secs(60), |s| s.restarts >= 100);
    let (fds_100, rss_100) = quiet(&n);
    n.rt.block_on(n.client.start("flapper")).expect("start");
    let s = n.wait_for("flapper", Duration::from_secs(120), |s| s.restarts >= 1000);
    let (fds_1000, rss_1000) = quiet(&n);
    assert_eq!(zombies_of(n.pid()), Vec::<i32>::new(), "after {} restarts", s.restarts);
    assert!(fds_1000 <= fds_100, "open fds grew from {fds_100} to {fds_1000}");
    assert!(rss_1000 <= rss_100 + 512, "RSS grew from {rss_100} KiB to {rss_1000} KiB over 900 restarts");
    assert_eq!(n.service("steady").restarts, 0);
    n.poweroff();
}

#[test]
fn environment_user_and_working_directory_are_applied() {
    let mut s = sh("env", "echo \"dir=$(pwd) foo=$FOO uid=$(id -u) path=$PATH\"; exec sleep 1000");
    s.environment.insert("FOO".into(), "bar".into());
    s.working_directory = Some("/tmp".into());
    s.user = Some("nobody".into());
    let n = Nasinit::start("env", vec![s]);
    n.wait_for("env", T, |s| s.state == "running");
    let deadline = Instant::now() + T;
    let line = loop {
        let logs = n.rt.block_on(n.client.logs("env", 0, 10)).expect("logs");
        if let Some(l) = logs.lines.first() {
            break l.text.clone();
        }
        assert!(Instant::now() < deadline, "no output");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(line.starts_with("dir=/tmp foo=bar uid=65534 path=/usr/local/sbin:"), "{line}");
    // The same output went to the service's log file.
    let file = std::fs::read_to_string(n.path("log/env.log")).expect("log file");
    assert!(file.contains("foo=bar"), "{file}");
    n.poweroff();
}

#[test]
fn a_command_that_cannot_start_is_a_failure_with_a_reason() {
    let mut s = sh("missing", "");
    s.command = vec!["/nonexistent/daemon".into()];
    s.restart.when = Restart::Never;
    let n = Nasinit::start("missing", vec![s]);
    let s = n.wait_for("missing", T, |s| s.state == "failed");
    assert!(s.last_exit.starts_with("could not start:"), "{s:?}");
    n.poweroff();
}

/// Two services printing as fast as they can must not starve control requests, deadlines or
/// shutdown: the loop stays fair (logs drop rather than block).
#[test]
fn services_flooding_their_output_do_not_starve_control_or_shutdown() {
    let flood = |name: &str| sh(name, "exec yes 'a line of output that never ends, as fast as a pipe takes it'");
    let mut tick = sh("tick", "exec sleep 1000");
    tick.readiness = Readiness::Started;
    let n = Nasinit::start("flood", vec![flood("flood1"), flood("flood2"), tick]);
    n.wait_for("tick", T, |s| s.state == "running");
    // Let the floods fill every buffer between them and the supervisor.
    std::thread::sleep(Duration::from_secs(2));
    let mut worst = Duration::ZERO;
    for _ in 0..10 {
        let t = Instant::now();
        let st = n.rt.block_on(n.client.status()).expect("status");
        worst = worst.max(t.elapsed());
        assert_eq!(st.services, 3);
    }
    eprintln!("status under flooding output: worst {worst:?} of 10");
    assert!(worst < Duration::from_secs(1), "status took {worst:?} under flooding output");
    // A restart goes through its stop and start deadlines while the floods go on.
    let before = n.service("tick").pid;
    n.rt.block_on(n.client.restart("tick")).expect("restart");
    let after = n.wait_for("tick", T, |s| s.state == "running" && s.pid != before);
    assert_ne!(after.pid, before);
    let t = Instant::now();
    assert_eq!(n.poweroff(), Some(0));
    assert!(t.elapsed() < Duration::from_secs(10), "poweroff took {:?} under flooding output", t.elapsed());
}

/// A boot that is not ready by its deadline is reported and rebooted; after the guard's count
/// of such boots in a row, nasinit stays up, not ready, and says why.
#[test]
fn a_missed_boot_deadline_reboots_until_the_guard_stops_it() {
    let dir = std::env::temp_dir().join(format!("nasinit-test-deadline-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Outside nasinit's test directory, which goes with each run.
    let state = std::env::temp_dir().join(format!("nasinit-test-deadline-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state).expect("state dir");
    let plan = || {
        let mut hang = sh("storage", "exec sleep 1000");
        hang.readiness = Readiness::Notify;
        let mut plan = nasos_board::Plan::empty("test");
        plan.services = vec![sh("console", "exec sleep 1000"), hang];
        plan.liveness.ready_deadline_seconds = 2;
        plan.liveness.failed_boots_before_staying_up = 2;
        plan
    };
    let state_arg = state.display().to_string();
    // First boot: misses its deadline, says what it waits for, reboots (the supervisor exits).
    let n = Nasinit::start_plan(dir.clone(), plan(), &["--state", &state_arg]);
    let console = {
        let deadline = Instant::now() + T;
        loop {
            let c = n.console();
            if c.contains("reboot complete") || Instant::now() > deadline {
                break c;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    assert!(console.contains("missed the boot deadline (2s); not ready: storage (starting"), "{console}");
    assert!(console.contains("rebooting (1 of 2 in a row)"), "{console}");
    assert_eq!(n.wait_exit(T), Some(0));
    assert_eq!(std::fs::read_to_string(state.join("failed-boots")).ok().as_deref(), Some("1\n"), "the count is kept");
    // Second boot in a row: it stays up, not ready, and nasctl status says why.
    let n = Nasinit::start_plan(dir.clone(), plan(), &["--state", &state_arg]);
    let deadline = Instant::now() + T;
    let st = loop {
        let st = n.rt.block_on(n.client.status()).unwrap_or_else(|e| panic!("status: {e}\n{}", n.console()));
        if !st.why_not_ready.is_empty() || Instant::now() > deadline {
            break st;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(st.why_not_ready.starts_with("2 boots in a row missed their 2s deadline; staying up"), "{st:?}");
    assert_eq!(st.state, "starting");
    std::thread::sleep(Duration::from_millis(500));
    assert!(!n.console().contains("reboot complete"), "{}", n.console());
    assert_eq!(n.poweroff(), Some(0));
    // A boot that becomes ready clears the count.
    let mut ok = plan();
    ok.services[1].readiness = Readiness::Started;
    let n = Nasinit::start_plan(dir.clone(), ok, &["--state", &state_arg]);
    n.wait_for("storage", T, |s| s.state == "running");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!state.join("failed-boots").exists(), "the count was not cleared by a ready boot");
    assert_eq!(n.poweroff(), Some(0));
    let _ = std::fs::remove_dir_all(&state);
}
