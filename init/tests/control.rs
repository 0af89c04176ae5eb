//! The control API: every call round-trips, errors are errors, and garbage or silent clients on
//! the socket do not hurt the supervisor. `nasctl` prints the same data as tables and JSON.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Nasinit, sh};
use nasos_board::plan::Readiness;

const T: Duration = Duration::from_secs(15);

/// nasctl lives in its own crate (`nasos-ctl`), so cargo does not build it for this package's
/// tests. It is built once per test process, into the profile this test binary was built in
/// (`cargo test --release` runs from `target/release`; a debug build there would be looked for
/// in the wrong directory, as a clean CI clone showed).
fn nasctl_bin() -> &'static std::path::Path {
    static BIN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable");
        let dir = exe.parent().and_then(|d| d.parent()).expect("target directory").to_path_buf();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "nasos-ctl", "--bin", "nasctl"]).current_dir(env!("CARGO_MANIFEST_DIR"));
        if let Some(target) = dir.parent() {
            cmd.env("CARGO_TARGET_DIR", target);
        }
        match dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => {}
            Some(profile) => {
                cmd.args(["--profile", profile]);
            }
        }
        let out = cmd.output().expect("spawn cargo to build nasctl");
        assert!(out.status.success(), "building nasctl failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let bin = dir.join("nasctl");
        assert!(bin.exists(), "{} missing after the build", bin.display());
        bin
    })
}

fn nasctl(n: &Nasinit, args: &[&str]) -> (Option<i32>, String, String) {
    let out =
        Command::new(nasctl_bin()).arg("--socket").arg(n.path("control.sock")).args(args).output().expect("run nasctl");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_call_round_trips() {
    let mut once = sh("once", "echo one; echo two; exit 0");
    once.readiness = Readiness::Exited;
    let n = Nasinit::start("api", vec![sh("web", "echo hello; exec sleep 1000"), once]);
    let c = &n.client;
    let web = n.wait_for("web", T, |s| s.state == "running");
    n.wait_for("once", T, |s| s.state == "done");

    let st = n.rt.block_on(c.status()).expect("status");
    assert_eq!((st.state.as_str(), st.services, st.services_ready, st.services_failed), ("ready", 2, 2, 0));
    assert!(!st.pid1);
    assert!(st.ready_ms >= 0 && st.uptime_ms >= st.ready_ms, "{st:?}");

    let timeline = n.rt.block_on(c.timeline()).expect("timeline");
    assert_eq!(timeline.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), vec!["web", "once"]);
    assert!(timeline.iter().all(|t| t.started_ms >= 0 && t.ready_ms >= t.started_ms), "{timeline:?}");

    let page = n.rt.block_on(c.logs("once", 0, 10)).expect("logs");
    assert_eq!(page.lines.iter().map(|l| l.text.as_str()).collect::<Vec<_>>(), vec!["one", "two"]);
    assert!(n.rt.block_on(c.logs("once", page.next, 10)).expect("logs").lines.is_empty());

    n.rt.block_on(c.restart("web")).expect("restart");
    let web2 = n.wait_for("web", T, |s| s.state == "running" && s.pid != web.pid);
    assert_eq!(web2.restarts, 0, "an operator's restart is not trouble for health to count");
    n.rt.block_on(c.stop("web")).expect("stop");
    n.wait_for("web", T, |s| s.state == "stopped");
    n.rt.block_on(c.start("web")).expect("start");
    n.wait_for("web", T, |s| s.state == "running");

    let errors = [
        n.rt.block_on(c.start("nope")).expect_err("unknown service"),
        n.rt.block_on(c.stop("nope")).expect_err("unknown service"),
        n.rt.block_on(c.restart("nope")).expect_err("unknown service"),
    ];
    for e in errors {
        assert!(e.to_string().contains("no service named `nope`"), "{e}");
    }
    let e = n.rt.block_on(c.logs("nope", 0, 1)).expect_err("unknown service");
    assert!(e.to_string().contains("no service named"), "{e}");
    let e = n.rt.block_on(c.call::<_, ()>("Shutdown", &("explode",))).expect_err("bad kind");
    assert!(e.to_string().contains("use poweroff, reboot or halt"), "{e}");
    assert_eq!(n.poweroff(), Some(0));
}

