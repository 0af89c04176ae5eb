//! nasos-datapath-bench: the same sequential write and read, over NFS/RDMA and over NFS/TCP,
//! between a qemu-client VM and the qemu-dev appliance on one private QEMU network; prints
//! both and their ratio. Rounds alternate transports so drift on a noisy host hits both.
//!
//!     cargo run --release -p nasos-tests --bin nasos-datapath-bench -- [MIB] [ROUNDS]
//!
//! Under TCG soft-RoCE is expected to be slower than TCP (RDMA done in software inside an
//! emulator); the figures are a measurement of this setup, not of hardware.

use std::time::Duration;

use nasos_tests::{Pair, ok, repo};

const USER: &str = "setpriv --reuid=1000 --regid=1000 --clear-groups";

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3).max(1);
    let dir = repo().join("build/bench/datapath");
    eprintln!("nasos-datapath-bench: booting the appliance and the client (TCG: a few minutes)");
    let mut pair = Pair::start(&dir);
    ok(&mut pair.nas, "install -d -o 1000 -g 1000 /export/tank/train/bench");
    // Incompressible data from the client's memory, so neither disk nor lz4 shapes the figure.
    ok(&mut pair.gpu, &format!("head -c {}M /dev/urandom > /tmp/bench.src", mib));
    let mut results: Vec<(&str, Vec<f64>, Vec<f64>)> =
        vec![("rdma", Vec::new(), Vec::new()), ("tcp", Vec::new(), Vec::new())];
    for round in 0..rounds {
        for (transport, writes, reads) in results.iter_mut() {
            let mnt = format!("/tmp/bench-{transport}");
            pair.mount(transport, &mnt);
            let file = format!("{mnt}/bench/{transport}-{round}");
            // As a user: root is squashed on the export.
            let w = rate(&ok(&mut pair.gpu, &format!("{USER} dd if=/tmp/bench.src of={file} bs=1M conv=fsync 2>&1")));
            ok(&mut pair.gpu, "sync; echo 3 > /proc/sys/vm/drop_caches");
            let r = rate(&ok(&mut pair.gpu, &format!("{USER} dd if={file} of=/dev/null bs=1M 2>&1")));
            ok(&mut pair.gpu, &format!("{USER} rm -f {file}; umount {mnt}"));
            eprintln!("round {}: {transport:<4} write {w:7.1} MB/s  read {r:7.1} MB/s", round + 1);
            writes.push(w);
            reads.push(r);
        }
    }
    let med = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (rw, rr) = (med(&results[0].1), med(&results[0].2));
    let (tw, tr) = (med(&results[1].1), med(&results[1].2));
    println!("NFS {mib} MiB sequential, median of {rounds} rounds (client VM → qemu-dev, TCG, soft-RoCE)");
    println!("transport   write MB/s   read MB/s");
    println!("rdma        {rw:10.1}   {rr:9.1}");
    println!("tcp         {tw:10.1}   {tr:9.1}");
    println!("rdma/tcp    {:9.2}×   {:8.2}×", rw / tw, rr / tr);
    let _ = pair.gpu.run("true", Duration::from_secs(5));
    pair.kill();
}

/// MB/s from dd's summary line: "67108864 bytes (67 MB, 64 MiB) copied, 3.1 s, 21.6 MB/s".
fn rate(dd: &str) -> f64 {
    let line = dd.lines().rev().find(|l| l.contains(" copied, ")).unwrap_or_else(|| panic!("no dd summary in {dd:?}"));
    let bytes: f64 = line.split_whitespace().next().and_then(|b| b.parse().ok()).expect("bytes");
    let secs: f64 = line
        .split(" copied, ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|s| s.replace(',', ".").parse().ok())
        .expect("seconds");
    bytes / secs / 1e6
}
