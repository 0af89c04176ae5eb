//! What an observation means: a list of checks, each with a stable id, a severity and a
//! message that names the bay, pool, link, port or service. Pure: the agent feeds it what it
//! read, the tests feed it what they made.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use nasos_board::plan::HealthPlan;

use super::observe::{Observation, RdmaObs};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Ok,
    Warning,
    Critical,
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Severity::Ok => "ok",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// Stable: `bay.BAY07.present`, `pool.tank.state`, `link.data0.state`…
    pub id: String,
    pub severity: Severity,
    pub message: String,
}

/// Which RoCE hw_counters mean a lossy or congested fabric, across drivers: soft-RoCE (rxe),
/// mlx5 and irdma names. Any of them growing between two rounds is worth a warning.
pub const LOSS_COUNTERS: &[&str] = &[
    // rxe
    "rcvd_seq_err",
    "out_of_seq_request",
    "retry_exceeded_err",
    "duplicate_request",
    // mlx5
    "out_of_sequence",
    "packet_seq_err",
    "local_ack_timeout_err",
    "np_cnp_sent",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
    // irdma
    "RxECNMrkd",
    "cnpSent",
    "cnpHandled",
];

/// Limits the checks use, from the plan.
#[derive(Debug, Clone)]
pub struct Limits {
    pub nvme_celsius: u32,
    pub spare_percent: u32,
    pub wear_percent: u32,
    pub cpu_celsius: u32,
    pub capacity_percent: u32,
    pub tenant_quota_percent: u32,
}

impl From<&HealthPlan> for Limits {
    fn from(h: &HealthPlan) -> Limits {
        Limits {
            nvme_celsius: h.nvme_temperature_warn_celsius,
            spare_percent: h.nvme_spare_warn_percent,
            wear_percent: h.nvme_wear_warn_percent,
            cpu_celsius: h.cpu_temperature_warn_celsius,
            capacity_percent: h.pool_capacity_warn_percent,
            tenant_quota_percent: h.tenant_quota_warn_percent,
        }
    }
}

