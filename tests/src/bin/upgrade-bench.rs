//! nasos-upgrade-bench: how fast `nasctl upgrade apply` writes a slot, next to a plain write of
//! the same bytes to the same slot in the same run. Each round drops the guest's caches, copies
//! the bundle from the stick to the inactive slot with `dd bs=4M conv=fsync` (the reference: what
//! any tool gets from this stick and this disk), drops the caches again and applies the bundle
//! (read, verified while streaming, written with O_DIRECT, synced). The order alternates between
//! rounds so neither side always runs first. Prints each round, both medians and their ratio.
//!
//!     cargo run --release -p nasos-tests --bin nasos-upgrade-bench -- [ROUNDS]
//!
//! The rate compared is the stream's (bytes of the slot over the time from the first byte to the
//! slot synced), not the whole apply (which also reads the slot back through dm-verity).

use std::path::Path;
use std::time::Duration;

use nasos_qemu::{Link, Vm};
use nasos_tests::{build_binaries, ok, poll, repo};

const MEMORY: u32 = 2048;

fn link(dir: &Path) -> Link {
    Link { port: "roce0".into(), socket: dir.join("net.sock"), listen: true, more: Vec::new() }
}

/// The number before `unit` on the last line that has it (`… 54.3 MB/s`, `… (41.9 MiB/s); …`).
fn rate(text: &str, unit: &str) -> Option<f64> {
    let l = text.lines().rev().find(|l| l.contains(unit))?;
    let before = l[..l.find(unit)?].trim_end();
    before.rsplit([' ', '(']).next()?.parse::<f64>().ok()
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

const DROP: &str = "sync; echo 3 > /proc/sys/vm/drop_caches";

/// The plain write: MiB/s.
fn plain(vm: &mut Vm, bundle: &str, slot: &str) -> f64 {
    ok(vm, DROP);
    let out = ok(
        vm,
        &format!(
            "mkdir -p /tmp/stick && mount -o ro -L NASOS-USB /tmp/stick && \
             dd if=/tmp/stick/{bundle} of={slot} bs=4M conv=fsync 2>&1 | tail -1; umount /tmp/stick"
        ),
    );
    // dd prints decimal megabytes.
    rate(&out, "MB/s").map(|r| r / 1.048_576).unwrap_or_else(|| panic!("no rate in dd's output: {out}"))
}

/// The apply: MiB/s of its stream.
fn apply(vm: &mut Vm) -> f64 {
    ok(vm, DROP);
    let (out, code) = vm.run("nasctl upgrade apply usb:", Duration::from_secs(900)).expect("apply");
    assert_eq!(code, 0, "{out}");
    rate(&out, "MiB/s); checking").unwrap_or_else(|| panic!("no rate in the apply's output: {out}"))
}

fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(3).max(1);
    let dir = repo().join("build/bench/upgrade-bench");
    std::fs::create_dir_all(&dir).expect("dir");
    build_binaries();
    let (v1, bundle, stick) = nasos_tests::v1_and_0_2_0_stick(&dir);
    let name = "qemu-dev-0.2.0.nasos";
    let mib = std::fs::metadata(&bundle).map(|m| m.len() >> 20).unwrap_or(0);

    eprintln!("nasos-upgrade-bench: booting qemu-dev 0.1.0");
    let _ = std::fs::remove_dir_all(dir.join("vm-bench"));
    let mut vm = nasos_tests::boot(&dir, &v1.join("disk.qcow2"), "bench", MEMORY, link(&dir), |_| {});
    vm.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("ready");
    vm.wait_for_login(Duration::from_secs(60)).ok();
    poll(&mut vm, "nasctl upgrade status", "running  blessed", Duration::from_secs(120));
    vm.plug_usb(&stick).expect("plug");
    poll(&mut vm, "blkid -L NASOS-USB || true", "/dev/", Duration::from_secs(60));
    // A first apply, not counted: it names the slot the apply picks (the inactive one, which
    // stays inactive: the box is not rebooted between rounds).
    let (out, code) = vm.run("nasctl upgrade apply usb:", Duration::from_secs(900)).expect("apply");
    assert_eq!(code, 0, "{out}");
    let slot = out
        .lines()
        .find_map(|l| Some(l.split_once("on slot ")?.1.split_once('(')?.1.split_once(')')?.0.to_string()))
        .unwrap_or_else(|| panic!("which slot? {out}"));
    eprintln!("nasos-upgrade-bench: the inactive slot is {slot}");
    let slot = slot.as_str();

    let (mut plains, mut applies) = (Vec::new(), Vec::new());
    for r in 1..=rounds {
        let (p, a) = if r % 2 == 1 {
            let p = plain(&mut vm, name, slot);
            (p, apply(&mut vm))
        } else {
            let a = apply(&mut vm);
            (plain(&mut vm, name, slot), a)
        };
        println!("round {r}/{rounds}: plain dd {p:6.1} MiB/s   apply {a:6.1} MiB/s   {:.2}x", a / p);
        plains.push(p);
        applies.push(a);
    }
    let (p, a) = (median(&plains), median(&applies));
    println!(
        "{mib} MiB bundle to the inactive slot, median of {rounds}: plain dd {p:.1} MiB/s, apply {a:.1} MiB/s: \
         apply / plain write {:.2}x (goal ≥ 0.90x)",
        a / p
    );
    vm.kill();
}
