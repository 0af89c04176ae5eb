//! `Socket` against the real kernel (which has no dcbnl-capable NIC here)
//! and against the LD_PRELOAD shim (a simulated NIC), the latter by
//! re-running this test binary with the shim preloaded.

mod common;

use std::process::Command;

use common::*;
use nasos_dcbnl::{Error, Ieee, Request, Socket, plan};

/// Opens a real socket, or says why the kernel tests cannot run at all.
fn open_or_skip() -> Option<Socket> {
    match Socket::open() {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("SKIP: cannot open a NETLINK_ROUTE socket here: {e}");
            None
        }
    }
}

#[test]
fn real_kernel_lo_is_not_supported() {
    let Some(mut s) = open_or_skip() else { return };
    let got = s.get("lo");
    assert!(matches!(got, Err(Error::NotSupported)), "get(lo) = {got:?}");
    let got = s.apply("lo", &roce_desired());
    assert!(matches!(got, Err(Error::NotSupported)), "apply(lo) = {got:?}");
}

#[test]
fn real_kernel_unknown_interface_is_no_device() {
    let Some(mut s) = open_or_skip() else { return };
    let got = s.get("nasosnodev0");
    assert!(matches!(got, Err(Error::NoDevice)), "{got:?}");
}

/// Env var selecting what `child_scenario` does when this binary is re-run
/// under the shim.
const CHILD: &str = "NASOS_DCBNL_TEST_CHILD";

/// Entry point of the re-run child. In a normal test run (variable unset)
/// it returns at once; the parent tests below assert on its exit status.
#[test]
fn child_scenario() {
    let Ok(scenario) = std::env::var(CHILD) else { return };
    let mut s = Socket::open().expect("open netlink socket");
    let desired = roce_desired();
    match scenario.as_str() {
        "apply" => {
            assert_eq!(s.get(IFNAME).expect("get"), used_nic(), "GET decodes the shim's state");
            let report = s.apply(IFNAME, &desired).expect("apply");
            assert!(report.changed());
            assert_eq!(report.before, used_nic());
            assert_eq!(report.sent, plan(&used_nic(), &desired).expect("plan"));
            assert_eq!(plan(&report.after, &desired).expect("plan"), vec![], "read-back satisfies the recipe");
            for line in report.dcb_commands(IFNAME) {
                println!("CHANGED: {line}");
            }
            let again = s.apply(IFNAME, &desired).expect("second apply");
            assert!(!again.changed(), "second apply must be a no-op: {again:?}");
        }
        "notsupported" => {
            assert!(matches!(s.get(IFNAME), Err(Error::NotSupported)));
            assert!(matches!(s.apply(IFNAME, &desired), Err(Error::NotSupported)));
        }
        "nodevice" => assert!(matches!(s.get(IFNAME), Err(Error::NoDevice))),
        "driver-refuses" => {
            let got = s.apply(IFNAME, &desired);
            assert!(matches!(got, Err(Error::Kernel { errno: libc::EINVAL })), "{got:?}");
        }
        "frozen" => {
            let got = s.apply(IFNAME, &desired);
            assert!(matches!(got, Err(Error::ReadBackMismatch(_))), "{got:?}");
        }
        other => panic!("unknown child scenario {other}"),
    }
    println!("CHILD-OK {scenario}");
}

/// Runs `child_scenario` in a fresh process with the shim preloaded.
fn run_child(scenario: &str, state: &Ieee, env: &[(&str, &str)]) -> (String, Vec<Vec<u8>>) {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "child_scenario", "--nocapture", "--test-threads=1"]).env(CHILD, scenario);
    let (out, sent) = run_with_shim(cmd, state, env);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains(&format!("CHILD-OK {scenario}")),
        "child scenario {scenario} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (stdout, sent)
}

fn apply_against_shim(framing: &[(&str, &str)]) {
    let (stdout, sent) = run_child("apply", &used_nic(), framing);
    let steps = plan(&used_nic(), &roce_desired()).expect("plan");
    // What our Socket put on the wire: GET, GET (apply's read), the plan's
    // messages, GET (read-back), GET (second apply, nothing to do).
    let mut expected = vec![Request::Get, Request::Get];
    expected.extend(steps.iter().cloned());
    expected.extend([Request::Get, Request::Get]);
    assert_same_messages("Socket::apply", &sent, &expected);
    for req in &steps {
        let line = format!("CHANGED: dcb {}", req.dcb_args(IFNAME).join(" "));
        assert!(stdout.contains(&line), "report lacks {line:?}:\n{stdout}");
    }
}

#[test]
fn socket_apply_against_shim_one_datagram_per_answer() {
    apply_against_shim(&[]);
}

/// Kernel framing: answer and ack in separate datagrams. dcb would mistake
/// a leftover ack for the next answer here; Socket reads up to each ack.
#[test]
fn socket_apply_against_shim_kernel_framing() {
    apply_against_shim(&[("NASOS_DCBNL_SHIM_SPLIT", "1")]);
}

#[test]
fn socket_maps_errors_from_the_shim() {
    let eopnotsupp = libc::EOPNOTSUPP.to_string();
    let enodev = libc::ENODEV.to_string();
    let einval = libc::EINVAL.to_string();
    run_child("notsupported", &used_nic(), &[("NASOS_DCBNL_SHIM_ERRNO", &eopnotsupp)]);
    run_child("nodevice", &used_nic(), &[("NASOS_DCBNL_SHIM_ERRNO", &enodev)]);
    let (_, sent) = run_child("driver-refuses", &used_nic(), &[("NASOS_DCBNL_SHIM_SET_STATUS", &einval)]);
    assert_eq!(sent.len(), 2, "apply stops at the first refused SET");
    run_child("frozen", &used_nic(), &[("NASOS_DCBNL_SHIM_FROZEN", "1")]);
}
