//! nasos-health run: arms the board's hardware watchdog with the recipe's timeout and keeps it
//! fed while the appliance is healthy; reports pool health. On SIGTERM (an orderly shutdown) it
//! disarms the watchdog with the magic close, so poweroff is not raced by a reset.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nasos_services::{notify_ready, plan, probe, run, say};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: i32) {
    STOP.store(true, Ordering::SeqCst);
}

nix::ioctl_readwrite!(wdioc_settimeout, b'W', 6, i32);

fn main() -> ExitCode {
    nasos_services::main("health", &["run"], |_| health())
}

fn find_watchdog(identity: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir("/sys/class/watchdog").ok()?.flatten() {
        if std::fs::read_to_string(e.path().join("identity")).is_ok_and(|i| i.trim() == identity) {
            return Some(PathBuf::from("/dev").join(e.file_name()));
        }
    }
    None
}

fn health() -> anyhow::Result<()> {
    let plan = plan()?;
    let h = &plan.health;
    let action = SigAction::new(SigHandler::Handler(on_term), SaFlags::empty(), SigSet::empty());
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { sigaction(Signal::SIGTERM, &action) }.context("installing the SIGTERM handler")?;
    let Some(dev) = find_watchdog(&h.watchdog_identity) else {
        bail!(
            "no watchdog device with identity \"{}\" (driver {} not loaded?)",
            h.watchdog_identity,
            h.watchdog_driver
        );
    };
    let mut wd = File::options().write(true).open(&dev).with_context(|| format!("opening {}", dev.display()))?;
    let mut timeout = i32::try_from(h.watchdog_timeout_seconds).unwrap_or(60);
    // SAFETY: WDIOC_SETTIMEOUT reads and writes one int through the pointer.
    unsafe { wdioc_settimeout(wd.as_raw_fd(), &mut timeout) }.context("setting the watchdog timeout")?;
    say(format!("watchdog {} armed, timeout {timeout}s", dev.display()));
    let pet_every = Duration::from_secs(u64::try_from(timeout / 3).unwrap_or(1).max(1));
    let check_every = Duration::from_secs(u64::from(h.check_interval_seconds.max(1)));
    wd.write_all(b"\0")?;
    check(&plan, true);
    notify_ready(&format!("watchdog armed ({timeout}s)"))?;
    let (mut last_pet, mut last_check) = (Instant::now(), Instant::now());
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(500));
        if last_pet.elapsed() >= pet_every {
            wd.write_all(b"\0").context("feeding the watchdog")?;
            last_pet = Instant::now();
        }
        if last_check.elapsed() >= check_every {
            check(&plan, false);
            last_check = Instant::now();
        }
    }
    // Magic close: an orderly stop disarms the watchdog.
    wd.write_all(b"V")?;
    say("watchdog disarmed for an orderly shutdown");
    Ok(())
}

/// Pool health and fullness; prints a line when something is wrong (or always, at start).
fn check(plan: &nasos_board::Plan, verbose: bool) {
    if plan.pools.is_empty() || !probe("zpool", &["version"]) {
        return;
    }
    let Ok(out) = run("zpool", &["list", "-H", "-p", "-o", "name,health,capacity"]) else { return };
    for line in out.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let [name, state, cap] = f[..] else { continue };
        let cap: u32 = cap.trim_end_matches('%').parse().unwrap_or(0);
        if state != "ONLINE" || cap >= plan.health.pool_capacity_warn_percent || verbose {
            say(format!("pool {name}: {state}, {cap}% full"));
        }
    }
}
