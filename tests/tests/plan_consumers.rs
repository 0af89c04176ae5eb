//! Every field of the plan is consumed: applied by something on the appliance, used to build the
//! image, or resolved into another field that is. A setting that `nasos plan` prints but nothing
//! applies is a lie to the operator, so this test fails for a plan field missing from the table
//! below, for a consumer that no longer mentions the field, and for a table entry the plan no
//! longer has.

use std::collections::BTreeSet;
use std::path::Path;

/// (field path in the plan's JSON, the file that consumes it, what that file must contain).
/// `[]` stands for every element of a list, `.*` for every key of a map.
const CONSUMERS: &[(&str, &str, &str)] = &[
    ("plan_version", "board/src/plan/mod.rs", "v.plan_version != PLAN_VERSION"),
    ("datasets[].owner", "services/src/storage/agent.rs", "ds.owner"),
    ("kerberos", "image/src/root.rs", "plan.kerberos"),
    ("kerberos.idmap_domain", "board/src/plan/mod.rs", "self.idmap_domain"),
    ("kerberos.realm", "services/src/kerberos.rs", "plan.realm"),
    ("kerberos.users", "image/src/root.rs", "&k.users"),
    ("nfs.exports[].tenant", "board/src/plan/firewall.rs", "e.tenant.as_deref()"),
    ("nfs.gss", "services/src/nfs.rs", "nfs.gss"),
    ("tenants", "services/src/inspect.rs", "plan.tenants"),
    ("tenants[].dataset", "services/src/inspect.rs", "t.dataset.clone()"),
    ("tenants[].name", "services/src/inspect.rs", "name: t.name.clone()"),
    ("tenants[].networks", "services/src/inspect.rs", "t.networks.clone()"),
    ("tenants[].quota_bytes", "board/src/plan/display.rs", "size(t.quota_bytes)"),
    ("tenants[].reservation_bytes", "board/src/plan/display.rs", "size(t.reservation_bytes)"),
    ("tenants[].squash", "services/src/inspect.rs", "t.squash.clone()"),
    ("tenants[].vlans", "board/src/plan/firewall.rs", "!t.vlans.is_empty()"),
    ("image.name", "image/src/root.rs", "plan.image.name"),
    ("image.version", "image/src/build.rs", "plan.image.version"),
    ("image.hostname", "init/src/bin/nasinit.rs", "plan.image.hostname"),
    ("image.board", "image/src/vm.rs", ".board"),
    ("image.emulated_board", "image/src/build.rs", "plan.image.emulated_board"),
    // Development images may autologin and carry no password: decided when the recipe is validated.
    ("image.development", "board/src/validate/sections.rs", "r.image.development"),
    ("image.size_budget_mib", "image/src/build.rs", "plan.image.size_budget_mib"),
    ("image.secure_boot_db", "image/src/secureboot.rs", "plan.image.secure_boot_db"),
    ("packages", "image/src/build.rs", "plan.packages"),
    ("kernel.cmdline", "image/src/build.rs", "plan.kernel.cmdline"),
    ("kernel.initramfs_modules", "image/src/build.rs", "plan.kernel.initramfs_modules"),
    ("kernel.modules", "image/src/root.rs", "plan.kernel.modules"),
    // Each set is loaded by its own service (nasinit load-modules SERVICE).
    ("kernel.module_sets[].service", "init/src/bin/nasinit.rs", "s.service == set"),
    ("kernel.module_sets[].modules", "init/src/bin/nasinit.rs", "&set.modules"),
    ("kernel.module_sets[].bays", "init/src/bin/nasinit.rs", "set.bays"),
    ("kernel.module_options.*", "init/src/bin/nasinit.rs", "plan.kernel.module_options"),
    // The console is the `console` service (agetty on this device at this speed).
    ("console.device", "board/src/plan/resolve.rs", "&b.console.device,"),
    ("console.baud", "board/src/plan/resolve.rs", "b.console.baud,"),
    ("console.root_login", "image/src/root.rs", "plan.console.root_login"),
    ("console.root_password_hash", "image/src/root.rs", "plan.console.root_password_hash"),
    ("bays[].name", "board/src/plan/udev.rs", "bay.name"),
    ("bays[].match.serial", "board/src/plan/udev.rs", "m.serial"),
    ("bays[].match.pci", "board/src/plan/udev.rs", "m.pci"),
    ("links[].name", "services/src/fabric.rs", "link.name"),
    ("links[].port", "services/src/fabric.rs", "link.port"),
    ("links[].match.mac", "services/src/fabric.rs", "link.matcher.mac"),
    ("links[].match.pci", "services/src/fabric.rs", "link.matcher.pci"),
    // A link's driver is loaded at boot: resolved into kernel.modules.
    ("links[].driver", "board/src/plan/resolve.rs", "sets.push(MODULES_NET, &port.driver)"),
    ("links[].speed_mbps", "services/src/fabric.rs", "link.speed_mbps"),
    ("links[].mtu", "services/src/fabric.rs", "link.mtu"),
    ("links[].addresses", "services/src/fabric.rs", "link.addresses"),
    ("links[].vlans", "services/src/fabric.rs", "link.vlans"),
    ("fabric.lossless_priority", "services/src/fabric.rs", "fabric.lossless_priority"),
    ("fabric.pfc_required", "services/src/fabric.rs", "fabric.pfc_required"),
    ("fabric.ets_bandwidth", "services/src/fabric.rs", "fabric.ets_bandwidth"),
    ("fabric.dscp", "services/src/fabric.rs", "fabric.dscp"),
    ("fabric.dscp[].dscp", "services/src/fabric.rs", "d.dscp"),
    ("fabric.dscp[].priority", "services/src/fabric.rs", "d.priority"),
    ("fabric.links[].link", "services/src/fabric.rs", "fl.link"),
    // The RDMA kind selects the RDMA driver module (or soft-RoCE): resolved into kernel.modules.
    ("fabric.links[].rdma", "board/src/plan/resolve.rs", "port.rdma.modules()"),
    ("fabric.links[].rxe_device", "services/src/fabric.rs", "fl.rxe_device"),
    ("fabric.links[].dcb", "services/src/fabric.rs", "fl.dcb == DcbMethod::Unsupported"),
    // ARC cap and tunables become the zfs module's options; storage checks them.
    ("zfs.arc_max_bytes", "board/src/plan/resolve.rs", "r.zfs.arc_max"),
    ("zfs.tunables.*", "board/src/plan/resolve.rs", "r.zfs.tunables"),
    ("pools", "services/src/storage/agent.rs", "plan.pools"),
    ("pools[].name", "services/src/storage/agent.rs", "pool.name"),
    ("pools[].ashift", "services/src/storage/agent.rs", "pool.ashift"),
    ("pools[].create", "services/src/storage/agent.rs", "pool.create"),
    ("pools[].properties.*", "services/src/storage/agent.rs", "pool.properties"),
    ("pools[].filesystem.*", "services/src/storage/agent.rs", "pool.filesystem"),
    ("pools[].mountpoint", "services/src/storage/agent.rs", "pool.mountpoint"),
    ("pools[].vdevs[].type", "services/src/storage/agent.rs", "v.kind.zpool_word()"),
    ("pools[].vdevs[].bays", "services/src/storage/agent.rs", "v.bays"),
    ("pools[].spares", "services/src/storage/agent.rs", "pool.spares"),
    ("datasets", "services/src/storage/agent.rs", "plan.datasets"),
    ("datasets[].name", "services/src/storage/agent.rs", "ds.name"),
    ("datasets[].properties.*", "services/src/storage/agent.rs", "ds.properties"),
    // Datasets mount at EXPORT_ROOT/NAME through the pool's mountpoint; nfs checks each path.
    ("datasets[].mountpoint", "services/src/nfs.rs", "e.path"),
    // Each policy is one round a minute of the snapshots agent; its decisions are pure code.
    ("snapshots", "services/src/snapshots/agent.rs", "plan.snapshots"),
    ("snapshots[].dataset", "services/src/snapshots/mod.rs", "policy.dataset"),
    ("snapshots[].recursive", "services/src/snapshots/agent.rs", "p.recursive"),
    ("snapshots[].frequent_minutes", "services/src/snapshots/mod.rs", "policy.frequent_minutes"),
    ("snapshots[].hold_seconds", "services/src/snapshots/mod.rs", "policy.hold_seconds"),
    ("snapshots[].keep.frequently", "services/src/snapshots/mod.rs", "Kind::Frequently => r.frequently"),
    ("snapshots[].keep.hourly", "services/src/snapshots/mod.rs", "Kind::Hourly => r.hourly"),
    ("snapshots[].keep.daily", "services/src/snapshots/mod.rs", "Kind::Daily => r.daily"),
    ("snapshots[].keep.weekly", "services/src/snapshots/mod.rs", "Kind::Weekly => r.weekly"),
    ("snapshots[].keep.monthly", "services/src/snapshots/mod.rs", "Kind::Monthly => r.monthly"),
    ("replication.identity", "services/src/replication/sshd.rs", "r.identity"),
    ("replication.peers", "services/src/replication/sshd.rs", "r.peers"),
    ("replication.peers[].name", "services/src/replication/sshd.rs", "p.name"),
    ("replication.peers[].address", "services/src/replication/agent.rs", "p.address"),
    ("replication.peers[].key", "services/src/replication/sshd.rs", "p.key.trim()"),
    ("replication.peers[].receive", "services/src/replication/serve.rs", "p.receive.clone()"),
    ("replication.peers[].local_address", "services/src/replication/sshd.rs", "p.local_address"),
    // The link is where the firewall opens SSH for the peer (by its address on that link).
    ("replication.peers[].link", "board/src/plan/firewall.rs", "peer.local_address"),
    ("replication.jobs", "services/src/replication/agent.rs", "r.jobs"),
    ("replication.jobs[].dataset", "services/src/replication/agent.rs", "job.dataset"),
    ("replication.jobs[].peer", "services/src/replication/agent.rs", "job.peer"),
    ("replication.jobs[].target", "services/src/replication/agent.rs", "job.target"),
    ("replication.jobs[].every_minutes", "services/src/replication/agent.rs", "job.every_minutes"),
    ("replication.jobs[].bandwidth_bytes", "services/src/replication/agent.rs", "job.bandwidth_bytes"),
    ("replication.jobs[].lag_alert_seconds", "services/src/health/observe.rs", "j.lag_alert_seconds"),
    ("nfs", "services/src/nfs.rs", "plan.nfs"),
    ("nfs.versions", "services/src/nfs.rs", "nfs.versions"),
    ("nfs.threads", "services/src/nfs.rs", "nfs.threads"),
    ("nfs.tcp_port", "services/src/nfs.rs", "nfs.tcp_port"),
    ("nfs.rdma_port", "services/src/nfs.rs", "nfs.rdma_port"),
    ("nfs.grace_seconds", "services/src/nfs.rs", "nfs.grace_seconds"),
    ("nfs.lease_seconds", "services/src/nfs.rs", "nfs.lease_seconds"),
    ("nfs.rpcbind", "services/src/nfs.rs", "nfs.rpcbind"),
    ("nfs.exports[].dataset", "services/src/nfs.rs", "e.dataset"),
    ("nfs.exports[].path", "services/src/nfs.rs", "e.path"),
    // One export asking for RDMA makes nfsd listen on the RDMA port: resolved into nfs.rdma_port.
    ("nfs.exports[].rdma", "board/src/plan/resolve.rs", "n.exports.iter().any(|e| e.rdma)"),
    // /etc/exports is written from these by NfsPlan::exports_table.
    ("nfs.exports[].clients[].network", "services/src/nfs.rs", "nfs.exports_table_of("),
    ("nfs.exports[].clients[].options", "services/src/nfs.rs", "nfs.exports_table_of("),
    // The watchdog's driver is loaded at boot: resolved into kernel.modules.
    ("health.watchdog_driver", "board/src/plan/resolve.rs", "sets.push(MODULES, &b.watchdog.driver)"),
    ("health.watchdog_identity", "init/src/bin/nasinit.rs", "plan.health.watchdog_identity"),
    ("health.watchdog_timeout_seconds", "init/src/bin/nasinit.rs", "plan.health.watchdog_timeout_seconds"),
    ("health.nvme_temperature_warn_celsius", "services/src/health/checks.rs", "h.nvme_temperature_warn_celsius"),
    ("health.pool_capacity_warn_percent", "services/src/health/checks.rs", "h.pool_capacity_warn_percent"),
    ("health.tenant_quota_warn_percent", "services/src/health/checks.rs", "h.tenant_quota_warn_percent"),
    ("health.nvme_spare_warn_percent", "services/src/health/checks.rs", "h.nvme_spare_warn_percent"),
    ("health.nvme_wear_warn_percent", "services/src/health/checks.rs", "h.nvme_wear_warn_percent"),
    ("health.cpu_temperature_warn_celsius", "services/src/health/checks.rs", "h.cpu_temperature_warn_celsius"),
    ("health.metrics", "services/src/health/agent.rs", "plan.health.metrics"),
    ("health.fatal_grace_seconds", "init/src/supervisor.rs", "plan.health.fatal_grace_seconds"),
    ("health.syslog", "services/src/health/agent.rs", "plan.health.syslog"),
    ("health.syslog[].address", "services/src/health/syslog.rs", "t.address"),
    ("health.syslog[].transport", "services/src/health/syslog.rs", "t.transport"),
    ("health.check_interval_seconds", "services/src/health/agent.rs", "plan.health.check_interval_seconds"),
    ("upgrade.boot_tries", "services/src/upgrade/apply.rs", "plan.upgrade.boot_tries"),
    ("upgrade.min_version", "image/src/bundle.rs", "plan.upgrade.min_version"),
    ("firewall.extra", "board/src/plan/firewall.rs", "plan.firewall.extra"),
    ("firewall.extra[].link", "board/src/plan/firewall.rs", "e.link"),
    ("firewall.extra[].proto", "board/src/plan/firewall.rs", "e.proto"),
    ("firewall.extra[].port", "board/src/plan/firewall.rs", "e.port"),
    ("firewall.extra[].from", "board/src/plan/firewall.rs", "e.from"),
    ("firewall.extra[].why", "board/src/plan/firewall.rs", "e.why"),
    ("upgrade.bless_after_seconds", "services/src/upgrade/mod.rs", "plan.upgrade.bless_after_seconds"),
    ("upgrade.trusted_keys", "services/src/upgrade/apply.rs", "plan.upgrade.trusted_keys"),
    ("upgrade.trusted_keys[].key", "services/src/upgrade/apply.rs", "k.key"),
    // Shown by `nasos plan`; the key itself is what the box checks.
    ("upgrade.trusted_keys[].id", "board/src/plan/display.rs", "k.id"),
    ("upgrade.trusted_keys[].file", "board/src/plan/display.rs", "k.file"),
    ("services[].name", "init/src/machine.rs", "spec.name"),
    ("services[].command", "init/src/supervisor.rs", "spec.command"),
    ("services[].after", "init/src/machine.rs", "spec.after"),
    ("services[].readiness.kind", "init/src/machine.rs", "spec.readiness"),
    ("services[].readiness.command", "init/src/supervisor.rs", "Readiness::Check { command, .. }"),
    ("services[].readiness.interval_ms", "init/src/machine.rs", "interval_ms"),
    ("services[].restart.when", "init/src/machine.rs", "policy.when"),
    ("services[].restart.backoff_initial_ms", "init/src/machine.rs", "policy.backoff_initial_ms"),
    ("services[].restart.backoff_max_ms", "init/src/machine.rs", "policy.backoff_max_ms"),
    ("services[].restart.start_limit", "init/src/machine.rs", "policy.start_limit"),
    ("services[].restart.start_limit_window_ms", "init/src/machine.rs", "policy.start_limit_window_ms"),
    ("services[].stop_command", "init/src/supervisor.rs", "spec.stop_command"),
    ("services[].stop_timeout_ms", "init/src/machine.rs", "spec.stop_timeout_ms"),
    ("services[].start_timeout_ms", "init/src/machine.rs", "spec.start_timeout_ms"),
    ("liveness.ready_deadline_seconds", "init/src/supervisor.rs", "plan.liveness.ready_deadline_seconds"),
    (
        "liveness.failed_boots_before_staying_up",
        "init/src/supervisor.rs",
        "plan.liveness.failed_boots_before_staying_up",
    ),
    ("services[].environment.*", "init/src/supervisor.rs", "spec.environment"),
    ("services[].user", "init/src/supervisor.rs", "spec.user"),
    ("services[].working_directory", "init/src/supervisor.rs", "spec.working_directory"),
    ("services[].boot_nice", "init/src/machine.rs", "spec.boot_nice"),
];