/// Every check for `now`; `before` is the previous round (for counters that must not grow).
/// `members` are the bays the plan puts in pools (a missing one of those is an alert; an empty
/// bay nobody uses is not).
pub fn evaluate(
    limits: &Limits,
    members: &[(String, String)],
    now: &Observation,
    before: Option<&Observation>,
) -> Vec<Check> {
    let mut out = Vec::new();
    let mut put = |id: String, severity: Severity, message: String| out.push(Check { id, severity, message });
    use Severity::*;

    for b in &now.bays {
        let pool = members.iter().find(|(bay, _)| *bay == b.bay).map(|(_, p)| p.as_str());
        let id = format!("bay.{}.present", b.bay);
        match (&b.device, pool) {
            (None, Some(pool)) => put(id, Critical, format!("{}: drive missing (a member of pool {pool})", b.bay)),
            (None, None) => {}
            (Some(dev), _) => put(id, Ok, format!("{}: drive present ({dev})", b.bay)),
        }
        let Some(smart) = &b.smart else { continue };
        let smart = match smart {
            Result::Ok(s) => s,
            Err(e) => {
                put(format!("bay.{}.smart", b.bay), Warning, format!("{}: {e}", b.bay));
                continue;
            }
        };
        put(format!("bay.{}.smart", b.bay), Ok, format!("{}: SMART log read", b.bay));
        let warnings = smart.warnings();
        put(
            format!("bay.{}.critical_warning", b.bay),
            if warnings.is_empty() { Ok } else { Critical },
            if warnings.is_empty() {
                format!("{}: no NVMe critical warning", b.bay)
            } else {
                format!("{}: NVMe critical warning: {}", b.bay, warnings.join(", "))
            },
        );
        if let Some(c) = smart.celsius() {
            let hot = c > f64::from(limits.nvme_celsius);
            put(
                format!("bay.{}.temperature", b.bay),
                if hot { Warning } else { Ok },
                format!(
                    "{}: NVMe drive at {c:.0}°C ({} the {}°C threshold)",
                    b.bay,
                    if hot { "above" } else { "under" },
                    limits.nvme_celsius
                ),
            );
        }
        if smart.reports_spare() {
            let low = u32::from(smart.avail_spare) < limits.spare_percent;
            put(
                format!("bay.{}.spare", b.bay),
                if low { Warning } else { Ok },
                format!("{}: {}% spare left (warn under {}%)", b.bay, smart.avail_spare, limits.spare_percent),
            );
        }
        let worn = u32::from(smart.percent_used) >= limits.wear_percent;
        put(
            format!("bay.{}.wear", b.bay),
            if worn { Warning } else { Ok },
            format!(
                "{}: {}% of its rated endurance used (warn at {}%)",
                b.bay, smart.percent_used, limits.wear_percent
            ),
        );
        put(
            format!("bay.{}.media_errors", b.bay),
            if smart.media_errors > 0 { Warning } else { Ok },
            format!("{}: {} media errors", b.bay, smart.media_errors),
        );
    }

    match &now.pools {
        Err(e) => put("zfs".into(), Critical, format!("cannot read the pools: {e}")),
        Result::Ok(pools) => {
            for p in pools {
                let severity = match p.state.as_str() {
                    "ONLINE" => Ok,
                    "DEGRADED" => Warning,
                    _ => Critical,
                };
                let mut message = format!("pool {}: {}", p.name, p.state);
                let bad: Vec<String> = p
                    .members
                    .iter()
                    .filter(|m| m.state != "ONLINE" && m.group != "spare")
                    .map(|m| format!("{} {} in {}", m.disk, m.state, m.group))
                    .collect();
                // A hot spare at work, named once (it is listed in its vdev and among the spares).
                let mut spares: Vec<String> = p
                    .members
                    .iter()
                    .filter(|m| m.group != "spare")
                    .filter_map(|m| m.spare_for.as_ref().map(|d| format!("hot spare {} in for {d}", m.disk)))
                    .collect();
                spares.dedup();
                if !bad.is_empty() || !spares.is_empty() {
                    message.push_str(&format!(" ({})", bad.into_iter().chain(spares).collect::<Vec<_>>().join(", ")));
                }
                if let Some((what, pct)) = &p.scan {
                    message.push_str(&format!("; {what} {pct:.0}% done"));
                }
                put(format!("pool.{}.state", p.name), severity, message);
                let errors: Vec<String> = p
                    .members
                    .iter()
                    .filter(|m| m.errors > 0)
                    .map(|m| {
                        format!(
                            "{}: {} read, {} write, {} checksum",
                            m.disk, m.read_errors, m.write_errors, m.checksum_errors
                        )
                    })
                    .collect();
                put(
                    format!("pool.{}.errors", p.name),
                    if errors.is_empty() { Ok } else { Warning },
                    if errors.is_empty() {
                        format!("pool {}: no I/O errors", p.name)
                    } else {
                        format!("pool {}: I/O errors on {}", p.name, errors.join("; "))
                    },
                );
                let full = p.capacity_percent >= u64::from(limits.capacity_percent);
                put(
                    format!("pool.{}.capacity", p.name),
                    if full { Warning } else { Ok },
                    format!("pool {}: {}% full (warn at {}%)", p.name, p.capacity_percent, limits.capacity_percent),
                );
            }
        }
    }

    // A tenant near its quota is about to see its writes fail while the pool has room: the
    // operator hears of it before the team does.
    for t in &now.tenants {
        let (Some(pct), Some(used), Some(quota)) = (t.percent(), t.used, t.quota) else { continue };
        let near = pct >= f64::from(limits.tenant_quota_percent);
        put(
            format!("tenant.{}.quota", t.name),
            if near { Warning } else { Ok },
            format!(
                "tenant {}: {pct:.0}% of its quota used ({} of {} on {}; warn at {}%)",
                t.name,
                nasos_board::units::human_size(used),
                nasos_board::units::human_size(quota),
                t.dataset,
                limits.tenant_quota_percent
            ),
        );
    }

    for l in &now.links {
        let up = l.operstate == "up";
        put(
            format!("link.{}.state", l.name),
            if up { Ok } else { Critical },
            format!("link {}: {}", l.name, l.operstate),
        );
        if let Some(speed) = l.speed_mbps {
            let slow = speed < u64::from(l.expected_mbps);
            put(
                format!("link.{}.speed", l.name),
                if slow { Warning } else { Ok },
                format!("link {}: {speed} Mb/s (port is {} Mb/s)", l.name, l.expected_mbps),
            );
        }
    }

    for r in &now.rdma {
        let name = format!("{}/{}", r.device, r.port);
        put(
            format!("rdma.{name}.state"),
            if r.state == "ACTIVE" { Ok } else { Critical },
            format!("RDMA port {name} on {}: {}", r.link, r.state),
        );
        let prev: Option<&RdmaObs> =
            before.and_then(|b| b.rdma.iter().find(|p| p.device == r.device && p.port == r.port));
        let grown: Vec<String> = LOSS_COUNTERS
            .iter()
            .filter_map(|c| {
                let now = *r.counters.get(*c)?;
                let was = prev.and_then(|p| p.counters.get(*c)).copied().unwrap_or(now);
                (now > was).then(|| format!("{c} +{}", now - was))
            })
            .collect();
        put(
            format!("rdma.{name}.loss"),
            if grown.is_empty() { Ok } else { Warning },
            if grown.is_empty() {
                format!("RDMA port {name}: no retransmits or congestion since the last check")
            } else {
                format!("RDMA port {name}: the fabric is dropping or congesting: {}", grown.join(", "))
            },
        );
    }

    if let Some(n) = &now.nfs {
        let has = |t: &str, port: u16| n.listeners.iter().any(|l| l.transport == t && l.port == port);
        let mut missing = Vec::new();
        if !has("tcp", 2049) {
            missing.push("tcp 2049");
        }
        if n.want_rdma && !has("rdma", 20049) {
            missing.push("rdma 20049");
        }
        put(
            "nfs.listeners".into(),
            if missing.is_empty() { Ok } else { Critical },
            if missing.is_empty() {
                format!(
                    "NFS listening on tcp 2049{} with {} threads",
                    if n.want_rdma { " and rdma 20049" } else { "" },
                    n.threads
                )
            } else {
                format!("NFS is not listening on {}", missing.join(" nor "))
            },
        );
    }

    match &now.services {
        Err(e) => put("services".into(), Warning, format!("nasinit did not answer: {e}")),
        Result::Ok(list) => {
            for s in list {
                let was = before
                    .and_then(|b| b.services.as_ref().ok())
                    .and_then(|l| l.iter().find(|p| p.name == s.name))
                    .map_or(s.restarts, |p| p.restarts);
                let (severity, message) = if s.state == "failed" {
                    (Critical, format!("service {}: failed", s.name))
                } else if s.restarts > was {
                    (
                        Warning,
                        format!(
                            "service {}: restarted {} times since the last check ({} in all)",
                            s.name,
                            s.restarts - was,
                            s.restarts
                        ),
                    )
                } else {
                    (Ok, format!("service {}: {}", s.name, s.state))
                };
                put(format!("service.{}", s.name), severity, message);
            }
        }
    }

    if let Some(c) = now.cpu_celsius {
        let hot = c > f64::from(limits.cpu_celsius);
        put(
            "cpu.temperature".into(),
            if hot { Warning } else { Ok },
            format!("CPU at {c:.0}°C ({} the {}°C threshold)", if hot { "above" } else { "under" }, limits.cpu_celsius),
        );
    }
    if let Some((ce, ue)) = now.ecc {
        let ce_before = before.and_then(|b| b.ecc).map_or(ce, |(c, _)| c);
        let (severity, message) = if ue > 0 {
            (Critical, format!("memory: {ue} uncorrected ECC errors"))
        } else if ce > ce_before {
            (Warning, format!("memory: {} corrected ECC errors since the last check ({ce} in all)", ce - ce_before))
        } else {
            (Ok, format!("memory: {ce} corrected ECC errors, none uncorrected"))
        };
        put("memory.ecc".into(), severity, message);
    }
    for r in &now.replication {
        let id = format!("replication.{}.{}", r.dataset, r.peer);
        let err = r.last_error.as_ref().map(|e| format!("; last error: {e}")).unwrap_or_default();
        let limit = crate::snapshots::human_span(r.alert_after_seconds);
        let (severity, message) = match r.lag_seconds {
            Some(lag) if lag > r.alert_after_seconds => (
                Warning,
                format!(
                    "replication {} → {}: {} behind (alert after {limit}){err}",
                    r.dataset,
                    r.peer,
                    crate::snapshots::human_span(lag)
                ),
            ),
            Some(lag) => {
                (Ok, format!("replication {} → {}: {} behind", r.dataset, r.peer, crate::snapshots::human_span(lag)))
            }
            None if r.trying_seconds > r.alert_after_seconds => (
                Warning,
                format!(
                    "replication {} → {}: nothing sent in {}{err}",
                    r.dataset,
                    r.peer,
                    crate::snapshots::human_span(r.trying_seconds)
                ),
            ),
            None => (Ok, format!("replication {} → {}: first send pending", r.dataset, r.peer)),
        };
        put(id, severity, message);
    }
    out
}

