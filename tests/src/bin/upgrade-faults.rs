//! nasos-upgrade-faults: cuts the power (QEMU killed) at points spread over an upgrade's apply,
//! and during the new version's first boot before it is blessed; after every cut the box must
//! come up ready on a working version, and a retried apply must succeed. Prints each cut and the
//! counts. Every cut starts from the same v1 box (its disk, bays and EFI variables copied).
//!
//!     cargo run --release -p nasos-tests --bin nasos-upgrade-faults -- [CUTS] [FIRST_BOOT_CUTS]
//!
//! The upgrade suite (`tests/tests/e2e/upgrade.rs`) proves the refusals and the rollback once; this
//! is the large count, too slow for every CI run (each cut costs two boots under TCG).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nasos_qemu::{Link, Vm};
use nasos_tests::{build_binaries, ok, poll, repo};

const MEMORY: u32 = 2048;

fn link(dir: &Path) -> Link {
    Link { port: "roce0".into(), socket: dir.join("net.sock"), listen: true, more: Vec::new() }
}

/// Boots (again) and waits until ready; returns the VM and the version it runs, or why not.
fn up(dir: &Path, tag: &str) -> (Vm, Result<String, String>) {
    let mut vm = nasos_tests::boot_again(dir, tag, MEMORY, link(dir));
    let ready = vm.wait_for("nasinit: ready in ", Duration::from_secs(600));
    if let Err(e) = ready {
        return (vm, Err(format!("not ready: {e}")));
    }
    vm.wait_for_login(Duration::from_secs(60)).ok();
    let s = ok(&mut vm, "nasctl status");
    let v = s.split_whitespace().nth(1).unwrap_or("?").to_string();
    (vm, Ok(v))
}

fn restore(golden: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    let st = Command::new("cp").arg("-a").arg("--sparse=always").arg(golden).arg(to).status().expect("cp");
    assert!(st.success(), "copying the v1 box");
}

fn main() {
    let mut args = std::env::args().skip(1);
    let cuts: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(8).max(1);
    let boot_cuts: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let dir = repo().join("build/bench/upgrade-faults");
    std::fs::create_dir_all(&dir).expect("dir");
    build_binaries();
    let (v1, _bundle, stick) = nasos_tests::v1_and_0_2_0_stick(&dir);

    // The v1 box every cut starts from: first boot done (pool made, entry blessed), powered off.
    eprintln!("nasos-upgrade-faults: making the v1 box");
    let mut vm = nasos_tests::boot(&dir, &v1.join("disk.qcow2"), "golden", MEMORY, link(&dir), |_| {});
    vm.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("v1 ready");
    vm.wait_for_login(Duration::from_secs(60)).ok();
    poll(&mut vm, "nasctl upgrade status", "running  blessed", Duration::from_secs(120));
    vm.run("nasctl poweroff", Duration::from_secs(60)).ok();
    vm.wait_exit(Duration::from_secs(180)).expect("poweroff");
    let golden = dir.join("vm-golden");

    // How long an apply takes here, to spread the cuts over it.
    let cut_dir = dir.join("vm-cut");
    restore(&golden, &cut_dir);
    let (mut vm, v) = up(&dir, "cut");
    assert_eq!(v.as_deref(), Ok("0.1.0"));
    vm.plug_usb(&stick).expect("plug");
    let t = Instant::now();
    let (out, code) = vm.run("nasctl upgrade apply usb:", Duration::from_secs(900)).expect("apply");
    assert_eq!(code, 0, "{out}");
    let apply = t.elapsed();
    vm.kill();
    eprintln!("an uninterrupted apply takes {:.1}s", apply.as_secs_f64());

    let (mut total, mut unbootable, mut retry_failed) = (0u32, 0u32, 0u32);
    let mut report = |what: String, got: &Result<String, String>, retry: Option<bool>| {
        total += 1;
        if got.is_err() {
            unbootable += 1;
        }
        if retry == Some(false) {
            retry_failed += 1;
        }
        let retry = match retry {
            Some(true) => ", retried apply succeeded",
            Some(false) => ", RETRIED APPLY FAILED",
            None => "",
        };
        println!(
            "{what}: came up {}{retry}",
            match got {
                Ok(v) => format!("ready on {v}"),
                Err(e) => format!("UNBOOTABLE ({e})"),
            }
        );
    };
    for i in 1..=cuts {
        restore(&golden, &cut_dir);
        let (mut vm, v) = up(&dir, "cut");
        assert_eq!(v.as_deref(), Ok("0.1.0"));
        vm.plug_usb(&stick).expect("plug");
        let at = apply.mul_f64(f64::from(i) / f64::from(cuts + 1));
        vm.send_line("nasctl upgrade apply usb:").expect("apply");
        std::thread::sleep(at);
        vm.kill();
        let (mut vm, got) = up(&dir, "cut");
        let retry = match &got {
            Ok(v) if v == "0.1.0" => {
                vm.plug_usb(&stick).expect("plug");
                let (out, code) = vm.run("nasctl upgrade apply usb:", Duration::from_secs(900)).expect("apply");
                if code != 0 {
                    eprintln!("{out}");
                }
                Some(code == 0)
            }
            _ => None,
        };
        report(format!("cut {i}/{cuts} at {:.1}s into the apply", at.as_secs_f64()), &got, retry);
        vm.kill();
    }
    for i in 1..=boot_cuts {
        restore(&golden, &cut_dir);
        let (mut vm, _) = up(&dir, "cut");
        vm.plug_usb(&stick).expect("plug");
        let (out, code) = vm.run("nasctl upgrade apply usb:", Duration::from_secs(900)).expect("apply");
        assert_eq!(code, 0, "{out}");
        vm.send_line("nasctl reboot").expect("reboot");
        vm.expect_new_shell();
        vm.wait_for("nasinit: started", Duration::from_secs(300)).expect("0.2.0 starts");
        let at = Duration::from_secs(u64::from(4 + 12 * (i - 1)));
        std::thread::sleep(at);
        vm.kill();
        let (vm2, got) = up(&dir, "cut");
        report(format!("first-boot cut {i}/{boot_cuts} at {:.0}s after 0.2.0 started", at.as_secs_f64()), &got, None);
        drop(vm2);
    }
    println!("power cuts: {total}; unbootable results: {unbootable}; retried applies that failed: {retry_failed}");
}
