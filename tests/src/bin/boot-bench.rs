//! nasos-boot-bench: time to serving, side by side with a stock Debian trixie + systemd box.
//!
//!     cargo run --release -p nasos-tests --bin nasos-boot-bench -- [ROUNDS]
//!
//! The reference is [`nasos_tests::reference`]: the stock systemd box that
//! `../shared/bench/reference-systemd/README.md` describes, built once and cached. Rounds alternate a reference boot and an appliance boot (qemu-dev, importing the
//! pool a warm-up boot created), same QEMU flags (TCG, 1 vCPU, 2 GiB, q35, OVMF, 12 NVMe), every
//! boot from the same disks (snapshots/copies). Serving = pool imported and nfsd listening on tcp
//! 2049 and rdma 20049, as uptime (from the kernel's start): the reference's probe unit prints it;
//! for the appliance it is the kernel's time plus the nfs service's ready time in nasinit's
//! timeline. Prints every boot, both medians, the ratio, and the appliance's median timeline.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use nasos_qemu::Link;
use nasos_tests::reference::{self, MEMORY, sh};
use nasos_tests::{build_binaries, nasos, ok, repo};

/// One reference boot: uptime at serving.
fn reference_boot(dir: &Path, img: &Path) -> f64 {
    let mut vm = reference::vm(dir, img, true, false, "");
    let line = vm.wait_for("REFSYS-SERVING uptime=", Duration::from_secs(600)).expect("the reference serves");
    vm.kill();
    line.rsplit('=').next().and_then(|s| s.trim().parse().ok()).expect("uptime")
}

fn link(dir: &Path) -> Link {
    Link { port: "roce0".into(), socket: dir.join("net.sock"), listen: true, more: Vec::new() }
}

/// One appliance boot from a copy of the warm box: (uptime at serving, uptime at ready, the
/// timeline).
fn appliance_boot(dir: &Path) -> (f64, f64, String) {
    let golden = dir.join("vm-warm");
    let run = dir.join("vm-run");
    let _ = std::fs::remove_dir_all(&run);
    sh(Command::new("cp").arg("-a").arg("--sparse=always").arg(&golden).arg(&run), "copying the warm box");
    // One vCPU, as the reference's QEMU has.
    let mut vm = nasos_tests::boot_again_cpus(dir, "run", MEMORY, link(dir), 1);
    vm.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("the appliance is ready");
    let status = ok(&mut vm, "nasctl status --json");
    let mut timeline = ok(&mut vm, "nasctl timeline");
    // Where the critical path's services spent their time, in their own words.
    for service in ["modules", "modules-storage", "storage", "nfs"] {
        timeline.push_str(&format!("\n{service}:\n{}", ok(&mut vm, &format!("nasctl logs {service} | tail -n 25"))));
    }
    vm.kill();
    let status = nasos_tests::console_json(&status);
    let kernel = status["kernel_ms"].as_f64().expect("kernel_ms") / 1000.0;
    let ready = status["ready_ms"].as_f64().expect("ready_ms") / 1000.0;
    let nfs = timeline
        .lines()
        .find(|l| l.split_whitespace().next() == Some("nfs"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|s| s.trim_end_matches('s').parse::<f64>().ok())
        .expect("nfs's ready time in the timeline");
    (kernel + nfs, kernel + ready, timeline)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(5).max(1);
    let dir = repo().join("build/bench/boot");
    std::fs::create_dir_all(&dir).expect("dir");
    build_binaries();
    let out = dir.join("qemu-dev");
    nasos(&["build", "recipes/qemu-dev.toml", "--out", &out.display().to_string()]);
    let img = reference::image(&dir.join("reference"));
    eprintln!("appliance: warm-up boot (creates the pool the measured boots import)");
    let mut warm = nasos_tests::boot(&dir, &out.join("disk.qcow2"), "warm", MEMORY, link(&dir), |_| {});
    warm.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("the warm-up boot");
    warm.wait_for_login(Duration::from_secs(60)).ok();
    warm.send_line("nasctl poweroff").expect("poweroff");
    warm.wait_exit(Duration::from_secs(300)).expect("the warm-up box powers off");
    let (mut refs, mut serving, mut ready, mut timelines) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        let r = reference_boot(&dir.join("reference"), &img);
        eprintln!("round {round}/{rounds}: reference systemd serving at uptime {r:6.2} s");
        let (s, y, timeline) = appliance_boot(&dir);
        eprintln!("round {round}/{rounds}: nasos qemu-dev   serving at uptime {s:6.2} s (ready {y:.2} s)");
        refs.push(r);
        serving.push(s);
        ready.push(y);
        timelines.push((s, timeline));
    }
    let (r, s) = (median(&refs), median(&serving));
    timelines.sort_by(|a, b| a.0.total_cmp(&b.0));
    println!("reference systemd: serving at uptime {r:.2} s (median of {rounds})");
    println!("nasos qemu-dev:    serving at uptime {s:.2} s (median of {rounds}; ready {:.2} s)", median(&ready));
    println!("ratio:             {:.2}x", s / r);
    println!("\nnasos timeline of the median boot:\n{}", timelines[timelines.len() / 2].1);
}
