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
//!
//!     cargo run --release -p nasos-tests --bin nasos-boot-bench -- --icount [ROUNDS] A B
//!
//! ranks two appliance images (`nasos build recipes/qemu-dev.toml --out A`, then B from the
//! change) by the guest's own work: each gets a warm-up boot that creates its pool, then their
//! boots alternate from copies of those, with the guest's clock counting instructions
//! (`nasos_qemu::Spec::icount`), so host noise drops out (the same image repeats within ±0.1 s).
//! It does not count QEMU's emulation of the devices, and it is not the reference's ratio:
//! the side-by-side bench stays the judge of the whole.
//!
//!     cargo run --release -p nasos-tests --bin nasos-boot-bench -- --wall [ROUNDS] A B
//!
//! alternates the same two images in real time: what `--icount` leaves out (QEMU translating
//! code the guest runs for the first time, emulating its devices) is much of a TCG boot's wall
//! time, and a change can move it without moving the instruction count.

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

/// One appliance boot from a copy of the warm box `vm-{warm}`: (uptime at serving, uptime at
/// ready, the timeline). With `icount`, the times are the guest's instruction-counted ones.
fn appliance_boot(dir: &Path, warm: &str, icount: bool) -> (f64, f64, String) {
    let golden = dir.join(format!("vm-{warm}"));
    let run = dir.join("vm-run");
    let _ = std::fs::remove_dir_all(&run);
    sh(Command::new("cp").arg("-a").arg("--sparse=always").arg(&golden).arg(&run), "copying the warm box");
    // One vCPU, as the reference's QEMU has.
    let mut vm = if icount {
        nasos_tests::boot_again_icount(dir, "run", MEMORY, link(dir))
    } else {
        nasos_tests::boot_again_cpus(dir, "run", MEMORY, link(dir), 1)
    };
    vm.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("the appliance is ready");
    let status = ok(&mut vm, "nasctl status --json");
    let mut timeline = ok(&mut vm, "nasctl timeline");
    // Where the critical path's services spent their time, in their own words.
    for service in ["modules-drives", "modules", "modules-storage", "storage", "nfs"] {
        // An image from before the drives' set has none.
        if !timeline.lines().any(|l| l.split_whitespace().next() == Some(service)) {
            continue;
        }
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

/// A first boot of `image` (a `nasos build --out` folder) that creates the pool, kept as
/// `vm-{tag}` for the measured boots to start from copies of.
fn warm_up(dir: &Path, image: &Path, tag: &str) {
    eprintln!("appliance {}: warm-up boot (creates the pool the measured boots import)", image.display());
    let mut warm = nasos_tests::boot(dir, &image.join("disk.qcow2"), tag, MEMORY, link(dir), |_| {});
    warm.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("the warm-up boot");
    warm.wait_for_login(Duration::from_secs(60)).ok();
    warm.send_line("nasctl poweroff").expect("poweroff");
    warm.wait_exit(Duration::from_secs(300)).expect("the warm-up box powers off");
}

/// `--icount [ROUNDS] A B` (or `--wall`): the two images' boots alternated, timed in
/// instructions (or in real time).
fn ab(args: &[String], icount: bool) {
    let (flag, clock) = if icount { ("--icount", "virtual") } else { ("--wall", "real") };
    let (rounds, a, b) = match args {
        [r, a, b] => (r.parse::<usize>().expect("ROUNDS is a number").max(1), a, b),
        [a, b] => (3, a, b),
        _ => {
            eprintln!("usage: nasos-boot-bench {flag} [ROUNDS] A B (two `nasos build --out` folders)");
            std::process::exit(2);
        }
    };
    let dir = repo().join(if icount { "build/bench/icount" } else { "build/bench/wall" });
    std::fs::create_dir_all(&dir).expect("dir");
    // Absolute: the boots' overlays name their image as backing file.
    let absolute = |p: &String| {
        let image = std::fs::canonicalize(p).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert!(image.join("disk.qcow2").exists(), "{p}: no disk.qcow2 (build it with `nasos build … --out {p}`)");
        image
    };
    let (a, b) = (absolute(a), absolute(b));
    let images = [("A", a.as_path()), ("B", b.as_path())];
    for (tag, image) in images {
        warm_up(&dir, image, &format!("warm-{tag}"));
    }
    let mut serving: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut timelines: [Vec<(f64, String)>; 2] = [Vec::new(), Vec::new()];
    for round in 1..=rounds {
        for (i, (tag, image)) in images.iter().enumerate() {
            let (s, y, timeline) = appliance_boot(&dir, &format!("warm-{tag}"), icount);
            eprintln!(
                "round {round}/{rounds}: {tag} ({}) serving at {s:6.2} s of {clock} uptime (ready {y:.2} s)",
                image.display()
            );
            serving[i].push(s);
            timelines[i].push((s, timeline));
        }
    }
    let (ma, mb) = (median(&serving[0]), median(&serving[1]));
    for (i, (tag, image)) in images.iter().enumerate() {
        let all: Vec<String> = serving[i].iter().map(|s| format!("{s:.2}")).collect();
        println!(
            "{tag} {}: serving at {:.2} s {clock} (median; {})",
            image.display(),
            median(&serving[i]),
            all.join(", ")
        );
    }
    println!("B/A:   {:.3}x ({:+.2} s)", mb / ma, mb - ma);
    for (i, (tag, _)) in images.iter().enumerate() {
        timelines[i].sort_by(|x, y| x.0.total_cmp(&y.0));
        let t = &timelines[i][timelines[i].len() / 2].1;
        println!("\n{tag}'s timeline of the median boot ({clock} time):\n{t}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--icount") => return ab(&args[1..], true),
        Some("--wall") => return ab(&args[1..], false),
        _ => {}
    }
    let rounds: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(5).max(1);
    let dir = repo().join("build/bench/boot");
    std::fs::create_dir_all(&dir).expect("dir");
    build_binaries();
    let out = dir.join("qemu-dev");
    nasos(&["build", "recipes/qemu-dev.toml", "--out", &out.display().to_string()]);
    let img = reference::image(&dir.join("reference"));
    warm_up(&dir, &out, "warm");
    let (mut refs, mut serving, mut ready, mut timelines) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        let r = reference_boot(&dir.join("reference"), &img);
        eprintln!("round {round}/{rounds}: reference systemd serving at uptime {r:6.2} s");
        let (s, y, timeline) = appliance_boot(&dir, "warm", false);
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
