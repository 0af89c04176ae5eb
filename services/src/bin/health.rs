//! nasos-health run: arms the board's hardware watchdog with the recipe's timeout and keeps it
//! fed while the appliance is healthy; reports pool health and capacity, and NVMe drives over the
//! recipe's temperature threshold. On SIGTERM (an orderly shutdown) it
//! disarms the watchdog with the magic close, so poweroff is not raced by a reset.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nasos_layout::paths::BAY_DIR;
use nasos_services::health;
use nasos_services::signals::{Sig, Signals};
use nasos_services::{notify_ready, plan, probe, say};

nix::ioctl_readwrite!(wdioc_settimeout, b'W', 6, i32);

fn main() -> ExitCode {
    nasos_services::main("health", &["run"], |_| health())
}

fn health() -> anyhow::Result<()> {
    let plan = plan()?;
    let h = &plan.health;
    let signals = Signals::take(&[Sig::SIGTERM])?;
    let Some(dev) = health::find_watchdog(Path::new("/sys"), &h.watchdog_identity) else {
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
    let mut hot = BTreeSet::new();
    check(&plan, true, &mut hot);
    notify_ready(&format!("watchdog armed ({timeout}s)"))?;
    let (mut next_pet, mut next_check) = (Instant::now() + pet_every, Instant::now() + check_every);
    loop {
        let due = next_pet.min(next_check).saturating_duration_since(Instant::now());
        if signals.wait(due)? == Some(Sig::SIGTERM) {
            break;
        }
        let now = Instant::now();
        if now >= next_pet {
            wd.write_all(b"\0").context("feeding the watchdog")?;
            next_pet = now + pet_every;
        }
        if now >= next_check {
            check(&plan, false, &mut hot);
            next_check = now + check_every;
        }
    }
    // Magic close: an orderly stop disarms the watchdog.
    wd.write_all(b"V")?;
    say("watchdog disarmed for an orderly shutdown");
    Ok(())
}

/// Pool health and fullness, drive temperatures; prints a line when something is wrong or
/// changes (and everything, at start).
fn check(plan: &nasos_board::Plan, verbose: bool, hot: &mut BTreeSet<String>) {
    let bays: Vec<String> = plan.bays.iter().map(|b| b.name.clone()).collect();
    let temps = health::nvme_temperatures(Path::new("/sys"), Path::new(BAY_DIR), &bays);
    if verbose {
        let read: Vec<String> = temps.iter().filter_map(|t| t.celsius.map(|c| format!("{} {c:.0}°C", t.bay))).collect();
        say(format!(
            "NVMe temperatures (warn above {}°C): {}",
            plan.health.nvme_temperature_warn_celsius,
            if read.is_empty() { "none reported".to_string() } else { read.join(", ") }
        ));
    }
    for line in health::temperature_changes(&temps, plan.health.nvme_temperature_warn_celsius, hot) {
        say(line);
    }
    if plan.pools.is_empty() || !probe("zpool", &["version"]) {
        return;
    }
    let pools = match nasos_zfs::pool_properties(&["health", "capacity"]) {
        Ok(p) => p,
        Err(e) => return say(format!("reading pool health: {e}")),
    };
    for (name, state, cap) in pool_lines(&pools) {
        if state != "ONLINE" || cap >= u64::from(plan.health.pool_capacity_warn_percent) || verbose {
            say(format!("pool {name}: {state}, {cap}% full"));
        }
    }
}

/// (name, health, capacity %) of each pool, from `zpool get -j --json-int health,capacity`.
fn pool_lines(pools: &nasos_zfs::PoolList) -> Vec<(&str, String, u64)> {
    pools
        .pools
        .values()
        .map(|p| {
            let health = p.value("health").map_or_else(|| p.state.clone(), nasos_zfs::Value::text);
            let cap = p.value("capacity").and_then(nasos_zfs::Value::as_u64).unwrap_or(0);
            (p.name.as_str(), health, cap)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::pool_lines;

    #[test]
    fn pool_health_and_capacity_come_from_zpool_json() {
        let json = include_str!("../../zfs/tests/fixtures/zpool-get.json");
        let mut pools = nasos_zfs::parse_pool_list(json).expect("fixture parses");
        assert_eq!(pool_lines(&pools), vec![("tank", "ONLINE".to_string(), 0)]);
        let tank = pools.pools.get_mut("tank").expect("tank");
        tank.properties.get_mut("capacity").expect("capacity").value = nasos_zfs::Value::Int(91);
        tank.properties.get_mut("health").expect("health").value = nasos_zfs::Value::Text("DEGRADED".into());
        assert_eq!(pool_lines(&pools), vec![("tank", "DEGRADED".to_string(), 91)]);
    }
}
