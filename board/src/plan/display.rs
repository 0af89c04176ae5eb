//! The human form of a plan, as `nasos plan` prints it.

use super::*;
use crate::units::format_size;
use nasos_layout::paths::BAY_DIR;

impl fmt::Display for Plan {
    /// The human form `nasos plan` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.image;
        writeln!(f, "image      {} {} (hostname {})", i.name, i.version, i.hostname)?;
        let emu = if i.emulated_board { ", emulated" } else { "" };
        writeln!(f, "board      {}{emu}", i.board)?;
        if i.development {
            writeln!(f, "           DEVELOPMENT image (not for shipping)")?;
        }
        if let Some(b) = i.size_budget_mib {
            writeln!(f, "budget     {b} MiB")?;
        }
        if let Some(db) = &i.secure_boot_db {
            writeln!(f, "boot       Secure Boot: systemd-boot, the UKI and the ZFS modules signed for {db}")?;
        }
        writeln!(
            f,
            "console    {} at {} baud, root login {}",
            self.console.device,
            self.console.baud,
            word(&self.console.root_login)
        )?;
        writeln!(f, "\npackages ({})", self.packages.len())?;
        writeln!(f, "  {}", self.packages.join(" "))?;
        writeln!(f, "\nkernel")?;
        writeln!(f, "  initramfs modules  {}", self.kernel.initramfs_modules.join(" "))?;
        for set in &self.kernel.module_sets {
            let then = if set.bays { "; replays the drives' udev events, then waits for the bays" } else { "" };
            writeln!(f, "  {:<18} {}{then}", set.service, set.modules.join(" "))?;
        }
        for (m, opts) in &self.kernel.module_options {
            let o: Vec<String> = opts.iter().map(|(k, v)| format!("{k}={v}")).collect();
            writeln!(f, "  options {m:<10} {}", o.join(" "))?;
        }
        writeln!(f, "  cmdline            {}", self.kernel.cmdline.join(" "))?;
        writeln!(f, "\nbays")?;
        for b in &self.bays {
            writeln!(f, "  {:<6} {:<24} {}", b.name, format!("{BAY_DIR}/{}", b.name), match_text(&b.matcher))?;
        }
        if !self.links.is_empty() {
            writeln!(f, "\nlinks")?;
            for l in &self.links {
                writeln!(
                    f,
                    "  {:<8} port {:<8} {:>6} Mb/s  mtu {:<5} {}  [{}; {}]",
                    l.name,
                    l.port,
                    l.speed_mbps,
                    l.mtu,
                    l.addresses.join(" "),
                    l.driver,
                    match_text(&l.matcher)
                )?;
                for v in &l.vlans {
                    writeln!(f, "    vlan {:<5} {:<12} {}", v.id, v.name, v.addresses.join(" "))?;
                }
            }
        }
        if let Some(fab) = &self.fabric {
            writeln!(f, "\nfabric (RoCE v2)")?;
            let req = if fab.pfc_required { "required" } else { "best effort" };
            writeln!(f, "  PFC on priority {} ({req})", fab.lossless_priority)?;
            match &fab.ets_bandwidth {
                Some(ets) => writeln!(f, "  ETS shares (tc0..tc7)  {ets:?}")?,
                None => writeln!(f, "  ETS left as the NIC has it")?,
            }
            let app: Vec<String> = fab.dscp.iter().map(|d| format!("{}→{}", d.dscp, d.priority)).collect();
            writeln!(f, "  DSCP→priority  {}", if app.is_empty() { "(none)".to_string() } else { app.join(" ") })?;
            for l in &fab.links {
                let dev = l.rxe_device.as_deref().unwrap_or("(NIC's own)");
                let dcb = match l.dcb {
                    DcbMethod::Dcbnl => "DCB via dcbnl",
                    DcbMethod::Unsupported => "DCB not supported by this NIC",
                };
                writeln!(f, "  {:<8} rdma {} device {dev}; {dcb}", l.link, word(&l.rdma))?;
            }
        }
        if !self.pools.is_empty() {
            writeln!(f, "\nzfs")?;
            if let Some(arc) = self.zfs.arc_max_bytes {
                writeln!(f, "  ARC cap {} ({arc} bytes)", format_size(arc))?;
            }
            for p in &self.pools {
                writeln!(
                    f,
                    "  pool {} (ashift {}, create {}, mounted at {})",
                    p.name,
                    p.ashift,
                    word(&p.create),
                    p.mountpoint
                )?;
                for v in &p.vdevs {
                    writeln!(f, "    {:<7} {}", v.kind.zpool_word().unwrap_or("disk"), v.bays.join(" "))?;
                }
                if !p.spares.is_empty() {
                    writeln!(f, "    spares  {}", p.spares.join(" "))?;
                }
                write_props(f, "    -o", &p.properties)?;
                write_props(f, "    -O", &p.filesystem)?;
            }
            for d in &self.datasets {
                writeln!(f, "  dataset {} at {}", d.name, d.mountpoint)?;
                write_props(f, "   ", &d.properties)?;
            }
        }
        if !self.snapshots.is_empty() {
            writeln!(f, "\nsnapshots (UTC periods; the newest of each kind is always kept)")?;
            for s in &self.snapshots {
                let k = &s.keep;
                let kinds: Vec<String> = [
                    ("frequently", k.frequently, format!(" (every {} min)", s.frequent_minutes)),
                    ("hourly", k.hourly, String::new()),
                    ("daily", k.daily, String::new()),
                    ("weekly", k.weekly, String::new()),
                    ("monthly", k.monthly, String::new()),
                ]
                .into_iter()
                .filter(|(_, n, _)| *n > 0)
                .map(|(kind, n, extra)| format!("{n} {kind}{extra}"))
                .collect();
                let hold = if s.hold_seconds > 0 {
                    format!("; each held {}", crate::units::format_duration(s.hold_seconds))
                } else {
                    String::new()
                };
                let rec = if s.recursive { " and below" } else { "" };
                writeln!(f, "  {}{rec}: keep {}{hold}", s.dataset, kinds.join(", "))?;
            }
        }
        let r = &self.replication;
        if !r.peers.is_empty() {
            writeln!(
                f,
                "\nreplication (ssh; key: {})",
                if r.identity.is_some() { "the recipe's (development)" } else { "made on first boot" }
            )?;
            for p in &r.peers {
                let may = if p.receive.is_empty() {
                    "sends nothing here".to_string()
                } else {
                    format!("may send {}", p.receive.join(", "))
                };
                writeln!(f, "  peer {} at {} on {} (from {}); {may}", p.name, p.address, p.link, p.local_address)?;
            }
            for j in &r.jobs {
                let bw = j
                    .bandwidth_bytes
                    .map(|b| format!(", at most {}/s", crate::units::format_size(b)))
                    .unwrap_or_default();
                writeln!(
                    f,
                    "  send {} → {}:{} every {} min{bw}; alert after {} min behind",
                    j.dataset,
                    j.peer,
                    j.target,
                    j.every_minutes,
                    j.lag_alert_seconds / 60
                )?;
            }
        }
        if !self.tenants.is_empty() {
            writeln!(f, "\ntenants")?;
            for t in &self.tenants {
                let size = |b: Option<u64>| b.map_or("none".to_string(), crate::units::format_size);
                writeln!(
                    f,
                    "  {}  {}  quota {}  reservation {}  squash {}",
                    t.name,
                    t.dataset,
                    size(t.quota_bytes),
                    size(t.reservation_bytes),
                    t.squash
                )?;
                writeln!(f, "    networks {}", t.networks.join(" "))?;
                if !t.vlans.is_empty() {
                    writeln!(f, "    vlans {}", t.vlans.join(" "))?;
                }
                let exports: Vec<&str> = self
                    .nfs
                    .iter()
                    .flat_map(|n| n.exports.iter())
                    .filter(|e| e.tenant.as_deref() == Some(t.name.as_str()))
                    .map(|e| e.dataset.as_str())
                    .collect();
                writeln!(f, "    exports {}", if exports.is_empty() { "none".to_string() } else { exports.join(" ") })?;
            }
        }
        if let Some(n) = &self.nfs {
            writeln!(f, "\nnfs")?;
            let v: Vec<&str> = n.versions.iter().map(|v| v.as_str()).collect();
            let rdma = n.rdma_port.map(|p| format!(", rdma {p}")).unwrap_or_default();
            writeln!(f, "  versions {}  threads {}  tcp {}{rdma}", v.join(" "), n.threads, n.tcp_port)?;
            writeln!(
                f,
                "  grace {}s lease {}s{}",
                n.grace_seconds,
                n.lease_seconds,
                if n.rpcbind { ", rpcbind + statd" } else { "" }
            )?;
            writeln!(f, "  /etc/exports:")?;
            for line in n.exports_table().lines() {
                writeln!(f, "    {line}")?;
            }
        }
        let h = &self.health;
        writeln!(f, "\nhealth")?;
        writeln!(
            f,
            "  watchdog {} ({}), timeout {}s",
            h.watchdog_driver, h.watchdog_identity, h.watchdog_timeout_seconds
        )?;
        writeln!(
            f,
            "  warn at NVMe {}°C, spare under {}%, wear {}%; CPU {}°C; pool {}% full; tenant {}% of quota; checks every {}s",
            h.nvme_temperature_warn_celsius,
            h.nvme_spare_warn_percent,
            h.nvme_wear_warn_percent,
            h.cpu_temperature_warn_celsius,
            h.pool_capacity_warn_percent,
            h.tenant_quota_warn_percent,
            h.check_interval_seconds
        )?;
        writeln!(
            f,
            "  the watchdog resets the box when a fatal condition lasts {}s (NFS listeners gone and nfs failed, a pool suspended)",
            h.fatal_grace_seconds
        )?;
        match &h.metrics {
            Some(a) => writeln!(f, "  metrics (Prometheus) on http://{a}/metrics")?,
            None => writeln!(f, "  no metrics endpoint")?,
        }
        if h.syslog.is_empty() {
            writeln!(f, "  alerts to the console and the alert history")?;
        } else {
            let to: Vec<String> = h.syslog.iter().map(ToString::to_string).collect();
            writeln!(f, "  alerts to the console, the alert history and syslog {}", to.join(", "))?;
        }
        if !self.links.is_empty() {
            writeln!(f, "\nfirewall (everything else is dropped)")?;
            for a in super::firewall::allowed(self) {
                let from = if a.from.is_empty() { "anywhere".to_string() } else { a.from.join(", ") };
                let to = a.to.as_ref().map(|t| format!(" to {t}")).unwrap_or_default();
                writeln!(f, "  {:<8} {}/{:<5} from {from}{to}  ({})", a.link, a.proto, a.port, a.why)?;
            }
        }
        writeln!(f, "\nupgrade")?;
        let u = &self.upgrade;
        writeln!(
            f,
            "  {} boot tries before the previous slot boots again; blessed after {}s ready and healthy",
            u.boot_tries, u.bless_after_seconds
        )?;
        writeln!(f, "  bundles of this image replace {} or later", u.min_version)?;
        if u.trusted_keys.is_empty() {
            writeln!(f, "  trusts no upgrade keys: this box takes no upgrades")?;
        }
        for k in &u.trusted_keys {
            writeln!(f, "  trusts key {} ({})", k.id, k.file)?;
        }
        let l = &self.liveness;
        writeln!(f, "\nliveness")?;
        writeln!(
            f,
            "  the appliance must be ready within {}s of nasinit's start, or it reboots; after {} such boots in a row it stays up and says why",
            l.ready_deadline_seconds, l.failed_boots_before_staying_up
        )?;
        writeln!(f, "\nservices")?;
        for s in &self.services {
            let after = if s.after.is_empty() { String::new() } else { format!(" after {}", s.after.join(", ")) };
            let ready = match &s.readiness {
                Readiness::Started => "started".to_string(),
                Readiness::Exited => "exited 0".to_string(),
                Readiness::Notify => "READY=1".to_string(),
                Readiness::Fd { fd } => format!("fd {fd}"),
                Readiness::Check { command, .. } => format!("check `{}`", command.join(" ")),
            };
            writeln!(
                f,
                "  {:<15} {:<42} ready: {ready:<9} restart: {}{after}",
                s.name,
                s.command.join(" "),
                word(&s.restart.when)
            )?;
            if s.boot_nice != 0 {
                writeln!(f, "{:18}at nice {} until the services on the way to serving are ready", "", s.boot_nice)?;
            }
            if let Some(ms) = s.start_timeout_ms {
                writeln!(f, "{:18}ready within {}s of its start, or stopped as failed", "", ms / 1000)?;
            }
            if let Some(stop) = &s.stop_command {
                writeln!(f, "{:18}on stop: {}", "", stop.join(" "))?;
            }
        }
        Ok(())
    }
}

fn write_props(f: &mut fmt::Formatter<'_>, prefix: &str, props: &BTreeMap<String, String>) -> fmt::Result {
    if props.is_empty() {
        return Ok(());
    }
    let p: Vec<String> = props.iter().map(|(k, v)| format!("{k}={v}")).collect();
    writeln!(f, "{prefix} {}", p.join(" "))
}

fn match_text(m: &DeviceMatch) -> String {
    [("pci", &m.pci), ("serial", &m.serial), ("mac", &m.mac), ("virtio serial", &m.virtio_serial)]
        .into_iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k} {v}")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The spelling an enum has in recipes and JSON (`soft-roce`, `blank-disks`), for human output.
fn word<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => "?".to_string(),
    }
}