/// Maps whose keys are data, not fields.
const MAPS: &[&str] = &["module_options", "properties", "filesystem", "environment", "tunables"];

fn fields(value: &serde_json::Value, path: &str, out: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::Object(m) => {
            if MAPS.iter().any(|k| path.ends_with(k)) {
                out.insert(format!("{path}.*"));
                return;
            }
            for (k, v) in m {
                // Tagged enums (`{"kind": "check", …}`) keep their tag as a field like any other.
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                fields(v, &p, out);
            }
        }
        serde_json::Value::Array(items) if items.iter().any(|v| v.is_object()) => {
            for v in items {
                fields(v, &format!("{path}[]"), out);
            }
        }
        _ => {
            out.insert(path.to_string());
        }
    }
}

#[test]
fn every_plan_field_has_a_consumer() {
    let repo = nasos_tests::repo();
    let mut seen = BTreeSet::new();
    for recipe in ["qemu-dev", "qemu-client", "ts-h1290fx"] {
        let loaded = nasos_board::load_recipe_file(&repo.join(format!("recipes/{recipe}.toml")))
            .unwrap_or_else(|r| panic!("{recipe}: {r:?}"));
        let json = serde_json::to_value(loaded.plan()).expect("plan json");
        fields(&json, "", &mut seen);
    }
    // A check-readiness service shows every readiness field (no shipped plan has one).
    seen.extend(["services[].readiness.command".to_string(), "services[].readiness.interval_ms".to_string()]);
    let table: BTreeSet<String> = CONSUMERS.iter().map(|(p, _, _)| p.to_string()).collect();
    let unconsumed: Vec<&String> = seen.difference(&table).collect();
    assert!(
        unconsumed.is_empty(),
        "plan fields with no consumer (apply them, or remove them from the plan): {unconsumed:?}"
    );
    let stale: Vec<&String> = table.difference(&seen).collect();
    assert!(stale.is_empty(), "the table names fields the plan no longer has: {stale:?}");
    let mut missing = Vec::new();
    for (field, file, token) in CONSUMERS {
        let text = std::fs::read_to_string(Path::new(&repo).join(file)).unwrap_or_default();
        if !text.contains(token) {
            missing.push(format!("{field}: {file} no longer contains `{token}`"));
        }
    }
    assert!(missing.is_empty(), "consumers that no longer consume:\n  {}", missing.join("\n  "));
}