/// The checks after a pass that read only the bays again (a hot-plug event between rounds):
/// the bays' checks from `fresh`, every other one as the last full round left it. Taking the
/// others from `fresh` would judge stale counters (an RDMA loss warning would clear and come
/// back on the next round) — so they are not re-judged until the next round reads them.
pub fn with_fresh_bays(last: &BTreeMap<String, Check>, fresh: Vec<Check>) -> Vec<Check> {
    let is_bay = |id: &str| id.starts_with("bay.");
    let mut out: Vec<Check> = last.values().filter(|c| !is_bay(&c.id)).cloned().collect();
    out.extend(fresh.into_iter().filter(|c| is_bay(&c.id)));
    out
}

/// The conditions only a reset can fix, as (check id, message): no NFS listener left and the nfs
/// service failed (its restarts used up), or a pool suspended. A degraded pool, a missing drive
/// or a hot one never is: a reset would only take the box away from its clients.
pub fn fatal(now: &Observation) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(n) = &now.nfs {
        let listening = n
            .listeners
            .iter()
            .any(|l| (l.transport == "tcp" && l.port == 2049) || (l.transport == "rdma" && l.port == 20049));
        let failed = now
            .services
            .as_ref()
            .ok()
            .and_then(|l| l.iter().find(|s| s.name == "nfs"))
            .is_some_and(|s| s.state == "failed");
        if !listening && failed {
            out.push((
                "nfs.listeners".to_string(),
                "NFS serves nothing: no listener on tcp 2049 or rdma 20049, and the nfs service failed".to_string(),
            ));
        }
    }
    if let Ok(pools) = &now.pools {
        for p in pools.iter().filter(|p| p.state == "SUSPENDED") {
            out.push((
                format!("pool.{}.state", p.name),
                format!("pool {} is SUSPENDED: ZFS stopped all I/O to it", p.name),
            ));
        }
    }
    out
}

