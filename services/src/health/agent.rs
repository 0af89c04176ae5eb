//! The health agent: reports pool health and capacity, and NVMe drives over the recipe's
//! temperature threshold, every check interval until SIGTERM. The hardware watchdog is not
//! here: PID 1 owns it (a health agent that dies must not reset the box; a PID 1 that hangs
//! must).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use super::{nvme_temperatures, temperature_changes};
use crate::signals::{Sig, Signals};
use crate::{notify_ready, plan, probe, say};

pub fn run() -> anyhow::Result<()> {
    let plan = plan()?;
    let signals = Signals::take(&[Sig::SIGTERM])?;
    let every = Duration::from_secs(u64::from(plan.health.check_interval_seconds.max(1)));
    let mut hot = BTreeSet::new();
    check(&plan, true, &mut hot);
    notify_ready(&format!("checking every {}s", every.as_secs()))?;
    while signals.wait(every)? != Some(Sig::SIGTERM) {
        check(&plan, false, &mut hot);
    }
    Ok(())
}

/// Pool health and fullness, drive temperatures; prints a line when something is wrong or
/// changes (and everything, at start).
fn check(plan: &nasos_board::Plan, verbose: bool, hot: &mut BTreeSet<String>) {
    let temps = nvme_temperatures(Path::new("/sys"), &plan.bays);
    if verbose {
        let read: Vec<String> = temps.iter().filter_map(|t| t.celsius.map(|c| format!("{} {c:.0}°C", t.bay))).collect();
        say(format!(
            "NVMe temperatures (warn above {}°C): {}",
            plan.health.nvme_temperature_warn_celsius,
            if read.is_empty() { "none reported".to_string() } else { read.join(", ") }
        ));
    }
    for line in temperature_changes(&temps, plan.health.nvme_temperature_warn_celsius, hot) {
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
mod agent_tests {
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
