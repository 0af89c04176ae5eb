//! nasinit-bench: prints nasinit's resident memory, its wakeups per second while idle, and its
//! restart latency (a service's exit → its next process running) beside a reference: the same
//! child respawned by a bare fork/exec/wait loop, in the same run. Run with --release.
//!
//!     cargo run --release -p nasos-init --bin nasinit-bench

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nasos_api::{Client, ShutdownKind};
use nasos_board::Plan;
use nasos_board::plan::{Readiness, Restart, RestartPolicy, Service};

const CYCLES: usize = 300;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--crash-child") {
        return crash_child(args.get(2).context("--crash-child FILE")?);
    }
    let dir = std::env::temp_dir().join(format!("nasinit-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = bench(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The flapping service: records when it started and when it exits, then fails.
fn crash_child(file: &str) -> anyhow::Result<()> {
    let start = now_ns();
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(file)?;
    let exit = now_ns();
    writeln!(f, "{start} {exit}")?;
    std::process::exit(1);
}

fn now_ns() -> u128 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u128 * 1_000_000_000 + t.tv_nsec() as u128)
        .unwrap_or(0)
}

fn service(name: &str, command: Vec<String>, when: Restart) -> Service {
    Service {
        name: name.into(),
        command,
        after: Vec::new(),
        readiness: Readiness::Started,
        restart: RestartPolicy {
            when,
            backoff_initial_ms: 0,
            backoff_max_ms: 0,
            start_limit: u32::MAX,
            start_limit_window_ms: 1000,
        },
        stop_command: None,
        stop_timeout_ms: 2000,
        start_timeout_ms: None,
        environment: Default::default(),
        user: None,
        working_directory: None,
        boot_nice: 0,
    }
}

struct Running {
    child: Child,
    rt: tokio::runtime::Runtime,
    client: Client,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.rt.block_on(self.client.shutdown(ShutdownKind::Poweroff));
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_nasinit(dir: &Path, tag: &str, services: Vec<Service>) -> anyhow::Result<Running> {
    let exe = std::env::current_exe()?;
    let nasinit = exe.parent().context("exe dir")?.join("nasinit");
    let mut plan = Plan::empty("bench");
    plan.services = services;
    let plan_path = dir.join(format!("{tag}.json"));
    std::fs::write(&plan_path, serde_json::to_string(&plan)?)?;
    let sock = dir.join(format!("{tag}.sock"));
    let child = Command::new(&nasinit)
        .arg("--plan")
        .arg(&plan_path)
        .arg("--control")
        .arg(&sock)
        .arg("--run-dir")
        .arg(dir.join(format!("{tag}-run")))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", nasinit.display()))?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let client = loop {
        if let Ok(c) = rt.block_on(Client::connect(&sock)) {
            break c;
        }
        if Instant::now() > deadline {
            bail!("nasinit did not open its socket");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Running { child, rt, client })
}

fn proc_field(pid: u32, file: &str, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Context switches of every thread of a process: each one is a wakeup.
fn switches(pid: u32) -> u64 {
    let mut total = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let tid = t.file_name().to_string_lossy().into_owned();
        total += proc_field(pid, &format!("task/{tid}/status"), "voluntary_ctxt_switches:");
        total += proc_field(pid, &format!("task/{tid}/status"), "nonvoluntary_ctxt_switches:");
    }
    total
}

fn gaps(file: &Path) -> anyhow::Result<Vec<f64>> {
    let text = std::fs::read_to_string(file)?;
    let rows: Vec<(u128, u128)> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace().map(|x| x.parse::<u128>().ok());
            Some((it.next()??, it.next()??))
        })
        .collect();
    Ok(rows.windows(2).map(|w| (w[1].0.saturating_sub(w[0].1)) as f64 / 1e6).collect())
}

fn stats(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v.get(((v.len() as f64 - 1.0) * q) as usize).copied().unwrap_or(f64::NAN);
    (at(0.5), at(0.99))
}

fn bench(dir: &Path) -> anyhow::Result<()> {
    let exe: PathBuf = std::env::current_exe()?;
    // 1. Idle: one service running, nothing due.
    let idle =
        start_nasinit(dir, "idle", vec![service("idle", vec!["/bin/sleep".into(), "1000".into()], Restart::Always)])?;
    let pid = idle.child.id();
    std::thread::sleep(Duration::from_secs(1));
    let rss = proc_field(pid, "status", "VmRSS:");
    let hwm = proc_field(pid, "status", "VmHWM:");
    let window = Duration::from_secs(5);
    let before = switches(pid);
    std::thread::sleep(window);
    let wakeups = (switches(pid) - before) as f64 / window.as_secs_f64();
    drop(idle);

    // 2. Restart latency under nasinit.
    let stamps = dir.join("nasinit.stamps");
    let flap_cmd = vec![exe.display().to_string(), "--crash-child".into(), stamps.display().to_string()];
    let flap = start_nasinit(dir, "flap", vec![service("flap", flap_cmd.clone(), Restart::Always)])?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::read_to_string(&stamps).map(|s| s.lines().count()).unwrap_or(0) < CYCLES + 1 {
        if Instant::now() > deadline {
            bail!("flapping service did not reach {CYCLES} restarts");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(flap);
    let supervised = gaps(&stamps)?;

    // 3. Reference: the same child, respawned by a bare loop.
    let ref_stamps = dir.join("reference.stamps");
    for _ in 0..=CYCLES {
        Command::new(&flap_cmd[0]).args(["--crash-child", &ref_stamps.display().to_string()]).status()?;
    }
    let reference = gaps(&ref_stamps)?;

    let (sup_med, sup_p99) = stats(supervised[..CYCLES.min(supervised.len())].to_vec());
    let (ref_med, ref_p99) = stats(reference);
    println!("nasinit-bench ({} restart cycles)", CYCLES);
    println!("  RSS while idle          {rss} KiB (peak {hwm} KiB)");
    println!("  wakeups while idle      {wakeups:.2}/s over {}s (goal 0)", window.as_secs());
    println!("  restart latency         median {sup_med:.3} ms   p99 {sup_p99:.3} ms   (nasinit, zero backoff)");
    println!(
        "  reference respawn loop  median {ref_med:.3} ms   p99 {ref_p99:.3} ms   (fork/exec/wait, no supervisor)"
    );
    println!("  ratio nasinit/reference median {:.2}×", sup_med / ref_med);
    Ok(())
}