/// The bays the plan puts in pools, with their pool: (bay, pool).
pub fn pool_members(plan: &nasos_board::Plan) -> Vec<(String, String)> {
    plan.pools.iter().flat_map(|p| p.member_bays().map(|b| (b.clone(), p.name.clone()))).collect()
}

#[cfg(test)]
mod tests {
    use super::super::observe::*;
    use super::super::smart::SmartLog;
    use super::*;

    fn limits() -> Limits {
        Limits {
            nvme_celsius: 70,
            spare_percent: 10,
            wear_percent: 90,
            cpu_celsius: 90,
            capacity_percent: 80,
            tenant_quota_percent: 90,
        }
    }

    fn smart(cw: u8, kelvin: u16) -> SmartLog {
        SmartLog {
            critical_warning: cw,
            temperature_kelvin: kelvin,
            avail_spare: 100,
            spare_thresh: 10,
            percent_used: 3,
            data_units_read: 0,
            data_units_written: 0,
            power_on_hours: 0,
            unsafe_shutdowns: 0,
            media_errors: 0,
            num_err_log_entries: 0,
        }
    }

    fn obs() -> Observation {
        Observation {
            bays: vec![
                BayObs { bay: "BAY01".into(), device: Some("nvme0n1".into()), smart: Some(Ok(smart(0, 320))) },
                BayObs { bay: "BAY02".into(), device: None, smart: None },
                BayObs { bay: "BAY03".into(), device: None, smart: None },
            ],
            pools: Ok(vec![PoolObs {
                name: "tank".into(),
                state: "ONLINE".into(),
                capacity_percent: 12,
                size_bytes: 0,
                allocated_bytes: 0,
                members: vec![],
                scan: None,
            }]),
            links: vec![LinkObs {
                name: "data0".into(),
                operstate: "up".into(),
                speed_mbps: None,
                expected_mbps: 25_000,
                rx_bytes: 0,
                tx_bytes: 0,
            }],
            rdma: vec![RdmaObs {
                device: "rxe0".into(),
                port: 1,
                link: "data0".into(),
                state: "ACTIVE".into(),
                counters: [("rcvd_seq_err".to_string(), 4), ("rdma_sends".to_string(), 900)].into(),
            }],
            nfs: Some(NfsObs {
                listeners: vec![
                    crate::nfsd::Listener { transport: "tcp".into(), port: 2049 },
                    crate::nfsd::Listener { transport: "rdma".into(), port: 20049 },
                ],
                threads: 8,
                want_rdma: true,
                read_bytes: 0,
                written_bytes: 0,
                rpc_calls: 0,
            }),
            services: Ok(vec![ServiceObs { name: "nfs".into(), state: "running".into(), restarts: 0 }]),
            cpu_celsius: None,
            replication: Vec::new(),
            tenants: Vec::new(),
            ecc: None,
        }
    }

