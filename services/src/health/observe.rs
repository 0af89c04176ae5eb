//! What health reads from the running system, as plain data: one [`Observation`] per check
//! round. The reading is here; what it means is [`super::checks`], so host tests reach the
//! decisions with observations made by hand.

use std::collections::BTreeMap;
use std::path::Path;

use nasos_board::Plan;
use serde::{Deserialize, Serialize};

use super::smart::{self, SmartLog};
use crate::nfsd::{self, Listener};
use crate::rdma;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    pub bays: Vec<BayObs>,
    /// `Err` when ZFS could not be asked (the message says why); empty with no pools.
    pub pools: Result<Vec<PoolObs>, String>,
    pub links: Vec<LinkObs>,
    pub rdma: Vec<RdmaObs>,
    /// `None` when the plan serves no NFS.
    pub nfs: Option<NfsObs>,
    /// From nasinit's API; `Err` when it did not answer.
    pub services: Result<Vec<ServiceObs>, String>,
    /// CPU temperature (k10temp Tctl), `None` when the machine has no such sensor.
    pub cpu_celsius: Option<f64>,
    /// EDAC memory error counts (corrected, uncorrected), `None` without an EDAC driver.
    pub ecc: Option<(u64, u64)>,
    /// Each dataset this box sends to a peer, from the replication agent's record.
    #[serde(default)]
    pub replication: Vec<ReplicationObs>,
    /// Each tenant's space against its quota (empty when ZFS could not be asked).
    #[serde(default)]
    pub tenants: Vec<crate::inspect::TenantView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicationObs {
    pub dataset: String,
    pub peer: String,
    /// Age of the newest snapshot both boxes hold; `None` before the first send.
    pub lag_seconds: Option<u64>,
    /// How long the job has tried without ever getting a snapshot across (0: it has, or has
    /// not tried yet).
    pub trying_seconds: u64,
    pub alert_after_seconds: u64,
    pub last_error: Option<String>,
    pub total_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BayObs {
    pub bay: String,
    /// The kernel device udev named after the bay (`nvme2n1`), `None` when the bay is empty.
    pub device: Option<String>,
    /// The drive's SMART log; `Err` says why it could not be read.
    pub smart: Option<Result<SmartLog, String>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolObs {
    pub name: String,
    /// ONLINE, DEGRADED, FAULTED, SUSPENDED, UNAVAIL…
    pub state: String,
    pub capacity_percent: u64,
    pub size_bytes: u64,
    pub allocated_bytes: u64,
    pub members: Vec<MemberObs>,
    /// A resilver or scrub: (what, percent done), while one runs.
    pub scan: Option<(String, f64)>,
}

/// A pool's member disk, by bay, with its error counters: ZFS's summary of it.
pub type MemberObs = nasos_zfs::summary::Member;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkObs {
    pub name: String,
    /// `up`, `down`, `lowerlayerdown`…; `missing` when no interface has the name.
    pub operstate: String,
    pub speed_mbps: Option<u64>,
    pub expected_mbps: u32,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaObs {
    pub device: String,
    pub port: u32,
    pub link: String,
    pub state: String,
    /// The port's hw_counters, by the driver's names.
    pub counters: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NfsObs {
    pub listeners: Vec<Listener>,
    pub threads: u32,
    /// Whether an export asks for RDMA (so `rdma 20049` must listen).
    pub want_rdma: bool,
    /// nfsd's counters from /proc/net/rpc/nfsd: bytes read and written, RPC calls.
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub rpc_calls: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceObs {
    pub name: String,
    pub state: String,
    pub restarts: u32,
}

/// Reads everything once but the bays (the agent reads those itself, at once when a drive comes
/// or goes; see [`bays`]). `services` comes from the caller (it talks to nasinit).
pub fn without_bays(plan: &Plan, services: Result<Vec<ServiceObs>, String>) -> Observation {
    let sys = Path::new("/sys");
    Observation {
        bays: Vec::new(),
        pools: if plan.pools.is_empty() { Ok(Vec::new()) } else { pools() },
        links: links(sys, plan),
        rdma: plan.links.iter().flat_map(|l| rdma_ports(Path::new(rdma::SYSFS), &l.name)).collect(),
        nfs: plan.nfs.as_ref().map(|n| nfs(n.exports.iter().any(|e| e.rdma))),
        services,
        cpu_celsius: cpu_celsius(sys),
        ecc: ecc(sys),
        replication: replication(plan),
        tenants: crate::inspect::tenants(plan).unwrap_or_default(),
    }
}

fn replication(plan: &Plan) -> Vec<ReplicationObs> {
    let st = nasos_layout::state::State::mounted();
    let now = crate::unix_now();
    plan.replication
        .jobs
        .iter()
        .map(|j| {
            let s = crate::replication::state::read(&st, &j.dataset, &j.peer).unwrap_or_default();
            ReplicationObs {
                dataset: j.dataset.clone(),
                peer: j.peer.clone(),
                lag_seconds: s.lag(now),
                trying_seconds: if s.common.is_none() && s.first_attempt > 0 {
                    now.saturating_sub(s.first_attempt)
                } else {
                    0
                },
                alert_after_seconds: j.lag_alert_seconds,
                last_error: s.last_error,
                total_bytes: s.total_bytes,
            }
        })
        .collect()
}

/// Each bay of the plan, by the name udev gave it.
pub fn bays(dir: &Path, plan: &Plan) -> Vec<BayObs> {
    plan.bays
        .iter()
        .map(|b| {
            let link = dir.join(&b.name);
            let device =
                std::fs::canonicalize(&link).ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
            let smart = device.as_ref().map(|_| smart::read(&link));
            BayObs { bay: b.name.clone(), device, smart }
        })
        .collect()
}

fn pools() -> Result<Vec<PoolObs>, String> {
    let status = nasos_zfs::status(None).map_err(|e| e.to_string())?;
    let props = nasos_zfs::pool_properties(&["capacity", "size", "allocated", "health"]).map_err(|e| e.to_string())?;
    Ok(status
        .pools
        .values()
        .map(|p| {
            let prop = |k: &str| props.pools.get(&p.name).and_then(|pp| pp.value(k)).and_then(nasos_zfs::Value::as_u64);
            PoolObs {
                name: p.name.clone(),
                state: p.state.clone(),
                capacity_percent: prop("capacity").unwrap_or(0),
                size_bytes: prop("size").unwrap_or(0),
                allocated_bytes: prop("allocated").unwrap_or(0),
                members: nasos_zfs::summary::members(p),
                scan: p.scan_stats.as_ref().and_then(scan),
            }
        })
        .collect())
}

/// A running resilver or scrub from `zpool status -j`'s scan_stats: (function, percent).
pub fn scan(stats: &serde_json::Value) -> Option<(String, f64)> {
    let state = stats.get("state")?.as_str()?;
    if state != "SCANNING" {
        return None;
    }
    let function = stats.get("function")?.as_str()?.to_lowercase();
    let num = |k: &str| stats.get(k).and_then(|v| v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())));
    let total = num("to_examine").unwrap_or(0);
    let done = num("issued").or_else(|| num("examined")).unwrap_or(0);
    let pct = if total == 0 { 0.0 } else { (done as f64 * 100.0 / total as f64).min(100.0) };
    Some((function, pct))
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

fn read_text(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

pub fn links(sys: &Path, plan: &Plan) -> Vec<LinkObs> {
    plan.links
        .iter()
        .map(|l| {
            let dir = sys.join("class/net").join(&l.name);
            LinkObs {
                name: l.name.clone(),
                operstate: read_text(&dir.join("operstate")).unwrap_or_else(|| "missing".into()),
                speed_mbps: crate::fabric::read_speed(&sys.join("class/net"), &l.name),
                expected_mbps: l.speed_mbps,
                rx_bytes: read_u64(&dir.join("statistics/rx_bytes")).unwrap_or(0),
                tx_bytes: read_u64(&dir.join("statistics/tx_bytes")).unwrap_or(0),
            }
        })
        .collect()
}

/// The RDMA ports on `link`, with their hw_counters.
pub fn rdma_ports(root: &Path, link: &str) -> Vec<RdmaObs> {
    rdma::ports_under(root, link)
        .into_iter()
        .map(|p| {
            let dir = root.join(&p.device).join("ports").join(p.port.to_string()).join("hw_counters");
            let counters = std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| Some((e.file_name().to_string_lossy().into_owned(), read_u64(&e.path())?)))
                .collect();
            // sysfs says "4: ACTIVE"; the name is what checks and metrics compare.
            let state = p.state.rsplit(": ").next().unwrap_or(&p.state).to_string();
            RdmaObs { device: p.device, port: p.port, link: link.to_string(), state, counters }
        })
        .collect()
}

fn nfs(want_rdma: bool) -> NfsObs {
    let (read_bytes, written_bytes, rpc_calls) =
        std::fs::read_to_string("/proc/net/rpc/nfsd").map(|t| nfsd_counters(&t)).unwrap_or((0, 0, 0));
    NfsObs { listeners: nfsd::listeners(), threads: nfsd::threads(), want_rdma, read_bytes, written_bytes, rpc_calls }
}

/// (bytes read, bytes written, RPC calls) from /proc/net/rpc/nfsd (`io R W`, `rpc CALLS …`).
pub fn nfsd_counters(text: &str) -> (u64, u64, u64) {
    let mut out = (0, 0, 0);
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["io", r, w, ..] => out = (r.parse().unwrap_or(0), w.parse().unwrap_or(0), out.2),
            ["rpc", calls, ..] => out.2 = calls.parse().unwrap_or(0),
            _ => {}
        }
    }
    out
}

/// The hottest k10temp sensor (Tctl/Tccd), °C.
pub fn cpu_celsius(sys: &Path) -> Option<f64> {
    std::fs::read_dir(sys.join("class/hwmon"))
        .ok()?
        .flatten()
        .filter(|h| read_text(&h.path().join("name")).as_deref() == Some("k10temp"))
        .flat_map(|h| {
            (1..=10).filter_map(move |i| read_u64(&h.path().join(format!("temp{i}_input"))).map(|m| m as f64 / 1000.0))
        })
        .reduce(f64::max)
}

/// Corrected and uncorrected memory errors over every EDAC memory controller.
pub fn ecc(sys: &Path) -> Option<(u64, u64)> {
    let mcs: Vec<_> = std::fs::read_dir(sys.join("devices/system/edac/mc"))
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("mc"))
        .collect();
    if mcs.is_empty() {
        return None;
    }
    Some(mcs.iter().fold((0, 0), |(ce, ue), m| {
        (ce + read_u64(&m.path().join("ce_count")).unwrap_or(0), ue + read_u64(&m.path().join("ue_count")).unwrap_or(0))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nfsd_counters_come_from_proc() {
        let text = "rc 0 12 3456\nfh 0 0 0 0 0\nio 1048576 2097152\nth 8 0 0.000 0.000\nrpc 3468 0 0 0 0\n";
        assert_eq!(nfsd_counters(text), (1_048_576, 2_097_152, 3468));
    }

    #[test]
    fn a_resilver_reports_its_progress() {
        let s: serde_json::Value = serde_json::json!({"function": "RESILVER", "state": "SCANNING", "to_examine": 400, "issued": 100, "examined": 300});
        assert_eq!(scan(&s), Some(("resilver".to_string(), 25.0)));
        let done: serde_json::Value = serde_json::json!({"function": "SCRUB", "state": "FINISHED", "to_examine": 400});
        assert_eq!(scan(&done), None);
    }

    #[test]
    fn cpu_temperature_and_ecc_are_read_where_the_platform_has_them() {
        let t = std::env::temp_dir().join(format!("nasos-observe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        for (dir, files) in [
            ("class/hwmon/hwmon0", &[("name", "nvme\n"), ("temp1_input", "99000\n")][..]),
            (
                "class/hwmon/hwmon3",
                &[("name", "k10temp\n"), ("temp1_input", "61250\n"), ("temp3_input", "58000\n")][..],
            ),
            ("devices/system/edac/mc/mc0", &[("ce_count", "3\n"), ("ue_count", "0\n")][..]),
            ("devices/system/edac/mc/mc1", &[("ce_count", "2\n"), ("ue_count", "1\n")][..]),
        ] {
            std::fs::create_dir_all(t.join(dir)).expect("fixture");
            for (f, v) in files {
                std::fs::write(t.join(dir).join(f), v).expect("fixture");
            }
        }
        assert_eq!(cpu_celsius(&t), Some(61.25), "the nvme sensor is not the CPU's");
        assert_eq!(ecc(&t), Some((5, 1)));
        let empty = t.join("none");
        assert_eq!(cpu_celsius(&empty), None);
        assert_eq!(ecc(&empty), None);
        let _ = std::fs::remove_dir_all(&t);
    }
}