#[test]
fn garbage_and_silent_clients_do_not_hurt_the_supervisor() {
    let n = Nasinit::start("garbage", vec![sh("web", "exec sleep 1000")]);
    let before = n.wait_for("web", T, |s| s.state == "running");
    let sock = n.path("control.sock");
    // Silent clients that never finish the handshake.
    let silent: Vec<UnixStream> = (0..8).map(|_| UnixStream::connect(&sock).expect("connect")).collect();
    // Raw garbage, a bogus AUTH line, and a half-open connection.
    for junk in [
        &b"\x00\xff\xfe garbage \r\n"[..],
        b"\0AUTH BOGUS\r\nBEGIN\r\n\x6c\x01\x00\x01\xff\xff\xff\xff",
        &[0u8; 65536][..],
    ] {
        let mut s = UnixStream::connect(&sock).expect("connect");
        let _ = s.write_all(junk);
        s.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
        let mut buf = [0u8; 256];
        let _ = s.read(&mut buf);
    }
    // The supervisor still answers at once, and the service never noticed.
    let t = Instant::now();
    let st = n.rt.block_on(n.client.status()).expect("status after garbage");
    assert!(t.elapsed() < Duration::from_secs(1), "status took {:?}", t.elapsed());
    assert_eq!(st.state, "ready");
    let after = n.service("web");
    assert_eq!((after.pid, after.restarts), (before.pid, 0));
    // A fresh client connects and works while the silent ones still hang on.
    let (code, out, err) = nasctl(&n, &["status"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("— ready"), "{out}");
    drop(silent);
    assert_eq!(n.poweroff(), Some(0));
}

#[test]
fn nasctl_prints_tables_and_json() {
    let n = Nasinit::start("nasctl", vec![sh("web", "echo line-a; echo line-b; exec sleep 1000")]);
    n.wait_for("web", T, |s| s.state == "running");
    let (code, out, _) = nasctl(&n, &["services"]);
    assert_eq!(code, Some(0));
    assert!(out.starts_with("SERVICE"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("web") && l.contains("running")), "{out}");

    let (code, out, _) = nasctl(&n, &["--json", "services"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v[0]["name"], "web");
    assert_eq!(v[0]["state"], "running");

    let (_, out, _) = nasctl(&n, &["status", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["state"], "ready");

    let (_, out, _) = nasctl(&n, &["timeline"]);
    assert!(out.contains("web") && out.contains("appliance"), "{out}");
    let (_, out, _) = nasctl(&n, &["timeline", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["services"][0]["name"], "web");

    // Logs reach nasinit asynchronously; wait for both lines.
    let deadline = Instant::now() + T;
    loop {
        let (_, out, _) = nasctl(&n, &["logs", "web"]);
        if out == "line-a\nline-b\n" {
            break;
        }
        assert!(Instant::now() < deadline, "logs: {out:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (_, out, _) = nasctl(&n, &["logs", "web", "-n", "1"]);
    assert_eq!(out, "line-b\n");

    let (code, _, err) = nasctl(&n, &["restart", "nope"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("no service named `nope`"), "{err}");

    let (code, _, _) = nasctl(&n, &["poweroff"]);
    assert_eq!(code, Some(0));
}

#[test]
fn nasctl_says_clearly_when_nasinit_is_not_there() {
    let out = Command::new(nasctl_bin())
        .args(["--socket", "/nonexistent/control.sock", "status"])
        .output()
        .expect("run nasctl");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot connect to nasinit at /nonexistent/control.sock"), "{err}");
}