    fn sev<'a>(checks: &'a [Check], id: &str) -> Option<(&'a Severity, &'a str)> {
        checks.iter().find(|c| c.id == id).map(|c| (&c.severity, c.message.as_str()))
    }

    #[test]
    fn a_healthy_box_has_only_ok_checks_and_an_unused_empty_bay_says_nothing() {
        let members = vec![("BAY01".to_string(), "tank".to_string()), ("BAY02".to_string(), "tank".to_string())];
        let mut o = obs();
        o.bays[1].device = Some("nvme1n1".into());
        o.bays[1].smart = Some(Ok(smart(0, 300)));
        let checks = evaluate(&limits(), &members, &o, Some(&o));
        assert!(checks.iter().all(|c| c.severity == Severity::Ok), "{checks:#?}");
        assert!(sev(&checks, "bay.BAY03.present").is_none(), "BAY03 is in no pool");
        assert!(sev(&checks, "link.data0.speed").is_none(), "virtio reports no speed");
        assert!(sev(&checks, "cpu.temperature").is_none() && sev(&checks, "memory.ecc").is_none());
    }

    #[test]
    fn a_missing_member_a_critical_warning_and_a_hot_drive_are_named_by_bay() {
        let members = vec![("BAY01".to_string(), "tank".to_string()), ("BAY02".to_string(), "tank".to_string())];
        let mut o = obs();
        o.bays[0].smart = Some(Ok(smart(0b110, 273 + 75)));
        let checks = evaluate(&limits(), &members, &o, None);
        assert_eq!(
            sev(&checks, "bay.BAY02.present"),
            Some((&Severity::Critical, "BAY02: drive missing (a member of pool tank)"))
        );
        let (s, m) = sev(&checks, "bay.BAY01.critical_warning").expect("checked");
        assert_eq!(*s, Severity::Critical);
        assert!(m.starts_with("BAY01: ") && m.contains("temperature") && m.contains("reliability degraded"), "{m}");
        assert_eq!(sev(&checks, "bay.BAY01.temperature").map(|c| *c.0), Some(Severity::Warning));
    }

    #[test]
    fn a_pass_over_the_bays_alone_alerts_the_pulled_bay_and_rejudges_nothing_else() {
        let members = vec![("BAY01".to_string(), "tank".to_string())];
        // The last full round saw the fabric lose packets (a counter that grew since the one before).
        let older = obs();
        let mut last_obs = obs();
        last_obs.rdma[0].counters.insert("rcvd_seq_err".into(), 9);
        let last: BTreeMap<String, Check> =
            evaluate(&limits(), &members, &last_obs, Some(&older)).into_iter().map(|c| (c.id.clone(), c)).collect();
        assert_eq!(last["rdma.rxe0/1.loss"].severity, Severity::Warning);
        assert_eq!(last["bay.BAY01.present"].severity, Severity::Ok);
        // Then BAY01 goes; only the bays are read again, the rest is the last round's.
        let mut quick = last_obs.clone();
        quick.bays[0].device = None;
        quick.bays[0].smart = None;
        let fresh = evaluate(&limits(), &members, &quick, Some(&last_obs));
        // Judged whole, the stale counters would clear the loss warning (to come back next round).
        assert_eq!(sev(&fresh, "rdma.rxe0/1.loss").map(|c| *c.0), Some(Severity::Ok));
        let merged = with_fresh_bays(&last, fresh);
        let alerts = crate::health::alerts::transitions(&last, &merged, 0);
        let ids: Vec<&str> = alerts.iter().map(|a| a.id.as_str()).collect();
        assert!(ids.contains(&"bay.BAY01.present"), "{alerts:?}");
        assert!(ids.iter().all(|id| id.starts_with("bay.BAY01.")), "{alerts:?}");
        assert_eq!(sev(&merged, "rdma.rxe0/1.loss").map(|c| *c.0), Some(Severity::Warning));
        assert_eq!(
            sev(&merged, "bay.BAY01.present"),
            Some((&Severity::Critical, "BAY01: drive missing (a member of pool tank)"))
        );
    }

    #[test]
    fn only_what_a_reset_can_fix_is_fatal() {
        let mut o = obs();
        assert!(fatal(&o).is_empty());
        // A degraded pool with a pulled drive: never fatal.
        if let Ok(p) = &mut o.pools {
            p[0].state = "DEGRADED".into();
        }
        o.bays[0].device = None;
        assert!(fatal(&o).is_empty());
        // Listeners gone while nfs restarts: not yet.
        o.nfs.as_mut().expect("nfs").listeners.clear();
        assert!(fatal(&o).is_empty(), "nfs may still come back");
        o.services = Ok(vec![ServiceObs { name: "nfs".into(), state: "failed".into(), restarts: 5 }]);
        assert_eq!(fatal(&o).iter().map(|f| f.0.as_str()).collect::<Vec<_>>(), vec!["nfs.listeners"]);
        // An operator's stop is not a failure.
        o.services = Ok(vec![ServiceObs { name: "nfs".into(), state: "stopped".into(), restarts: 0 }]);
        assert!(fatal(&o).is_empty());
        if let Ok(p) = &mut o.pools {
            p[0].state = "SUSPENDED".into();
        }
        assert_eq!(fatal(&o).iter().map(|f| f.0.as_str()).collect::<Vec<_>>(), vec!["pool.tank.state"]);
    }

    #[test]
    fn pools_links_ports_listeners_and_services_each_have_their_severity() {
        let members = vec![];
        let before = obs();
        let mut o = obs();
        if let Ok(pools) = &mut o.pools {
            pools[0].state = "DEGRADED".into();
            pools[0].capacity_percent = 85;
            let member = |disk: &str, group: &str, state: &str, spare_for: Option<&str>| MemberObs {
                disk: disk.into(),
                group: group.into(),
                state: state.into(),
                errors: 0,
                read_errors: 0,
                write_errors: 0,
                checksum_errors: 0,
                spare_for: spare_for.map(String::from),
            };
            pools[0].members = vec![
                MemberObs { errors: 2, write_errors: 2, ..member("BAY07", "raidz2-1", "REMOVED", None) },
                member("BAY11", "raidz2-1", "ONLINE", Some("BAY07")),
                member("BAY11", "spare", "INUSE", Some("BAY07")),
                member("BAY12", "spare", "AVAIL", None),
            ];
            pools[0].scan = Some(("resilver".into(), 40.0));
        }
        o.links[0].operstate = "down".into();
        o.links[0].speed_mbps = Some(10_000);
        o.rdma[0].state = "DOWN".into();
        o.rdma[0].counters.insert("rcvd_seq_err".into(), 9);
        o.nfs.as_mut().expect("nfs").listeners.retain(|l| l.transport == "tcp");
        o.services = Ok(vec![ServiceObs { name: "nfs".into(), state: "running".into(), restarts: 3 }]);
        o.ecc = Some((0, 1));
        let checks = evaluate(&limits(), &members, &o, Some(&before));
        assert_eq!(
            sev(&checks, "pool.tank.state"),
            Some((
                &Severity::Warning,
                "pool tank: DEGRADED (BAY07 REMOVED in raidz2-1, hot spare BAY11 in for BAY07); resilver 40% done"
            ))
        );
        assert_eq!(sev(&checks, "pool.tank.errors").map(|c| *c.0), Some(Severity::Warning));
        assert_eq!(sev(&checks, "pool.tank.capacity").map(|c| *c.0), Some(Severity::Warning));
        assert_eq!(sev(&checks, "link.data0.state").map(|c| *c.0), Some(Severity::Critical));
        assert_eq!(sev(&checks, "link.data0.speed").map(|c| *c.0), Some(Severity::Warning));
        assert_eq!(sev(&checks, "rdma.rxe0/1.state").map(|c| *c.0), Some(Severity::Critical));
        assert_eq!(
            sev(&checks, "rdma.rxe0/1.loss"),
            Some((&Severity::Warning, "RDMA port rxe0/1: the fabric is dropping or congesting: rcvd_seq_err +5"))
        );
        assert_eq!(sev(&checks, "nfs.listeners"), Some((&Severity::Critical, "NFS is not listening on rdma 20049")));
        assert_eq!(sev(&checks, "service.nfs").map(|c| *c.0), Some(Severity::Warning));
        assert_eq!(sev(&checks, "memory.ecc").map(|c| *c.0), Some(Severity::Critical));
        // Without a previous round, counters are a baseline, not an alarm.
        let first = evaluate(&limits(), &members, &o, None);
        assert_eq!(sev(&first, "rdma.rxe0/1.loss").map(|c| *c.0), Some(Severity::Ok));
    }

    #[test]
    fn replication_lag_past_its_threshold_is_a_warning_that_names_the_last_error() {
        let job = |lag: Option<u64>, trying: u64, err: Option<&str>| super::super::observe::ReplicationObs {
            dataset: "tank/train".into(),
            peer: "dr".into(),
            lag_seconds: lag,
            trying_seconds: trying,
            alert_after_seconds: 180,
            last_error: err.map(String::from),
            total_bytes: 0,
        };
        let run = |r| {
            let mut o = obs();
            o.replication = vec![r];
            evaluate(&limits(), &[], &o, None)
        };
        let c = run(job(Some(60), 0, None));
        assert_eq!(
            sev(&c, "replication.tank/train.dr"),
            Some((&Severity::Ok, "replication tank/train → dr: 1m behind"))
        );
        let c = run(job(Some(420), 0, Some("`state tank/train` on 10.77.0.2: connection timed out")));
        let (s, m) = sev(&c, "replication.tank/train.dr").expect("check");
        assert_eq!(*s, Severity::Warning);
        assert!(m.contains("7m behind (alert after 3m); last error: `state tank/train`"), "{m}");
        let c = run(job(None, 60, Some("unreachable")));
        assert_eq!(sev(&c, "replication.tank/train.dr").map(|x| *x.0), Some(Severity::Ok), "not yet late");
        let c = run(job(None, 600, Some("unreachable")));
        let (s, m) = sev(&c, "replication.tank/train.dr").expect("check");
        assert_eq!(
            (*s, m),
            (Severity::Warning, "replication tank/train → dr: nothing sent in 10m; last error: unreachable")
        );
    }

    #[test]
    fn a_tenant_near_its_quota_is_a_warning_and_one_without_a_quota_is_not_checked() {
        let tenant = |name: &str, used: u64, quota: Option<u64>| crate::inspect::TenantView {
            name: name.into(),
            dataset: format!("tank/teams/{name}"),
            networks: vec![],
            used: Some(used),
            quota,
            available: None,
            reservation: None,
            exports: vec![],
            squash: "root".into(),
        };
        let mut o = obs();
        o.tenants = vec![
            tenant("vision", 60 << 20, Some(64 << 20)),
            tenant("speech", 10 << 20, Some(256 << 20)),
            tenant("free", 1 << 30, None),
        ];
        let checks = evaluate(&limits(), &[], &o, None);
        let (s, m) = sev(&checks, "tenant.vision.quota").expect("vision is checked");
        assert_eq!(*s, Severity::Warning);
        assert_eq!(m, "tenant vision: 94% of its quota used (60.0M of 64.0M on tank/teams/vision; warn at 90%)");
        assert_eq!(sev(&checks, "tenant.speech.quota").map(|x| *x.0), Some(Severity::Ok));
        assert!(sev(&checks, "tenant.free.quota").is_none(), "no quota, nothing to warn of");
        // Exactly at the threshold warns; just under does not.
        o.tenants = vec![tenant("vision", 90, Some(100))];
        assert_eq!(
            sev(&evaluate(&limits(), &[], &o, None), "tenant.vision.quota").map(|x| *x.0),
            Some(Severity::Warning)
        );
        o.tenants = vec![tenant("vision", 89, Some(100))];
        assert_eq!(sev(&evaluate(&limits(), &[], &o, None), "tenant.vision.quota").map(|x| *x.0), Some(Severity::Ok));
    }
}
