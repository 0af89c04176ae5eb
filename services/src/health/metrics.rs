//! The Prometheus endpoint: each check round renders its observation into a fresh registry
//! (the `prometheus-client` crate writes the text format), and a scrape returns the latest
//! rendering — a scrape reads memory, it never runs a tool or touches a drive.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::alerts::Report;
use super::checks::Severity;

type Labels = Vec<(&'static str, String)>;
type Gauges = Family<Labels, Gauge<f64, AtomicU64>>;
type Counters = Family<Labels, Counter<u64>>;

/// A registry being filled: gauges and counters by name, registered on first use.
struct Sheet {
    registry: Registry,
    gauges: Vec<(&'static str, Gauges)>,
    counters: Vec<(&'static str, Counters)>,
}

/// The family registered as `name`, registered on first use.
fn family<F>(registry: &mut Registry, known: &mut Vec<(&'static str, F)>, name: &'static str, help: &str) -> F
where
    F: prometheus_client::registry::Metric + Clone + Default,
{
    if let Some((_, f)) = known.iter().find(|(n, _)| *n == name) {
        return f.clone();
    }
    let f = F::default();
    registry.register(name, help, f.clone());
    known.push((name, f.clone()));
    f
}

impl Sheet {
    fn gauge(&mut self, name: &'static str, help: &str, labels: Labels, v: f64) {
        family(&mut self.registry, &mut self.gauges, name, help).get_or_create(&labels).set(v);
    }

    /// `name` without `_total`: the crate adds it.
    fn counter(&mut self, name: &'static str, help: &str, labels: Labels, v: u64) {
        family(&mut self.registry, &mut self.counters, name, help).get_or_create(&labels).inc_by(v);
    }
}

fn sev(s: Severity) -> f64 {
    match s {
        Severity::Ok => 0.0,
        Severity::Warning => 1.0,
        Severity::Critical => 2.0,
    }
}

fn clamp(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// The text exposition of a round.
pub fn render(report: &Report, all_checks: &[super::checks::Check]) -> String {
    let mut s = Sheet { registry: Registry::default(), gauges: Vec::new(), counters: Vec::new() };
    let o = &report.observation;
    s.gauge("nasos_health_overall", "Worst check severity: 0 ok, 1 warning, 2 critical", vec![], sev(report.overall));
    for c in all_checks {
        s.gauge(
            "nasos_health_check",
            "Each check's severity: 0 ok, 1 warning, 2 critical.",
            vec![("check", c.id.clone())],
            sev(c.severity),
        );
    }
    for b in &o.bays {
        let l = || vec![("bay", b.bay.clone())];
        s.gauge("nasos_bay_present", "1 when the bay holds a drive", l(), f64::from(u8::from(b.device.is_some())));
        if let Some(Ok(m)) = &b.smart {
            if let Some(c) = m.celsius() {
                s.gauge("nasos_nvme_temperature_celsius", "NVMe composite temperature", l(), c);
            }
            s.gauge(
                "nasos_nvme_critical_warning",
                "NVMe critical warning bits (SMART log byte 0).",
                l(),
                f64::from(m.critical_warning),
            );
            s.gauge("nasos_nvme_available_spare_percent", "NVMe available spare", l(), f64::from(m.avail_spare));
            s.gauge("nasos_nvme_percent_used", "NVMe rated endurance used", l(), f64::from(m.percent_used));
            s.counter("nasos_nvme_media_errors", "NVMe media and data integrity errors", l(), clamp(m.media_errors));
            s.counter(
                "nasos_nvme_data_units_read",
                "NVMe data units read (1000 × 512 bytes each).",
                l(),
                clamp(m.data_units_read),
            );
            s.counter(
                "nasos_nvme_data_units_written",
                "NVMe data units written (1000 × 512 bytes each).",
                l(),
                clamp(m.data_units_written),
            );
            s.counter("nasos_nvme_unsafe_shutdowns", "NVMe unsafe shutdowns", l(), clamp(m.unsafe_shutdowns));
        }
    }
    if let Ok(pools) = &o.pools {
        for p in pools {
            let l = || vec![("pool", p.name.clone())];
            for state in ["ONLINE", "DEGRADED", "FAULTED", "OFFLINE", "UNAVAIL", "REMOVED", "SUSPENDED"] {
                let mut lab = l();
                lab.push(("state", state.to_string()));
                s.gauge(
                    "nasos_pool_state",
                    "1 for the pool's current state.",
                    lab,
                    f64::from(u8::from(p.state == state)),
                );
            }
            s.gauge("nasos_pool_capacity_percent", "Pool capacity used", l(), p.capacity_percent as f64);
            s.gauge("nasos_pool_size_bytes", "Pool size", l(), p.size_bytes as f64);
            s.gauge("nasos_pool_allocated_bytes", "Pool space allocated", l(), p.allocated_bytes as f64);
            if let Some((what, pct)) = &p.scan {
                let mut lab = l();
                lab.push(("scan", what.clone()));
                s.gauge("nasos_pool_scan_percent", "Progress of a running resilver or scrub", lab, *pct);
            }
            for m in &p.members {
                let lab = || vec![("pool", p.name.clone()), ("bay", m.disk.clone()), ("vdev", m.group.clone())];
                // A hot spare waiting (AVAIL) or at work (INUSE) is as it should be.
                let fine = m.state == "ONLINE" || (m.group == "spare" && matches!(m.state.as_str(), "AVAIL" | "INUSE"));
                s.gauge(
                    "nasos_pool_member_online",
                    "1 when the member disk is ONLINE (a hot spare: AVAIL or INUSE).",
                    lab(),
                    f64::from(u8::from(fine)),
                );
                if m.group == "spare" {
                    s.gauge(
                        "nasos_pool_spare_in_use",
                        "1 while the hot spare stands in for a member of its pool",
                        vec![("pool", p.name.clone()), ("bay", m.disk.clone())],
                        f64::from(u8::from(m.spare_for.is_some())),
                    );
                }
                for (kind, n) in [("read", m.read_errors), ("write", m.write_errors), ("checksum", m.checksum_errors)] {
                    let mut e = lab();
                    e.push(("kind", kind.to_string()));
                    s.counter("nasos_pool_member_errors", "ZFS I/O errors of a member disk", e, n);
                }
            }
        }
    }
    for l in &o.links {
        let lab = || vec![("link", l.name.clone())];
        s.gauge("nasos_link_up", "1 when the link's operstate is up", lab(), f64::from(u8::from(l.operstate == "up")));
        if let Some(sp) = l.speed_mbps {
            s.gauge("nasos_link_speed_mbps", "Negotiated link speed", lab(), sp as f64);
        }
        s.counter("nasos_link_receive_bytes", "Bytes received on the link", lab(), l.rx_bytes);
        s.counter("nasos_link_transmit_bytes", "Bytes sent on the link", lab(), l.tx_bytes);
    }
    for r in &o.rdma {
        let lab = || vec![("device", r.device.clone()), ("port", r.port.to_string()), ("link", r.link.clone())];
        s.gauge(
            "nasos_rdma_port_active",
            "1 when the RDMA port is ACTIVE.",
            lab(),
            f64::from(u8::from(r.state == "ACTIVE")),
        );
        for (name, v) in &r.counters {
            let mut c = lab();
            c.push(("counter", name.clone()));
            s.counter("nasos_rdma_port_events", "The RDMA port's hardware counters, by the driver's names", c, *v);
        }
    }
    if let Some(n) = &o.nfs {
        for (t, port) in [("tcp", 2049u16), ("rdma", 20049)] {
            let on = n.listeners.iter().any(|l| l.transport == t && l.port == port);
            s.gauge(
                "nasos_nfs_listener",
                "1 when nfsd listens on the transport.",
                vec![("transport", t.to_string())],
                f64::from(u8::from(on)),
            );
        }
        s.gauge("nasos_nfsd_threads", "nfsd threads", vec![], f64::from(n.threads));
        s.counter("nasos_nfsd_read_bytes", "Bytes nfsd read for clients", vec![], n.read_bytes);
        s.counter("nasos_nfsd_written_bytes", "Bytes nfsd wrote for clients", vec![], n.written_bytes);
        s.counter("nasos_nfsd_rpc_calls", "RPC calls nfsd answered", vec![], n.rpc_calls);
    }
    if let Ok(list) = &o.services {
        for sv in list {
            let lab = || vec![("service", sv.name.clone())];
            let up = matches!(sv.state.as_str(), "running" | "done");
            s.gauge(
                "nasos_service_up",
                "1 when the service runs (or, for a oneshot, finished).",
                lab(),
                f64::from(u8::from(up)),
            );
            s.gauge(
                "nasos_service_failed",
                "1 when the service failed.",
                lab(),
                f64::from(u8::from(sv.state == "failed")),
            );
            s.counter("nasos_service_restarts", "Restarts of the service this boot", lab(), u64::from(sv.restarts));
        }
    }
    if let Some(c) = o.cpu_celsius {
        s.gauge("nasos_cpu_temperature_celsius", "CPU temperature (k10temp)", vec![], c);
    }
    if let Some((ce, ue)) = o.ecc {
        s.counter("nasos_memory_ecc_corrected_errors", "Corrected memory errors (EDAC)", vec![], ce);
        s.counter("nasos_memory_ecc_uncorrected_errors", "Uncorrected memory errors (EDAC)", vec![], ue);
    }
    for r in &o.replication {
        let l = || vec![("dataset", r.dataset.clone()), ("peer", r.peer.clone())];
        if let Some(lag) = r.lag_seconds {
            s.gauge(
                "nasos_replication_lag_seconds",
                "Age of the newest snapshot this box and the peer both hold",
                l(),
                lag as f64,
            );
        }
        s.counter("nasos_replication_sent_bytes", "Bytes sent to the peer for this dataset", l(), r.total_bytes);
    }
    for t in &o.tenants {
        let l = || vec![("tenant", t.name.clone()), ("dataset", t.dataset.clone())];
        if let Some(u) = t.used {
            s.gauge("nasos_tenant_used_bytes", "Space the tenant's subtree uses, snapshots included", l(), u as f64);
        }
        if let Some(q) = t.quota.filter(|q| *q > 0) {
            s.gauge("nasos_tenant_quota_bytes", "The tenant's quota", l(), q as f64);
        }
        if let Some(a) = t.available {
            s.gauge("nasos_tenant_available_bytes", "Space the tenant can still write", l(), a as f64);
        }
    }
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_text::encode(&mut out, &s.registry);
    out
}

/// Serves `GET /metrics` from `latest` on `addr` in a thread of its own. Binding failures are
/// returned (the agent says them); a failed request only drops that request.
pub fn serve(addr: std::net::SocketAddr, latest: Arc<Mutex<String>>) -> Result<(), String> {
    let server = tiny_http::Server::http(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            let content_type = tiny_http::Header::from_bytes("Content-Type", prometheus_text::CONTENT_TYPE).ok();
            for req in server.incoming_requests() {
                let resp = if req.url() == "/metrics" && *req.method() == tiny_http::Method::Get {
                    let body = latest.lock().map(|s| s.clone()).unwrap_or_default();
                    let r = tiny_http::Response::from_string(body);
                    match &content_type {
                        Some(h) => r.with_header(h.clone()),
                        None => r,
                    }
                } else {
                    tiny_http::Response::from_string("nasos serves /metrics only\n").with_status_code(404)
                };
                let _ = req.respond(resp);
            }
        })
        .map_err(|e| format!("starting the metrics thread: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::checks::{Check, Severity};
    use super::super::observe::*;
    use super::super::smart::SmartLog;
    use super::*;

    fn full() -> (Report, Vec<Check>) {
        let smart = SmartLog {
            critical_warning: 2,
            temperature_kelvin: 323,
            avail_spare: 100,
            spare_thresh: 10,
            percent_used: 4,
            data_units_read: 25,
            data_units_written: 9,
            power_on_hours: 1,
            unsafe_shutdowns: 0,
            media_errors: 0,
            num_err_log_entries: 0,
        };
        let o = Observation {
            bays: vec![
                BayObs { bay: "BAY01".into(), device: Some("nvme0n1".into()), smart: Some(Ok(smart)) },
                BayObs { bay: "BAY07".into(), device: None, smart: None },
            ],
            pools: Ok(vec![PoolObs {
                name: "tank".into(),
                state: "DEGRADED".into(),
                capacity_percent: 3,
                size_bytes: 1 << 30,
                allocated_bytes: 1 << 20,
                members: vec![
                    MemberObs {
                        disk: "BAY07".into(),
                        group: "raidz2-1".into(),
                        state: "REMOVED".into(),
                        errors: 1,
                        read_errors: 0,
                        write_errors: 1,
                        checksum_errors: 0,
                        spare_for: None,
                    },
                    MemberObs {
                        disk: "BAY11".into(),
                        group: "spare".into(),
                        state: "INUSE".into(),
                        errors: 0,
                        read_errors: 0,
                        write_errors: 0,
                        checksum_errors: 0,
                        spare_for: Some("BAY07".into()),
                    },
                ],
                scan: Some(("resilver".into(), 12.5)),
            }]),
            links: vec![LinkObs {
                name: "data0".into(),
                operstate: "up".into(),
                speed_mbps: Some(100_000),
                expected_mbps: 100_000,
                rx_bytes: 10,
                tx_bytes: 20,
            }],
            rdma: vec![RdmaObs {
                device: "rxe0".into(),
                port: 1,
                link: "data0".into(),
                state: "ACTIVE".into(),
                counters: [("rcvd_seq_err".to_string(), 3)].into(),
            }],
            nfs: Some(NfsObs {
                listeners: vec![crate::nfsd::Listener { transport: "tcp".into(), port: 2049 }],
                threads: 8,
                want_rdma: true,
                read_bytes: 1,
                written_bytes: 2,
                rpc_calls: 3,
            }),
            services: Ok(vec![ServiceObs { name: "nfs".into(), state: "running".into(), restarts: 1 }]),
            cpu_celsius: Some(55.0),
            replication: vec![super::super::observe::ReplicationObs {
                dataset: "tank/train".into(),
                peer: "dr".into(),
                lag_seconds: Some(90),
                trying_seconds: 0,
                alert_after_seconds: 480,
                last_error: None,
                total_bytes: 64 << 20,
            }],
            ecc: Some((1, 0)),
            tenants: vec![crate::inspect::TenantView {
                name: "vision".into(),
                dataset: "tank/teams/vision".into(),
                networks: vec!["10.77.0.128/26".into()],
                used: Some(48 << 20),
                quota: Some(64 << 20),
                available: Some(16 << 20),
                reservation: Some(0),
                exports: vec!["tank/teams/vision".into()],
                squash: "root".into(),
            }],
        };
        let checks = vec![
            Check {
                id: "bay.BAY07.present".into(),
                severity: Severity::Critical,
                message: "BAY07: drive missing".into(),
            },
            Check { id: "pool.tank.state".into(), severity: Severity::Warning, message: "pool tank: DEGRADED".into() },
        ];
        (Report::new(1, &checks, vec![], o), checks)
    }

    #[test]
    fn the_text_names_each_bay_pool_link_port_and_service() {
        let (r, checks) = full();
        let text = render(&r, &checks);
        for line in [
            "nasos_health_overall 2.0",
            "nasos_health_check{check=\"bay.BAY07.present\"} 2.0",
            "nasos_bay_present{bay=\"BAY07\"} 0.0",
            "nasos_bay_present{bay=\"BAY01\"} 1.0",
            "nasos_nvme_critical_warning{bay=\"BAY01\"} 2.0",
            "nasos_pool_state{pool=\"tank\",state=\"DEGRADED\"} 1.0",
            "nasos_pool_member_online{pool=\"tank\",bay=\"BAY07\",vdev=\"raidz2-1\"} 0.0",
            "nasos_pool_member_online{pool=\"tank\",bay=\"BAY11\",vdev=\"spare\"} 1.0",
            "nasos_pool_spare_in_use{pool=\"tank\",bay=\"BAY11\"} 1.0",
            "nasos_pool_scan_percent{pool=\"tank\",scan=\"resilver\"} 12.5",
            "nasos_rdma_port_events_total{device=\"rxe0\",port=\"1\",link=\"data0\",counter=\"rcvd_seq_err\"} 3",
            "nasos_nfs_listener{transport=\"rdma\"} 0.0",
            "nasos_service_restarts_total{service=\"nfs\"} 1",
            "nasos_tenant_used_bytes{tenant=\"vision\",dataset=\"tank/teams/vision\"} 50331648.0",
            "nasos_tenant_quota_bytes{tenant=\"vision\",dataset=\"tank/teams/vision\"} 67108864.0",
            "# TYPE nasos_nvme_media_errors_total counter",
        ] {
            assert!(text.lines().any(|l| l == line), "missing `{line}` in\n{text}");
        }
    }

    #[test]
    fn every_metric_the_dashboard_queries_is_served() {
        let (r, checks) = full();
        let text = render(&r, &checks);
        let served: std::collections::BTreeSet<&str> =
            text.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split(['{', ' ']).next()).collect();
        let dash: serde_json::Value =
            serde_json::from_str(include_str!("../../../deploy/grafana/nasos.json")).expect("dashboard JSON");
        let mut asked = 0;
        for p in dash["panels"].as_array().expect("panels") {
            for t in p["targets"].as_array().expect("targets") {
                let expr = t["expr"].as_str().expect("expr");
                for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                    if word.starts_with("nasos_") {
                        asked += 1;
                        assert!(
                            served.contains(word),
                            "panel `{}` asks for {word}, which nasos does not serve",
                            p["title"]
                        );
                    }
                }
            }
        }
        assert!(asked > 20, "the dashboard queries {asked} metrics");
    }
}
