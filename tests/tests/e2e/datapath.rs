//! The data path between two VMs on one private QEMU network: the qemu-dev appliance and a
//! stand-in GPU node built from qemu-client.toml (at 10.77.0.130), one check per capability over
//! one pair of boots. The appliance's nasctl shows its pools, exports and fabric; the client is
//! refused an export whose networks leave it out, mounts the training export over RDMA
//! (soft-RoCE) and over TCP, writes, drops its caches, reads back and compares sha256;
//! root_squash holds. Two tenants see only their own exports, one quota stops only its tenant,
//! and the PV `nasos k8s` prints mounts as printed; a krb5p export (KDC on the client) serves
//! a user with a ticket as themselves and nobody else, over RDMA and TCP, after a reboot and
//! after an upgrade, without joining again.
//! nfsd restarted by hand gets its RDMA listener back. The appliance reboots,
//! then loses power with the client mounted: each time the pool is imported, not recreated, and
//! the client finds its data again.

use std::time::Duration;

use nasos_tests::suite::{Shared, Suite};
use nasos_tests::{
    Pair, build_binaries, dev_bundle, digest, host_tool, mount_train, nasos, ok, poll, poll_until, repo,
};

static PAIR: Shared<Pair> = Shared::new("pair::the_appliance_its_client_and_its_dr_twin_become_ready");
/// (path under the export, sha256) of the 64 MiB file replicated to the DR twin.
static REPLICATED: Shared<(String, String)> =
    Shared::new("replication::a_64_mib_file_reaches_the_dr_twin_with_the_same_sha256_within_two_intervals");
/// The appliance's identity as first booted: (machine-id, NVMe host NQN).
static IDENTITY: Shared<(String, String)> = Shared::new("state::first_boot_makes_the_state_partition_and_an_identity");
/// qemu-dev 0.2.0, signed with the development key.
static BUNDLE: Shared<std::path::PathBuf> = Shared::new("build::a_signed_0_2_0_bundle");
/// A scratch snapshot the policy holds, with the time its hold ends.
static HELD: Shared<(String, u64)> =
    Shared::new("snapshots::a_held_snapshot_cannot_be_destroyed_or_released_before_its_time");
/// The sha256 of the file alice wrote through the krb5p export.
static ALICE: Shared<String> =
    Shared::new("kerberos::a_krb5p_export_over_rdma_serves_a_user_with_a_ticket_as_themselves_only");
/// (file name, sha256) of what the client wrote.
static WRITTEN: Shared<Vec<(String, String)>> = Shared::new("nfs::rdma_and_tcp_round_trip_with_root_squash");

pub fn suite() -> Suite {
    let mut s = Suite::new("datapath");
    // Built before the VMs run (the build would slow them): the upgrade the box takes later.
    s.check("build::a_signed_0_2_0_bundle", || {
        build_binaries();
        BUNDLE.set(dev_bundle("0.2.0", ""))
    });
    s.check("pair::the_appliance_its_client_and_its_dr_twin_become_ready", || {
        PAIR.set(Pair::start_with_dr(&repo().join("build/e2e/datapath")))
    });
    s.check("state::first_boot_makes_the_state_partition_and_an_identity", first_boot_state);
    s.check("views::nasctl_shows_pools_exports_and_fabric", views);
    s.check("firewall::only_the_ports_the_plan_serves_answer", firewall);
    s.check("nfs::an_export_refuses_a_client_outside_its_networks", refused_client);
    s.check("tenants::each_tenant_mounts_and_sees_only_its_own_export_and_a_full_quota_stops_one", tenants);
    s.check("kerberos::a_krb5p_export_over_rdma_serves_a_user_with_a_ticket_as_themselves_only", kerberos);
    s.check("nfs::rdma_and_tcp_round_trip_with_root_squash", round_trip);
    s.check("nfs::a_restarted_nfsd_gets_its_rdma_listener_back", nfsd_restart);
    s.check("nfs::an_unmounted_dataset_is_not_exported", unmounted_not_exported);
    s.check("replication::a_64_mib_file_reaches_the_dr_twin_with_the_same_sha256_within_two_intervals", replicated);
    s.check("replication::a_link_cut_mid_send_resumes_from_its_token_and_ends_equal", link_cut_resumes);
    s.check("replication::the_common_snapshot_is_held_on_both_sides_and_only_the_peer_key_gets_in", common_held);
    s.check("snapshots::a_held_snapshot_cannot_be_destroyed_or_released_before_its_time", held_snapshot);
    s.check("snapshots::manual_snapshots_and_a_confirmed_rollback", manual_and_rollback);
    s.check("lifecycle::a_reboot_imports_the_pool_and_the_data_is_there", reboot);
    s.check(
        "kerberos::after_a_reboot_the_krb5p_export_serves_over_rdma_and_tcp_without_joining_again",
        kerberos_after_reboot,
    );
    s.check("lifecycle::a_power_cut_with_the_client_mounted_loses_nothing", power_cut);
    s.check("upgrade::a_bundle_served_over_http_by_the_client_is_applied", http_apply);
    s.check("lifecycle::ctrl_alt_del_is_an_orderly_reboot", ctrl_alt_del);
    s.check("upgrade::the_box_runs_0_2_0_blessed_with_its_pool_identity_and_exports", upgraded);
    s.check("kerberos::after_the_upgrade_the_keytab_is_still_joined", kerberos_after_upgrade);
    // Minutes after the client wrote its files, with reboots between: a frequent snapshot has them.
    s.check("snapshots::a_file_the_client_deleted_is_read_back_from_zfs_snapshot_over_rdma", restore_from_snapshot);
    s.check("health::a_pulled_bay_is_named_within_10s_on_every_channel", pulled_bay);
    s.check("health::a_hot_spare_takes_over_the_pulled_bay_without_a_command", hot_spare);
    s.check("health::an_nvme_critical_warning_is_critical_for_its_bay", critical_warning);
    s.check("health::a_second_bay_of_the_vdev_pulled_during_rdma_reads_loses_nothing", second_pull_during_reads);
    // A failover ends the replication; the primary warns once its lag passes 2 minutes, which
    // the checks between here and the last one give it.
    s.check("replication::after_promote_the_dr_twin_serves_the_copy_read_write_over_rdma", promote);
    s.check("health::replace_takes_a_blank_disk_in_the_pulled_bay_and_resilvers", replace_bay);
    // Last, minutes after the first snapshots: what the policies kept.
    s.check("snapshots::a_minutely_policy_keeping_3_keeps_exactly_3_in_time_order", policy_kept_three);
    s.check("snapshots::held_snapshots_go_once_their_time_has_passed", held_snapshots_go);
    s.check("replication::a_replica_left_behind_raises_an_alert_and_json_reports_the_lag", late_replica);
    s.teardown(|| {
        if let Some(pair) = PAIR.take() {
            pair.kill();
        }
    });
    s
}

fn status(nas: &mut nasos_qemu::Vm) -> serde_json::Value {
    json(&ok(nas, "nasctl status --json"))
}

/// The first boot made the state partition's filesystem and this box's identity.
fn first_boot_state() {
    PAIR.with(|Pair { nas, .. }| {
        let st = status(nas);
        assert_eq!(st["boot"], 1, "{st}");
        assert_eq!(st["last_boot"], "", "{st}");
        assert!(st["state_partition"].as_str().is_some_and(|s| s.ends_with("(made this boot)")), "{st}");
        let mounted = ok(nas, "findmnt -n -o SOURCE,FSTYPE,OPTIONS /var/lib/nasos");
        assert!(mounted.contains("ext4") && mounted.contains("rw"), "{mounted}");
        let machine_id = ok(nas, "cat /etc/machine-id").trim().to_string();
        assert!(machine_id.len() == 32 && machine_id.bytes().all(|b| b.is_ascii_hexdigit()), "{machine_id}");
        let nqn = ok(nas, "cat /etc/nvme/hostnqn").trim().to_string();
        assert!(nqn.starts_with("nqn.2014-08.org.nvmexpress:uuid:"), "{nqn}");
        let nfs = ok(nas, "findmnt -n -o SOURCE /var/lib/nfs");
        assert!(nfs.contains("/nfs"), "NFS state is not on the state partition: {nfs}");
        IDENTITY.set((machine_id, nqn));
    });
}

fn views() {
    PAIR.with(|Pair { nas, .. }| {
        // What runs, as nasctl shows it.
        let pools = json(&ok(nas, "nasctl pools --json"));
        let tank = &pools[0];
        assert_eq!(tank["name"], "tank");
        assert_eq!(tank["state"], "ONLINE");
        let bays: Vec<&str> =
            tank["members"].as_array().expect("members").iter().filter_map(|m| m["disk"].as_str()).collect();
        assert_eq!(bays, (1..=12).map(|i| format!("BAY{i:02}")).collect::<Vec<_>>(), "{tank}");
        let spares: Vec<(&str, &str)> = tank["members"]
            .as_array()
            .expect("members")
            .iter()
            .filter(|m| m["group"] == "spare")
            .filter_map(|m| Some((m["disk"].as_str()?, m["state"].as_str()?)))
            .collect();
        assert_eq!(spares, [("BAY11", "AVAIL"), ("BAY12", "AVAIL")], "{tank}");
        assert!(tank["guid"].as_u64().is_some_and(|g| g > 0), "{tank}");
        let train = tank["datasets"].as_array().expect("datasets").iter().find(|d| d["name"] == "tank/train").cloned();
        assert_eq!(train.as_ref().map(|d| d["mounted"].clone()), Some(serde_json::Value::Bool(true)), "{tank}");
        let exports = json(&ok(nas, "nasctl exports --json"));
        let listeners = exports["listeners"].to_string();
        assert!(
            listeners.contains("\"rdma\"") && listeners.contains("20049") && listeners.contains("2049"),
            "{exports}"
        );
        assert!(exports["threads"].as_u64().is_some_and(|t| t > 0), "{exports}");
        let train_export = exports["exports"]
            .as_array()
            .expect("exports")
            .iter()
            .find(|e| e["path"] == "/export/tank/train")
            .cloned()
            .unwrap_or_else(|| panic!("train not exported: {exports}"));
        assert_eq!(train_export["client"], "10.77.0.0/24");
        assert!(train_export["options"].to_string().contains("root_squash"), "{train_export}");
        let fabric = json(&ok(nas, "nasctl fabric --json"));
        let data0 = &fabric[0];
        assert_eq!(data0["link"], "data0");
        assert_eq!(data0["mtu"], 9000);
        let port = &data0["rdma"][0];
        assert!(port["state"].as_str().is_some_and(|s| s.contains("ACTIVE")), "{data0}");
        assert!(
            port["gids"].to_string().contains("0000:0000:0000:0000:0000:ffff:0a4d:0001"),
            "no RoCE v2 GID: {data0}"
        );
        assert_eq!(data0["dcb"]["state"], "not-supported", "{data0}");
    });
}

/// Every TCP port the appliance listens on is probed from the client: only NFS (2049) and the
/// metrics (9100) answer. nfsd is made to listen on one more port (2050, not in the plan) so
/// there is a listener the firewall must hide; `nasctl firewall` shows the rules and the drops.
fn firewall() {
    PAIR.with(|Pair { nas, gpu, .. }| {
        // nfsd itself listens only on the data address, over TCP and RDMA (no wildcard socket).
        let nfs_tcp = ok(nas, "ss -Htln 'sport = :2049' | awk '{print $4}'");
        assert_eq!(nfs_tcp.split_whitespace().collect::<Vec<_>>(), ["10.77.0.1:2049"], "{nfs_tcp}");
        let bound = ok(nas, "nfsdctl listener | sort");
        assert_eq!(bound.split_whitespace().collect::<Vec<_>>(), ["rdma:10.77.0.1:20049", "tcp:10.77.0.1:2049"]);
        // UDP: nothing listens beyond the loopback but RoCE v2 (soft-RoCE's socket, 4791).
        let udp = ok(nas, "ss -Huln | awk '{print $4}'");
        let exposed: Vec<&str> = udp
            .split_whitespace()
            .filter(|a| !a.starts_with("127.") && !a.starts_with("[::1]") && !a.ends_with(":4791"))
            .collect();
        assert!(exposed.is_empty(), "UDP sockets beyond the plan: {exposed:?} (all: {udp})");
        // A socket nothing planned: the firewall keeps it unreachable.
        ok(nas, "echo 'tcp 2050' > /proc/fs/nfsd/portlist");
        let listening = ok(nas, "ss -Htln | awk '{print $4}' | sed 's/.*://' | sort -un");
        let ports: Vec<u16> = listening.lines().filter_map(|l| l.trim().parse().ok()).collect();
        assert!(ports.contains(&2050) && ports.contains(&2049), "{listening}");
        let probe: Vec<String> = ports.iter().map(|p| p.to_string()).collect();
        let answered = ok(
            gpu,
            &format!(
                "for p in {}; do timeout 3 bash -c \"</dev/tcp/10.77.0.1/$p\" 2>/dev/null && echo open $p; done; true",
                probe.join(" ")
            ),
        );
        let open: Vec<&str> = answered.lines().filter_map(|l| l.strip_prefix("open ")).map(str::trim).collect();
        assert_eq!(open, ["2049", "9100"], "probed {probe:?}: {answered}");
        let rules = ok(nas, "nasctl firewall");
        assert!(rules.contains("policy drop") && rules.contains("comment \"NFS\""), "{rules}");
        let dropped = rules
            .lines()
            .find(|l| l.contains("comment \"dropped\""))
            .and_then(|l| l.split("packets ").nth(1))
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no drop counter: {rules}"));
        assert!(dropped > 0, "{rules}");
    });
}

fn refused_client() {
    PAIR.with(|Pair { gpu, .. }| {
        // An export whose networks leave the client out refuses it: scratch is for 10.77.0.0/25.
        let (out, code) = gpu
            .run(
                "mkdir -p /tmp/mnt-x && mount -t nfs -o vers=4.2,proto=tcp,soft,timeo=50,retrans=2 10.77.0.1:/export/tank/scratch /tmp/mnt-x",
                Duration::from_secs(300),
            )
            .expect("mount attempt");
        assert_ne!(code, 0, "10.77.0.130 mounted an export for 10.77.0.0/25: {out}");
        // NFSv4 refuses by not showing the export in this client's pseudo-filesystem; the path is
        // there (scratch is mounted on the appliance), so "no such file" is the server's refusal.
        assert!(
            out.contains("access denied") || out.contains("reason given by server: No such file or directory"),
            "{out}"
        );
    });
    // The path is there: scratch is mounted on the appliance, so the refusal is the server's.
    PAIR.with(|Pair { nas, .. }| {
        let pools = json(&ok(nas, "nasctl pools --json"));
        let tank = &pools[0];
        let scratch =
            tank["datasets"].as_array().expect("datasets").iter().find(|d| d["name"] == "tank/scratch").cloned();
        assert_eq!(scratch.map(|d| d["mounted"].clone()), Some(serde_json::Value::Bool(true)), "{tank}");
    });
}

/// Mounts `path` over RDMA at `dir`, or says why not (`Err` with the mount's output).
fn mount_rdma(gpu: &mut nasos_qemu::Vm, path: &str, dir: &str) -> Result<(), String> {
    let (out, code) = gpu
        .run(
            &format!("mkdir -p {dir} && mount -t nfs -o vers=4.2,proto=rdma,port=20049,soft,timeo=50,retrans=2 10.77.0.1:{path} {dir}"),
            Duration::from_secs(300),
        )
        .expect("mount attempt");
    if code == 0 { Ok(()) } else { Err(out) }
}

/// What this client sees of the teams in the NFSv4 pseudo-filesystem.
fn teams_seen(gpu: &mut nasos_qemu::Vm) -> Vec<String> {
    ok(gpu, "mkdir -p /tmp/pseudo && mount -t nfs -o vers=4.2,proto=rdma,port=20049 10.77.0.1:/ /tmp/pseudo");
    let seen = ok(gpu, "ls /tmp/pseudo/export/tank/teams; ls /tmp/pseudo/export/tank | sed 's/^/tank:/'");
    ok(gpu, "umount /tmp/pseudo");
    seen.split_whitespace().map(String::from).collect()
}

/// Two tenants, one client that changes networks. From vision's network (10.77.0.130) the
/// client mounts vision's export over RDMA, sees neither speech's export nor scratch (not
/// offered to it) in the pseudo-filesystem, cannot mount speech's, and gets EDQUOT once
/// vision's 64M are full. From speech's network (10.77.0.200) the reverse holds, and speech
/// writes on, as its one account (3000:3000), while vision is full.
fn tenants() {
    PAIR.with(|Pair { nas, gpu, .. }| {
        // Vision's side: the client's own address, 10.77.0.130.
        let seen = teams_seen(gpu);
        assert!(seen.contains(&"vision".to_string()) && !seen.contains(&"speech".to_string()), "{seen:?}");
        assert!(seen.contains(&"tank:train".to_string()) && !seen.contains(&"tank:scratch".to_string()), "{seen:?}");
        let refused =
            mount_rdma(gpu, "/export/tank/teams/speech", "/tmp/mnt-speech").expect_err("speech from vision's network");
        assert!(refused.contains("No such file or directory") || refused.contains("access denied"), "{refused}");
        ok(nas, "install -d -o 1000 -g 1000 /export/tank/teams/vision/work");
        mount_rdma(gpu, "/export/tank/teams/vision", "/tmp/mnt-vision").expect("vision mounts over RDMA");
        assert!(ok(gpu, "grep ' /tmp/mnt-vision ' /proc/mounts").contains("proto=rdma"));
        let as_user = "setpriv --reuid=1000 --regid=1000 --clear-groups";
        ok(gpu, &format!("{as_user} dd if=/dev/urandom of=/tmp/mnt-vision/work/model bs=1M count=4 status=none"));
        let model = digest(&ok(gpu, "sha256sum < /tmp/mnt-vision/work/model"));
        let (out, code) = gpu
            .run(
                &format!(
                    "{as_user} dd if=/dev/urandom of=/tmp/mnt-vision/work/fill bs=1M count=96 oflag=direct status=none"
                ),
                Duration::from_secs(600),
            )
            .expect("fill vision");
        assert_ne!(code, 0, "96M went into a 64M quota: {out}");
        assert!(out.contains("Disk quota exceeded"), "{out}");
        ok(gpu, "umount /tmp/mnt-vision");

        // The PersistentVolume `nasos k8s` prints for vision, mounted as the CSI driver would:
        // its server, its share, exactly its mount options.
        let list: serde_json::Value =
            serde_json::from_str(&nasos(&["k8s", "recipes/qemu-dev.toml", "--tenant", "vision"]).stdout).expect("k8s");
        let pv: k8s_openapi::api::core::v1::PersistentVolume = list["items"]
            .as_array()
            .expect("items")
            .iter()
            .find(|i| {
                i["kind"] == "PersistentVolume" && i["metadata"]["name"].as_str().is_some_and(|n| n.ends_with("-rdma"))
            })
            .map(|v| serde_json::from_value(v.clone()).expect("a PersistentVolume"))
            .expect("an RDMA PersistentVolume");
        let spec = pv.spec.expect("spec");
        let csi = spec.csi.expect("csi");
        let attr = |k: &str| csi.volume_attributes.as_ref().and_then(|a| a.get(k)).cloned().expect(k);
        let options = spec.mount_options.expect("mount options").join(",");
        ok(
            gpu,
            &format!(
                "mkdir -p /tmp/mnt-pv && mount -t nfs -o {options} {}:{} /tmp/mnt-pv",
                attr("server"),
                attr("share")
            ),
        );
        assert!(ok(gpu, "grep ' /tmp/mnt-pv ' /proc/mounts").contains("proto=rdma"));
        assert_eq!(digest(&ok(gpu, "sha256sum < /tmp/mnt-pv/work/model")), model, "read through the PV's mount");
        ok(gpu, "umount /tmp/mnt-pv");

        // Speech's side: the client takes 10.77.0.200 and reaches the box from there.
        ok(gpu, "ip addr add 10.77.0.200/24 dev data0 && ip route replace 10.77.0.1/32 dev data0 src 10.77.0.200");
        let seen = teams_seen(gpu);
        assert!(seen.contains(&"speech".to_string()) && !seen.contains(&"vision".to_string()), "{seen:?}");
        let refused =
            mount_rdma(gpu, "/export/tank/teams/vision", "/tmp/mnt-vision").expect_err("vision from speech's network");
        assert!(refused.contains("No such file or directory") || refused.contains("access denied"), "{refused}");
        mount_rdma(gpu, "/export/tank/teams/speech", "/tmp/mnt-speech").expect("speech mounts over RDMA");
        ok(gpu, "dd if=/dev/urandom of=/tmp/mnt-speech/notes bs=1M count=8 oflag=direct status=none");
        let local = digest(&ok(gpu, "sha256sum < /tmp/mnt-speech/notes"));
        ok(gpu, "umount /tmp/mnt-speech");
        ok(gpu, "ip route del 10.77.0.1/32 && ip addr del 10.77.0.200/24 dev data0");
        assert_eq!(digest(&ok(nas, "sha256sum < /export/tank/teams/speech/notes")), local);
        // Client root wrote it; squash = "all" made it the tenant's account's.
        assert_eq!(ok(nas, "stat -c %u:%g /export/tank/teams/speech/notes").trim(), "3000:3000");

        // What the operator sees: vision at its quota, speech with its 8M.
        // ZFS accounts a write when its transaction group syncs (seconds later).
        let used = |list: &serde_json::Value, name: &str| {
            list.as_array().expect("tenants").iter().find(|t| t["name"] == name).cloned().expect(name)
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let (vision, speech) = loop {
            let list = json(&ok(nas, "nasctl tenants --json"));
            let (v, s) = (used(&list, "vision"), used(&list, "speech"));
            let settled =
                v["used"].as_u64().is_some_and(|u| u > 60 << 20) && s["used"].as_u64().is_some_and(|u| u >= 8 << 20);
            if settled || std::time::Instant::now() > deadline {
                break (v, s);
            }
            std::thread::sleep(Duration::from_secs(2));
        };
        assert_eq!(vision["quota"], 64u64 << 20, "{vision}");
        assert!(vision["used"].as_u64().is_some_and(|u| u > 60 << 20), "{vision}");
        assert!(speech["used"].as_u64().is_some_and(|u| u >= 8 << 20), "{speech}");
        let table = ok(nas, "nasctl tenants");
        assert!(table.lines().any(|l| l.starts_with("vision") && l.contains("64.0M")), "{table}");
        let metrics = poll(
            gpu,
            "curl -sfS --max-time 10 http://10.77.0.1:9100/metrics | grep '^nasos_tenant_quota_bytes'",
            "tenant=\"vision\"",
            Duration::from_secs(60),
        );
        assert!(metrics.contains("67108864"), "{metrics}");
        // Health warns of the tenant at its quota, before its team hears of it.
        let h = poll(nas, "nasctl health", "tenant vision: ", Duration::from_secs(60));
        assert!(
            h.lines().any(|l| l.trim_start().starts_with("WARNING")
                && l.contains("tenant vision: ")
                && l.contains("of its quota used")),
            "{h}"
        );
        // Room for the checks after this one; the warning then ends.
        ok(nas, "rm /export/tank/teams/vision/work/fill");
        // (Its alerts stay in the history: judge the report's checks, then the "ok again".)
        let warned = |h: &serde_json::Value| {
            h["report"]["checks"].as_array().is_some_and(|c| c.iter().any(|c| c["id"] == "tenant.vision.quota"))
        };
        let h = poll_json(nas, "nasctl health --json", |h| !warned(h), Duration::from_secs(60));
        assert!(!warned(&h), "{h}");
        let alerts = h["alerts"].as_array().expect("alerts");
        assert!(alerts.iter().any(|a| a["id"] == "tenant.vision.quota" && a["to"] == "ok"), "{h}");
    });
}

/// The realm's KDC on the client, as an administrator sets one up with Debian's krb5-kdc.
const KDC_SETUP: &str = r#"set -e
cat > /etc/krb5.conf <<'EOF'
[libdefaults]
	default_realm = NASOS.TEST
	dns_lookup_kdc = false
	dns_lookup_realm = false
	dns_canonicalize_hostname = false
	rdns = false
[realms]
	NASOS.TEST = {
		kdc = 127.0.0.1
		admin_server = 127.0.0.1
	}
[domain_realm]
	.nasos.test = NASOS.TEST
EOF
mkdir -p /etc/krb5kdc /var/lib/krb5kdc
cat > /etc/krb5kdc/kdc.conf <<'EOF'
[realms]
	NASOS.TEST = {
		database_name = /var/lib/krb5kdc/principal
		key_stash_file = /etc/krb5kdc/stash
	}
EOF
echo '10.77.0.1 nasos-dev.nasos.test' >> /etc/hosts
kdb5_util create -s -r NASOS.TEST -P master-password-of-the-test-realm >/dev/null
krb5kdc
for p in nfs/nasos-dev.nasos.test root alice; do kadmin.local -q "addprinc -randkey $p" >/dev/null; done
kadmin.local -q 'ktadd -k /tmp/box.keytab nfs/nasos-dev.nasos.test' >/dev/null
kadmin.local -q 'ktadd -k /tmp/root.keytab root' >/dev/null
kadmin.local -q 'ktadd -k /tmp/alice.keytab alice' >/dev/null
id alice >/dev/null 2>&1 || useradd -M -u 1001 alice
id bob >/dev/null 2>&1 || useradd -M -u 1002 bob
chown alice /tmp/alice.keytab
kinit -k -t /tmp/root.keytab root
mountpoint -q /run/rpc_pipefs || { mkdir -p /run/rpc_pipefs; mount -t rpc_pipefs sunrpc /run/rpc_pipefs; }
rpc.gssd -n
echo kdc-ready"#;

const KRB5P_RDMA: &str = "vers=4.2,proto=rdma,port=20049,sec=krb5p";
const KRB5P_TCP: &str = "vers=4.2,proto=tcp,sec=krb5p";
const AS_ALICE: &str = "setpriv --reuid=1001 --regid=1001 --clear-groups";

/// Mounts the krb5p export at /tmp/mnt-krb with `opts` (retrying while nfsd is in its grace
/// period) and checks the transport it rides.
fn mount_krb5p(gpu: &mut nasos_qemu::Vm, opts: &str) {
    let proto = if opts.contains("proto=rdma") { "proto=rdma" } else { "proto=tcp" };
    let mounted = poll_until(
        gpu,
        &format!(
            "mountpoint -q /tmp/mnt-krb || mount -t nfs -o {opts} nasos-dev.nasos.test:/export/tank/secure /tmp/mnt-krb; grep ' /tmp/mnt-krb ' /proc/mounts; true"
        ),
        |o| o.contains("sec=krb5p"),
        Duration::from_secs(180),
    );
    if !(mounted.contains(proto) && mounted.contains("sec=krb5p")) {
        // Not left mounted: Linux's NFSv4 client would carry the checks after this one's RDMA
        // mounts of the box over this mount's connection.
        let _ = gpu.run("umount /tmp/mnt-krb", Duration::from_secs(60));
        panic!("the krb5p mount is not {proto}: {mounted}");
    }
}

/// A KDC on the client (Debian's krb5-kdc), the box's keytab joined once with `nasctl kerberos
/// join`. The krb5p export mounts over RDMA; alice, with a ticket, writes a file that is hers
/// (uid 1001) on the box; bob, without one, is refused; a sec=sys mount is refused.
fn kerberos() {
    let sum = PAIR.with(|Pair { nas, gpu, .. }| {
        // As a file, not typed into the console: an interactive shell takes a heredoc's tabs
        // for completion, and `set -e` would end the login shell.
        ok(gpu, "rm -f /tmp/kdc.sh");
        for chunk in KDC_SETUP.as_bytes().chunks(100) {
            let escaped: String = chunk.iter().map(|b| format!("\\x{b:02x}")).collect();
            ok(gpu, &format!("printf '{escaped}' >> /tmp/kdc.sh"));
        }
        let setup = ok(gpu, "bash /tmp/kdc.sh 2>&1");
        assert!(setup.contains("kdc-ready"), "{setup}");
        // Before the join the box says what is missing.
        let before = ok(nas, "nasctl kerberos");
        assert!(before.contains("realm      NASOS.TEST") && before.contains("none yet"), "{before}");
        // The keytab travels as an operator's would: copied onto the box, then joined.
        // One line, and a newline after it: the console's framing needs the line ended.
        let keytab = ok(gpu, "base64 -w0 /tmp/box.keytab; echo");
        let keytab = keytab.split_whitespace().find(|w| w.len() > 40).expect("the keytab in base64");
        ok(nas, &format!("echo {keytab} | base64 -d > /tmp/box.keytab"));
        let joined = ok(nas, "nasctl kerberos join /tmp/box.keytab");
        assert!(joined.contains("NFS accepts tickets for nfs/nasos-dev.nasos.test@NASOS.TEST"), "{joined}");
        poll(nas, "nasctl logs nfs", "kerberos: accepting tickets for nfs/nasos-dev.nasos.test@NASOS.TEST", Duration::from_secs(120));
        let shown = json(&ok(nas, "nasctl kerberos --json"));
        assert_eq!(shown["principal"], "nfs/nasos-dev.nasos.test@NASOS.TEST", "{shown}");
        ok(nas, "install -d -o 1001 -g 1001 /export/tank/secure/alice");

        // sys is not offered: a client without Kerberos is refused.
        let (out, code) = gpu
            .run(
                "mkdir -p /tmp/mnt-krb && mount -t nfs -o vers=4.2,proto=rdma,port=20049,sec=sys,soft,retrans=2 nasos-dev.nasos.test:/export/tank/secure /tmp/mnt-krb",
                Duration::from_secs(300),
            )
            .expect("sys mount attempt");
        assert_ne!(code, 0, "a sec=sys mount of a krb5p export: {out}");
        mount_krb5p(gpu, KRB5P_RDMA);
        let wrote = ok(
            gpu,
            &format!("{AS_ALICE} sh -c 'kinit -k -t /tmp/alice.keytab alice && dd if=/dev/urandom of=/tmp/mnt-krb/alice/data bs=1M count=4 status=none && sha256sum < /tmp/mnt-krb/alice/data'"),
        );
        let sum = digest(&wrote);
        assert_eq!(ok(nas, "stat -c %u:%g /export/tank/secure/alice/data").trim(), "1001:1001", "alice's file is hers");
        assert_eq!(digest(&ok(nas, "sha256sum < /export/tank/secure/alice/data")), sum);
        // bob has no ticket: nothing of the export is his to see.
        let (out, code) = gpu
            .run("setpriv --reuid=1002 --regid=1002 --clear-groups ls /tmp/mnt-krb/alice", Duration::from_secs(120))
            .expect("bob");
        assert_ne!(code, 0, "bob read the krb5p export without a ticket: {out}");
        ok(gpu, "umount /tmp/mnt-krb");
        sum
    });
    ALICE.set(sum);
}

/// Alice reads her file through a krb5p mount over `opts`, as herself.
fn alice_reads(gpu: &mut nasos_qemu::Vm, opts: &str, sum: &str, when: &str) {
    mount_krb5p(gpu, opts);
    let read = ok(gpu, &format!("{AS_ALICE} sh -c 'sha256sum < /tmp/mnt-krb/alice/data'"));
    assert_eq!(digest(&read), sum, "alice's file {when} over {opts}");
    ok(gpu, "umount /tmp/mnt-krb");
}

/// The keytab is on the state partition: after the reboot the box accepts tickets again
/// without a join, and alice reads her file over RDMA and over TCP.
fn kerberos_after_reboot() {
    let sum = ALICE.get();
    PAIR.with(|Pair { nas, gpu, .. }| {
        let log = poll(nas, "nasctl logs nfs", "kerberos: accepting tickets", Duration::from_secs(60));
        assert!(log.contains("nfs/nasos-dev.nasos.test@NASOS.TEST"), "{log}");
        // The reboot check leaves the train export mounted over TCP (the power cut's check mounts
        // it again if not). Linux's NFSv4 client finds it is the same server and would ride that
        // TCP connection with this mount too, whatever its proto says.
        ok(gpu, "umount /tmp/mnt-tcp 2>/dev/null; true");
        alice_reads(gpu, KRB5P_RDMA, &sum, "after the reboot");
        alice_reads(gpu, KRB5P_TCP, &sum, "after the reboot");
    });
}

/// The upgrade replaced the root filesystem, not the state partition: 0.2.0 serves the krb5p
/// export with the keytab joined under 0.1.0.
fn kerberos_after_upgrade() {
    let sum = ALICE.get();
    PAIR.with(|Pair { nas, gpu, .. }| {
        let shown = json(&ok(nas, "nasctl kerberos --json"));
        assert_eq!(shown["principal"], "nfs/nasos-dev.nasos.test@NASOS.TEST", "{shown}");
        alice_reads(gpu, KRB5P_RDMA, &sum, "after the upgrade");
    });
}

fn round_trip() {
    let written = PAIR.with(|Pair { nas, gpu, .. }| {
        // A directory a non-root user owns (root is squashed).
        ok(nas, "install -d -o 1000 -g 1000 /export/tank/train/job");

        // One transport at a time: an NFSv4.1+ client trunks a second mount of the same server onto
        // the transport it already has, so a TCP mount beside an RDMA one would ride RDMA too.
        let mut written = Vec::new();
        for m in ["rdma", "tcp"] {
            let dir = format!("/tmp/mnt-{m}");
            mount_train(gpu, m, &dir);
            let blob = format!("{dir}/job/blob-{m}");
            let as_user = "setpriv --reuid=1000 --regid=1000 --clear-groups";
            ok(gpu, &format!("{as_user} dd if=/dev/urandom of={blob} bs=1M count=16 status=none"));
            let local = digest(&ok(gpu, &format!("sync; sha256sum < {blob}")));
            ok(gpu, "sync; echo 3 > /proc/sys/vm/drop_caches");
            let again = digest(&ok(gpu, &format!("sha256sum < {blob}")));
            assert_eq!(local, again, "{m}: the data read back differs");
            let there = digest(&ok(nas, &format!("sha256sum < /export/tank/train/job/blob-{m}")));
            assert_eq!(local, there, "{m}: the appliance holds different bytes");
            // root_squash: root on the client cannot write as root.
            let (out, code) = gpu.run(&format!("touch {dir}/rootfile"), Duration::from_secs(120)).expect("touch");
            assert_ne!(code, 0, "root wrote through root_squash on {m}: {out}");
            assert!(out.contains("Permission denied"), "{out}");
            ok(gpu, &format!("umount {dir}"));
            written.push((format!("blob-{m}"), local));
        }
        written
    });
    WRITTEN.set(written);
}

fn nfsd_restart() {
    let written = WRITTEN.get();
    PAIR.with(|Pair { nas, gpu, .. }| {
        // nfsd restarted behind the service's back comes up with TCP only; the RDMA listener is
        // put back, and an RDMA client reads again.
        ok(nas, "echo 0 > /proc/fs/nfsd/threads; echo 8 > /proc/fs/nfsd/threads");
        let portlist = poll(nas, "cat /proc/fs/nfsd/portlist", "rdma 20049", Duration::from_secs(30));
        assert!(portlist.contains("rdma 20049"), "the RDMA listener was not re-added: {portlist}");
        // The service logs after it re-adds; nasinit collects the line a moment later.
        let log = poll(nas, "nasctl logs nfs", "re-added rdma 20049", Duration::from_secs(10));
        assert!(log.contains("re-added rdma 20049"), "{log}");
        mount_train(gpu, "rdma", "/tmp/mnt-rdma");
        assert_eq!(digest(&ok(gpu, "sha256sum < /tmp/mnt-rdma/job/blob-rdma")), written[0].1);
        ok(gpu, "umount /tmp/mnt-rdma");
    });
}

/// A dataset that is not mounted leaves only the tmpfs under its path: its export stays off and
/// the NFS service says why; mounted again, it is served again.
fn unmounted_not_exported() {
    PAIR.with(|Pair { nas, .. }| {
        ok(nas, "zfs set canmount=noauto tank/scratch && zfs unmount tank/scratch && mkdir -p /export/tank/scratch");
        ok(nas, "nasctl restart nfs");
        let log = poll(nas, "nasctl logs nfs", "export of tank/scratch stays off", Duration::from_secs(60));
        assert!(
            log.contains("export of tank/scratch stays off: tank/scratch is not mounted at /export/tank/scratch"),
            "{log}"
        );
        let exports = poll(nas, "exportfs -v", "/export/tank/train", Duration::from_secs(60));
        assert!(exports.contains("/export/tank/train"), "{exports}");
        assert!(!exports.contains("/export/tank/scratch"), "the tmpfs under scratch is exported: {exports}");
        ok(nas, "zfs set canmount=on tank/scratch && zfs mount tank/scratch && nasctl restart nfs");
        let exports = poll(nas, "exportfs -v", "/export/tank/scratch", Duration::from_secs(60));
        assert!(exports.contains("/export/tank/scratch"), "{exports}");
    });
}

fn reboot() {
    let written = WRITTEN.get();
    PAIR.with(|Pair { nas, gpu, .. }| {
        // The appliance reboots: its pool is imported from the bays, not created again, and the
        // client reads what it wrote before. A lock the client holds over RDMA is reclaimed in
        // the grace period (nfsd's client records are on the state partition).
        // nfsd keeps its client records through nfsdcld: the kernel's legacy tracking would drop,
        // when a grace period ends, the record of a client that first came during it, and this
        // client comes during the grace period the nfs restart of the check before began.
        let tracking = ok(nas, "dmesg | grep -i 'client tracking' | tail -1");
        assert!(tracking.contains("nfsdcld"), "nfsd does not track clients through nfsdcld: {tracking}");
        mount_train(gpu, "rdma", "/tmp/mnt-lock");
        ok(gpu, "setpriv --reuid=1000 --regid=1000 --clear-groups sh -c 'nohup flock -o /tmp/mnt-lock/job/lockfile sleep 100000 >/dev/null 2>&1 & echo $! > /tmp/lock.pid'");
        // flock holds the lock; -o keeps the file out of its child (sleep), so killing flock lets
        // the mount go. The lock as the appliance's kernel holds it, by the file's inode.
        // The open may wait out a grace period (nfsd was restarted by the check before).
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        let inode = loop {
            let out = ok(nas, "stat -c %i /export/tank/train/job/lockfile 2>/dev/null || true");
            if out.trim().parse::<u64>().is_ok() || std::time::Instant::now() > deadline {
                break out;
            }
            std::thread::sleep(Duration::from_secs(1));
        };
        assert!(inode.trim().parse::<u64>().is_ok(), "no lock file on the appliance: {inode:?}");
        let inode = format!(":{} ", inode.trim());
        let held = poll(nas, "cat /proc/locks", &inode, Duration::from_secs(30));
        assert!(held.contains(&inode), "the client's lock is not on the appliance ({inode}): {held}");
        eprintln!("client records before the reboot:\n{}", ok(nas, "ls -la /var/lib/nfs/nfsdcld; findmnt /var/lib/nfs"));
        // Through the firmware (`--firmware`): the appliance suite checks the fast reboot.
        nas.send_line("nasctl reboot --firmware").expect("reboot");
        let said = nas.wait_for("reboot: ", Duration::from_secs(120)).expect("nasctl says which reboot");
        assert!(said.contains("reboot: through the firmware"), "{said}");
        nas.expect_new_shell();
        let t = std::time::Instant::now();
        nas.wait_for("nasinit: started", Duration::from_secs(300)).expect("nasinit starts again");
        nas.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("ready again after reboot");
        eprintln!("reboot to ready: {:.1}s", t.elapsed().as_secs_f64());
        nas.wait_for_login(Duration::from_secs(60)).ok();
        eprintln!("{}", ok(nas, "nasctl timeline"));
        let cmdline = ok(nas, "cat /proc/cmdline");
        assert!(!cmdline.contains("nasos.kexec-entry"), "a firmware reboot started by kexec: {cmdline}");
        let log = ok(nas, "nasctl logs storage");
        assert!(log.contains("tank: imported from its bays"), "{log}");
        assert!(!log.contains("created"), "something was created on reboot: {log}");
        // The lock came back within the grace period, and its holder never noticed.
        let locks = poll(nas, "cat /proc/locks", &inode, Duration::from_secs(90));
        if !locks.contains(&inode) {
            eprintln!("appliance: {}", ok(nas, "dmesg | grep -i -E 'nfsd|grace|recover|tracking' | tail -20; ls -la /var/lib/nfs/nfsdcld"));
            eprintln!("client: {}", ok(gpu, "dmesg | grep -i -E 'nfs|rpc|rdma|reclaim|lost' | tail -30"));
        }
        assert!(locks.contains(&inode), "the lock was not reclaimed ({inode}): {locks}");
        ok(gpu, "kill -0 $(cat /tmp/lock.pid)");
        let dmesg = ok(gpu, "dmesg | grep -i -E 'reclaim|lost' || true");
        assert!(!dmesg.to_lowercase().contains("failed"), "the client lost state: {dmesg}");
        // What the client wrote reads back over the mount that rode out the reboot.
        for (name, sum) in &written {
            assert_eq!(&digest(&ok(gpu, &format!("sha256sum < /tmp/mnt-lock/job/{name}"))), sum, "{name} after reboot");
        }
        ok(gpu, "kill $(cat /tmp/lock.pid); sleep 1; umount /tmp/mnt-lock");
        // TCP alone now (a TCP mount beside an RDMA one would ride RDMA): the power cut needs it.
        mount_train(gpu, "tcp", "/tmp/mnt-tcp");
        assert_eq!(&digest(&ok(gpu, "sha256sum < /tmp/mnt-tcp/job/blob-tcp")), &written[1].1, "blob-tcp over TCP");
        // The box kept its identity and knows how its last boot ended; the first boot's log is
        // still there.
        let st = status(nas);
        assert_eq!(st["boot"], 2, "{st}");
        assert_eq!(st["last_boot"], "clean reboot", "{st}");
        let (machine_id, nqn) = IDENTITY.get();
        assert_eq!(ok(nas, "cat /etc/machine-id").trim(), machine_id);
        assert_eq!(ok(nas, "cat /etc/nvme/hostnqn").trim(), nqn);
        let before = ok(nas, "nasctl logs storage --boot -1");
        assert!(before.contains("created on 12 blank disks"), "the first boot's storage log: {before}");
    });
}

fn power_cut() {
    let written = WRITTEN.get();
    PAIR.with(|Pair { nas, gpu, .. }| {
        // A power cut (QMP system_reset: no export, no sync) with the client still mounted: the
        // pool imports on the next boot and the client's hard mount carries on with the same data,
        // without an I/O error reaching the program reading it.
        // Whatever an earlier failed check left mounted over RDMA would carry this TCP mount too.
        ok(gpu, "kill $(cat /tmp/lock.pid 2>/dev/null) 2>/dev/null; umount /tmp/mnt-lock 2>/dev/null; true");
        let (_, mounted) = gpu.run("mountpoint -q /tmp/mnt-tcp", Duration::from_secs(60)).expect("mountpoint");
        if mounted != 0 {
            mount_train(gpu, "tcp", "/tmp/mnt-tcp");
        }
        nas.qmp("system_reset", serde_json::json!({})).expect("reset");
        nas.expect_new_shell();
        let t = std::time::Instant::now();
        nas.wait_for("nasinit: started", Duration::from_secs(300)).expect("nasinit starts after the power cut");
        nas.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("ready after the power cut");
        eprintln!("power cut to ready: {:.1}s", t.elapsed().as_secs_f64());
        nas.wait_for_login(Duration::from_secs(60)).ok();
        let log = ok(nas, "nasctl logs storage");
        assert!(log.contains("tank: imported from its bays"), "{log}");
        for (name, sum) in &written {
            assert_eq!(
                &digest(&ok(gpu, &format!("sha256sum < /tmp/mnt-tcp/job/{name}"))),
                sum,
                "{name} after power cut"
            );
        }
        let st = status(nas);
        assert!(st["last_boot"].as_str().is_some_and(|s| s.starts_with("unclean")), "{st}");
        ok(gpu, "umount /tmp/mnt-tcp");
    });
}

/// Ctrl-Alt-Del reaches nasinit (the kernel no longer resets at once): services stop in order,
/// the box reboots and comes back ready, and it knows the reboot was clean.
/// The client serves the bundle over HTTP (busybox httpd, from a USB stick plugged into it);
/// `nasctl upgrade apply http://…` streams it onto the inactive slot without storing it whole,
/// and the new version boots next.
fn http_apply() {
    let bundle = BUNDLE.get();
    let stick = repo().join("build/e2e/datapath/bundle-stick.img");
    nasos_qemu::usb_stick(&bundle, &stick).expect("stick");
    PAIR.with(|Pair { nas, gpu, .. }| {
        gpu.plug_usb(&stick).expect("plug the stick into the client");
        poll(gpu, "blkid -L NASOS-USB || true", "/dev/", Duration::from_secs(60));
        ok(
            gpu,
            "mkdir -p /tmp/bundles && mount -o ro -L NASOS-USB /tmp/bundles && busybox httpd -p 8080 -h /tmp/bundles",
        );
        let url = "http://10.77.0.130:8080/qemu-dev-0.2.0.nasos";
        let t = std::time::Instant::now();
        let (out, code) = nas.run(&format!("nasctl upgrade apply {url}"), Duration::from_secs(900)).expect("apply");
        eprintln!("apply over HTTP: {:.1}s", t.elapsed().as_secs_f64());
        assert_eq!(code, 0, "{out}");
        assert!(out.contains(&format!("reading {url}")), "{out}");
        assert!(out.contains("installed on slot b (entry nasos-0.2.0+2.efi"), "{out}");
        // Streamed, not stored: nothing of the bundle's size landed on the box's filesystems.
        let stored =
            ok(nas, "find / \\( -path /proc -o -path /sys \\) -prune -o -name '*.nasos' -print 2>/dev/null || true");
        assert!(!stored.contains(".nasos"), "the bundle was stored whole: {stored}");
        let status = ok(nas, "nasctl upgrade status");
        assert!(status.contains("boots next: nasos-0.2.0+2.efi"), "{status}");
    });
}

/// After the orderly reboot into 0.2.0: it runs on slot b and is blessed once healthy; the
/// pool, the identity and the exports are the ones from before, and the client reads its data.
fn upgraded() {
    let (machine_id, nqn) = IDENTITY.get();
    let written = WRITTEN.get();
    PAIR.with(|Pair { nas, gpu, .. }| {
        let st = status(nas);
        assert_eq!(st["version"], "0.2.0", "{st}");
        let mine = |s: &str| {
            s.lines()
                .any(|l| l.starts_with("b ") && l.contains("0.2.0") && l.contains("running") && l.contains("blessed"))
        };
        let upgrade = poll(nas, "nasctl upgrade status", "blessed     0.2.0", Duration::from_secs(120));
        assert!(mine(&upgrade), "0.2.0 is not running blessed on slot b: {upgrade}");
        assert_eq!(ok(nas, "cat /etc/machine-id").trim(), machine_id, "the identity changed");
        assert_eq!(ok(nas, "cat /etc/nvme/hostnqn").trim(), nqn, "the host NQN changed");
        let exports = poll(nas, "exportfs -v", "/export/tank/train", Duration::from_secs(60));
        assert!(exports.contains("/export/tank/scratch"), "{exports}");
        mount_train(gpu, "rdma", "/tmp/mnt-upgraded");
        for (name, sum) in &written {
            let got = digest(&ok(gpu, &format!("sha256sum < /tmp/mnt-upgraded/job/{name}")));
            assert_eq!(&got, sum, "{name} after the upgrade");
        }
        ok(gpu, "umount /tmp/mnt-upgraded");
    });
}

fn ctrl_alt_del() {
    PAIR.with(|Pair { nas, .. }| {
        nas.qmp("send-key", serde_json::json!({"keys": [{"type": "qcode", "data": "ctrl"}, {"type": "qcode", "data": "alt"}, {"type": "qcode", "data": "delete"}]}))
            .expect("send-key");
        nas.expect_new_shell();
        nas.wait_for("nasinit: reboot requested: stopping services", Duration::from_secs(60)).expect("an orderly reboot");
        nas.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("ready after Ctrl-Alt-Del");
        nas.wait_for_login(Duration::from_secs(60)).ok();
        let st = status(nas);
        assert_eq!(st["last_boot"], "clean reboot", "{st}");
    });
}

/// A drive pulled from an idle pool (QMP device_del, as a hand pulls it): health names its bay
/// on the console within 10 s — woken by the hot-plug event, not a poll — and in `nasctl
/// health`, in the metrics the client scrapes (which promtool accepts) and at the client's
/// syslog receiver (rsyslog, RFC 5424); udev drops the bay's name, and zed marks it REMOVED.
fn pulled_bay() {
    PAIR.with(|Pair { nas, gpu, .. }| {
        ok(
            gpu,
            // The recipe sends alerts to both: UDP and TCP (octet-counted) on port 514, each
            // received into a file of its own.
            r#"printf 'module(load="imudp")\nmodule(load="imtcp")\nruleset(name="udp") { action(type="omfile" file="/tmp/remote-udp.log" template="RSYSLOG_SyslogProtocol23Format") }\nruleset(name="tcp") { action(type="omfile" file="/tmp/remote-tcp.log" template="RSYSLOG_SyslogProtocol23Format") }\ninput(type="imudp" port="514" ruleset="udp")\ninput(type="imtcp" port="514" ruleset="tcp")\n' > /tmp/rsyslog.conf && rsyslogd -f /tmp/rsyslog.conf -i /tmp/rsyslog.pid"#,
        );
        let metrics = |gpu: &mut nasos_qemu::Vm| ok(gpu, "curl -sfS --max-time 10 http://10.77.0.1:9100/metrics");
        let before = metrics(gpu);
        assert!(before.contains("nasos_bay_present{bay=\"BAY07\"} 1"), "{before}");
        // The first round after the reboot has run: the pool is there and nothing is wrong.
        poll(nas, "nasctl health", "health: OK", Duration::from_secs(60));
        // The 10 s run from when the guest has let go of the drive (QEMU's DEVICE_DELETED; with
        // q35's ACPI hot-plug that came 0.4 s after the device_del).
        let released = nas.pull_bay_released(7, Duration::from_secs(60)).expect("pull BAY07");
        let t = std::time::Instant::now();
        nas.wait_for("health: CRITICAL BAY07: drive missing (a member of pool tank)", Duration::from_secs(10))
            .expect("the pulled bay on the console within 10 s of its release");
        eprintln!(
            "pull: released by the guest after {:.1}s, console alert {:.1}s later",
            released.as_secs_f64(),
            t.elapsed().as_secs_f64()
        );
        let h = json(&ok(nas, "nasctl health --json"));
        let checks = h["report"]["checks"].as_array().expect("checks");
        assert!(
            checks.iter().any(|c| c["id"] == "bay.BAY07.present" && c["severity"] == "critical"),
            "{h}"
        );
        let alerts = h["alerts"].as_array().expect("alerts");
        assert!(alerts.iter().any(|a| a["id"] == "bay.BAY07.present" && a["to"] == "critical"), "{h}");
        let (_, gone) = nas.run("test -e /dev/disk/by-bay/BAY07", Duration::from_secs(30)).expect("test");
        assert_ne!(gone, 0, "udev kept the name of a pulled bay");
        poll(nas, "zpool status tank", "REMOVED", Duration::from_secs(10));
        let after = metrics(gpu);
        assert!(after.contains("nasos_bay_present{bay=\"BAY07\"} 0"), "{after}");
        assert!(after.contains("nasos_health_check{check=\"bay.BAY07.present\"} 2"), "{after}");
        let file = repo().join("build/e2e/datapath/metrics.txt");
        std::fs::write(&file, format!("{after}\n")).expect("write metrics");
        let promtool = host_tool("/usr/bin/promtool", "prometheus");
        let check = std::process::Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(std::fs::File::open(&file).expect("metrics"))
            .output()
            .expect("promtool");
        assert!(
            check.status.success(),
            "promtool check metrics: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        for transport in ["udp", "tcp"] {
            let log = poll(gpu, &format!("cat /tmp/remote-{transport}.log"), "bay.BAY07.present", Duration::from_secs(10));
            let line = log.lines().find(|l| l.contains("bay.BAY07.present")).expect("the alert line");
            assert!(line.starts_with("<26>1 ") && line.contains(" nasos-dev nasos-health "), "{transport}: {line}");
            assert!(line.contains("CRITICAL BAY07: drive missing"), "{transport}: {line}");
        }
    });
}

/// zed puts a hot spare from the recipe in for the pulled bay by itself and resilvers onto
/// it; nasctl, the health check and the metrics say which spare stands in for which bay.
fn hot_spare() {
    PAIR.with(|Pair { nas, gpu, .. }| {
        let t = std::time::Instant::now();
        let pools = poll(nas, "nasctl pools", "hot spare in for BAY07", Duration::from_secs(30));
        let line = pools.lines().find(|l| l.contains("hot spare in for BAY07")).expect("the spare's line");
        assert!(line.trim_start().starts_with("BAY11") && line.contains("raidz2-1"), "{pools}");
        assert!(pools.lines().any(|l| l.trim_start().starts_with("BAY12") && l.contains("AVAIL")), "{pools}");
        // `scan: resilvered 34.5M in 00:00:04 with 0 errors on …` once it is done.
        let status = poll(nas, "zpool status tank", "with 0 errors on", Duration::from_secs(180));
        assert!(status.contains("scan: resilvered"), "{status}");
        eprintln!("pull to the spare resilvered: {:.1}s after the previous check", t.elapsed().as_secs_f64());
        let h = poll(nas, "nasctl health", "hot spare BAY11 in for BAY07", Duration::from_secs(30));
        assert!(h.contains("pool tank: DEGRADED (BAY07 REMOVED in raidz2-1, hot spare BAY11 in for BAY07)"), "{h}");
        let m = ok(gpu, "curl -sfS --max-time 10 http://10.77.0.1:9100/metrics");
        assert!(m.contains("nasos_pool_spare_in_use{pool=\"tank\",bay=\"BAY11\"} 1"), "{m}");
        assert!(m.contains("nasos_pool_spare_in_use{pool=\"tank\",bay=\"BAY12\"} 0"), "{m}");
    });
}

/// A critical warning raised by the drive itself (QEMU's smart_critical_warning, read by
/// health from the SMART log) is a critical alert naming its bay, and clears when the drive
/// clears it.
fn critical_warning() {
    PAIR.with(|Pair { nas, gpu, .. }| {
        let set = |nas: &mut nasos_qemu::Vm, v: u64| {
            nas.qmp(
                "qom-set",
                serde_json::json!({"path": "/machine/peripheral/nvme3", "property": "smart_critical_warning", "value": v}),
            )
            .expect("qom-set");
        };
        set(nas, 2);
        nas.wait_for("health: CRITICAL BAY03: NVMe critical warning: temperature beyond a threshold", Duration::from_secs(25))
            .expect("the drive's warning on the console");
        let m = ok(gpu, "curl -sfS --max-time 10 http://10.77.0.1:9100/metrics");
        assert!(m.contains("nasos_nvme_critical_warning{bay=\"BAY03\"} 2"), "{m}");
        set(nas, 0);
        nas.wait_for("health: ok again (was critical): BAY03: no NVMe critical warning", Duration::from_secs(25))
            .expect("cleared");
    });
}

/// A second drive of the same raidz2 vdev (BAY08, beside the pulled BAY07) pulled while the
/// client reads over RDMA with the appliance's data cache off: every read completes with the
/// right sha256 and no I/O error, the pool is DEGRADED, and both bays are named.
fn second_pull_during_reads() {
    PAIR.with(|Pair { nas, gpu, .. }| {
        ok(nas, "zfs set primarycache=metadata tank/train");
        mount_train(gpu, "rdma", "/tmp/mnt-pull");
        let file = "/tmp/mnt-pull/job/during-pull";
        ok(gpu, &format!("setpriv --reuid=1000 --regid=1000 --clear-groups dd if=/dev/urandom of={file} bs=1M count=32 status=none"));
        let want = digest(&ok(gpu, &format!("sync; sha256sum < {file}")));
        ok(
            gpu,
            &format!(
                // In the background (the outer parentheses let the console helper append its marker).
                "( (for i in 1 2 3; do echo 3 > /proc/sys/vm/drop_caches; sha256sum < {file} 2>&1; done; echo READS-DONE) > /tmp/reads.txt 2>&1 & )"
            ),
        );
        std::thread::sleep(Duration::from_secs(1));
        let released = nas.pull_bay_released(8, Duration::from_secs(60)).expect("pull BAY08");
        let t = std::time::Instant::now();
        // Named by the first pull's check within 10 s; here the box is also serving the reads,
        // resilvering its first spare and sending the file just written to its DR twin, three VMs
        // on two cores shared with the other e2e lane. One after the other this took under 30 s;
        // under two lanes 22 s once and over 30 s twice (why is open on issue 13's note). This
        // check is about the reads losing nothing; the time is printed.
        nas.wait_for("health: CRITICAL BAY08: drive missing (a member of pool tank)", Duration::from_secs(120))
            .expect("the second pulled bay on the console within 120 s of its release");
        eprintln!(
            "second pull: released by the guest after {:.1}s, console alert {:.1}s later",
            released.as_secs_f64(),
            t.elapsed().as_secs_f64()
        );
        let reads = poll(gpu, "cat /tmp/reads.txt", "READS-DONE", Duration::from_secs(180));
        let sums: Vec<&str> = reads.lines().filter(|l| !l.contains("READS-DONE")).collect();
        assert_eq!(sums.len(), 3, "{reads}");
        for l in &sums {
            assert_eq!(digest(l), want, "a read during the pull: {reads}");
        }
        let health = ok(nas, "nasctl health");
        assert!(health.contains("BAY07: drive missing") && health.contains("BAY08: drive missing"), "{health}");
        assert!(health.contains("pool tank: DEGRADED"), "{health}");
        // The second spare took the second bay.
        poll(nas, "nasctl pools", "hot spare in for BAY08", Duration::from_secs(30));
        ok(gpu, "umount /tmp/mnt-pull");
        ok(nas, "zfs inherit primarycache tank/train");
    });
}

/// A blank disk put into each bay pulled above gets the bay's name at once; `nasctl replace`
/// resilvers onto it, the pool is ONLINE again and the alerts clear.
fn replace_bay() {
    PAIR.with(|Pair { nas, .. }| {
        let (_, st) = nas.run("nasctl replace BAY07", Duration::from_secs(60)).expect("replace");
        assert_ne!(st, 0, "replace with the bay empty must fail");
        // The alert may come before plug_blank has seen the bay's name (health is woken by
        // udev's announcement), so it is looked for from the plug on.
        let from = nas.console_lines().len();
        plug_blank(nas, 7);
        nas.wait_for_since(from, "health: ok again (was critical): BAY07: drive present", Duration::from_secs(15))
            .expect("the bay's alert clears when a drive is in it");
        let out = ok(nas, "nasctl replace BAY07");
        assert!(out.contains("BAY07: resilvering pool tank onto the new disk"), "{out}");
        // The second pulled bay (if the check before ran) gets its blank disk too.
        let (_, missing8) = nas.run("test -e /dev/disk/by-bay/BAY08", Duration::from_secs(30)).expect("test");
        if missing8 != 0 {
            // First a disk from elsewhere, holding a filesystem: replace refuses it and the
            // pool is left as it was.
            let foreign = foreign_disk("bay08-ext4");
            nas.plug_bay(8, &foreign).expect("plug a disk holding ext4 into BAY08");
            poll(nas, "ls /dev/disk/by-bay/", "BAY08", Duration::from_secs(15));
            // BAY08's lines in the pool's configuration (BAY07 may finish resilvering meanwhile;
            // the console may add a line of its own).
            let bay08 = |nas: &mut nasos_qemu::Vm| {
                let out = ok(nas, "zpool status tank | sed -n '/config:/,$p'");
                out.lines()
                    .filter(|l| l.starts_with('\t') && l.contains("BAY08"))
                    .map(|l| format!("{l}\n"))
                    .collect::<String>()
            };
            let before = bay08(nas);
            assert!(before.contains("REMOVED"), "{before}");
            let (out, code) = nas.run("nasctl replace BAY08", Duration::from_secs(60)).expect("replace");
            assert_ne!(code, 0, "replace took a disk that holds data: {out}");
            assert!(
                out.contains("BAY08") && out.contains("ext4"),
                "the refusal names the bay and what it holds: {out}"
            );
            assert_eq!(bay08(nas), before, "a refused replace changed the pool");
            nas.pull_bay(8).expect("take the foreign disk out again");
            let (_, gone) = nas.run("sleep 2; test -e /dev/disk/by-bay/BAY08", Duration::from_secs(30)).expect("test");
            assert_ne!(gone, 0, "the foreign disk is still named BAY08");
            plug_blank(nas, 8);
            let out = ok(nas, "nasctl replace BAY08");
            assert!(out.contains("BAY08: resilvering pool tank onto the new disk"), "{out}");
        }
        let t = std::time::Instant::now();
        // Done when no vdev is still being replaced: right after the second replace starts,
        // `zpool status -x` can call the pool healthy while its resilver has not begun (CI saw
        // it), so the whole status is judged.
        let done = |s: &str| s.contains("state: ONLINE") && !s.contains("replacing") && !s.contains("in progress");
        let status = poll_until(nas, "zpool status tank", done, Duration::from_secs(300));
        eprintln!("resilver onto a blank disk: {:.1}s", t.elapsed().as_secs_f64());
        assert!(done(&status), "{status}");
        // No data lost through the pulls, the spares and the replaces. Should a run find some,
        // what ZFS knows about it is kept before anything else touches the pool.
        let errors = ok(nas, "zpool status -v tank | sed -n '/^errors:/,$p'");
        if !errors.contains("No known data errors") {
            let evidence = ok(nas, "zpool status -v tank; zpool events -v | tail -n 300; dmesg | tail -n 150");
            let _ = std::fs::write(repo().join("build/e2e/datapath/data-errors.txt"), &evidence);
            panic!("the pool reports data errors after the pulls and replaces:\n{evidence}");
        }
        // Kept for the record: zpool's JSON right after a replace (it has left fields out before).
        let raw = ok(nas, "zpool status -j --json-int tank");
        let _ = std::fs::write(repo().join("build/e2e/datapath/zpool-status-after-replace.json"), raw);
        let pools = ok(nas, "nasctl pools");
        // Health's own console lines may land amid the command's output: judge the listing only.
        let first = pools.lines().find(|l| !l.starts_with("health: "));
        assert!(pools.contains("BAY07") && first.is_some_and(|l| l.contains("ONLINE")), "{pools}");
        // Once the bays they stood in for are resilvered, the spares wait again.
        let pools = poll(nas, "nasctl pools", "BAY12    spare      AVAIL", Duration::from_secs(60));
        let listing: Vec<&str> = pools.lines().filter(|l| !l.starts_with("health: ")).collect();
        assert!(
            listing.iter().any(|l| l.contains("BAY11    spare      AVAIL"))
                && !listing.iter().any(|l| l.contains("hot spare in for")),
            "{pools}"
        );
        // Judged by the pool's and the bays' checks: the replication ended by the promote before
        // this check warns of its lag meanwhile, as the last check wants.
        let ours = |h: &serde_json::Value| {
            h["report"]["checks"].as_array().is_some_and(|c| {
                c.iter().any(|c| c["id"].as_str().is_some_and(|id| id.starts_with("bay.") || id.starts_with("pool.")))
            })
        };
        let h = poll_json(nas, "nasctl health --json", |h| !ours(h), Duration::from_secs(30));
        assert!(!ours(&h), "a bay or the pool is still not ok: {h}");
        let h = ok(nas, "nasctl health");
        assert!(h.contains("ok again (was warning): pool tank: ONLINE"), "{h}");
    });
}

/// The box's clock, in seconds. Its own console lines (health's) may land amid the output:
/// the number is the line that is one.
fn box_now(nas: &mut nasos_qemu::Vm) -> u64 {
    let out = ok(nas, "date +%s");
    out.lines().find_map(|l| l.trim().parse().ok()).unwrap_or_else(|| panic!("no time in {out:?}"))
}

/// `nasctl snapshots DATASET --json`.
fn snapshots(nas: &mut nasos_qemu::Vm, dataset: &str) -> Vec<serde_json::Value> {
    let v = json(&ok(nas, &format!("nasctl snapshots {dataset} --json")));
    v.as_array().cloned().unwrap_or_else(|| panic!("not a list: {v}"))
}

fn names_of<'a>(snaps: &'a [serde_json::Value], kind: &str) -> Vec<&'a str> {
    snaps.iter().filter(|s| s["kind"] == kind).filter_map(|s| s["name"].as_str()).collect()
}

/// The client deletes a file it wrote; the policy's newest snapshot (taken every minute since the
/// box came up) still has it in `.zfs/snapshot`, read over the RDMA mount with the same sha256,
/// and copied back as a user restores a file without an operator.
fn restore_from_snapshot() {
    let written = WRITTEN.get();
    PAIR.with(|Pair { nas, gpu, .. }| {
        let (file, sum) = &written[1];
        // The newest frequent snapshot taken after the client wrote it (one a minute).
        let mut short = String::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(100);
        while std::time::Instant::now() < deadline {
            let snaps = snapshots(nas, "tank/train");
            if let Some(newest) = names_of(&snaps, "frequently").last() {
                short = newest.split_once('@').map(|(_, s)| s.to_string()).expect("snapshot name");
                let (_, code) = nas
                    .run(
                        &format!("test -e /export/tank/train/.zfs/snapshot/{short}/job/{file}"),
                        Duration::from_secs(30),
                    )
                    .expect("test");
                if code == 0 {
                    break;
                }
            }
            std::thread::sleep(Duration::from_secs(5));
        }
        ok(nas, &format!("test -e /export/tank/train/.zfs/snapshot/{short}/job/{file}"));
        mount_train(gpu, "rdma", "/tmp/mnt-snap");
        let as_user = "setpriv --reuid=1000 --regid=1000 --clear-groups";
        ok(gpu, &format!("{as_user} rm /tmp/mnt-snap/job/{file}"));
        let listing = ok(gpu, "ls /tmp/mnt-snap/.zfs/snapshot/");
        assert!(listing.contains(&short), "the client does not see {short} in .zfs/snapshot: {listing}");
        let from_snap = format!("/tmp/mnt-snap/.zfs/snapshot/{short}/job/{file}");
        assert_eq!(&digest(&ok(gpu, &format!("sha256sum < {from_snap}"))), sum, "{from_snap} differs");
        // Read-only, even for the file's owner.
        let (out, code) = gpu.run(&format!("{as_user} touch {from_snap}"), Duration::from_secs(60)).expect("touch");
        assert_ne!(code, 0, "a snapshot was written through NFS: {out}");
        ok(gpu, &format!("{as_user} cp {from_snap} /tmp/mnt-snap/job/{file}"));
        ok(gpu, "sync; echo 3 > /proc/sys/vm/drop_caches");
        assert_eq!(
            &digest(&ok(gpu, &format!("sha256sum < /tmp/mnt-snap/job/{file}"))),
            sum,
            "the restored copy differs"
        );
        ok(gpu, "umount /tmp/mnt-snap");
    });
}

fn dr(pair: &mut Pair) -> &mut nasos_qemu::Vm {
    pair.dr.as_mut().expect("the DR twin runs")
}

/// `nasctl replication --json` on the appliance: the one job.
fn repl_job(nas: &mut nasos_qemu::Vm) -> serde_json::Value {
    let v = json(&ok(nas, "nasctl replication --json"));
    v["jobs"][0].clone()
}

/// A 64 MiB file the client writes over RDMA is on the DR twin, with the same sha256, within two
/// intervals of the one-minute schedule (plus the send at 8 MiB/s); the copy there is read-only.
fn replicated() {
    let (name, sum) = PAIR.with(|pair| {
        let Pair { nas, gpu, .. } = pair;
        mount_train(gpu, "rdma", "/tmp/mnt-repl");
        let as_user = "setpriv --reuid=1000 --regid=1000 --clear-groups";
        ok(gpu, &format!("{as_user} dd if=/dev/urandom of=/tmp/mnt-repl/job/big bs=1M count=64 status=none"));
        let sum = digest(&ok(gpu, "sync; sha256sum < /tmp/mnt-repl/job/big"));
        ok(gpu, "umount /tmp/mnt-repl");
        let written = std::time::Instant::now();
        let _ = nas;
        let dr = dr(pair);
        let there = poll_until(
            dr,
            "sha256sum < /export/tank/train/job/big 2>/dev/null || echo missing",
            |o| o.contains(&sum),
            Duration::from_secs(150),
        );
        assert!(there.contains(&sum), "the DR twin does not hold the file after {:?}: {there}", written.elapsed());
        eprintln!("written to replicated: {:.1}s", written.elapsed().as_secs_f64());
        assert_eq!(ok(dr, "zfs get -H -o value readonly tank/train").trim(), "on", "a replica is read-only");
        // The sender records the round once its holds and the twin's pruning are done too.
        let sent = |job: &serde_json::Value| job["state"]["total_bytes"].as_u64().is_some_and(|b| b > 64 << 20);
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        let mut job = repl_job(&mut pair.nas);
        while !sent(&job) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_secs(3));
            job = repl_job(&mut pair.nas);
        }
        assert!(sent(&job), "{job}");
        assert!(job["lag_seconds"].as_u64().is_some_and(|l| l < 180), "{job}");
        ("job/big".to_string(), sum)
    });
    REPLICATED.set((name, sum));
}

/// The cable is pulled while a send runs: the send fails, the twin keeps what arrived, and the
/// next round continues from the twin's resume token (the log says so) and ends with equal data.
fn link_cut_resumes() {
    PAIR.with(|pair| {
        let Pair { nas, gpu, .. } = pair;
        mount_train(gpu, "tcp", "/tmp/mnt-repl");
        let as_user = "setpriv --reuid=1000 --regid=1000 --clear-groups";
        ok(gpu, &format!("{as_user} dd if=/dev/urandom of=/tmp/mnt-repl/job/big2 bs=1M count=64 status=none"));
        let sum = digest(&ok(gpu, "sync; sha256sum < /tmp/mnt-repl/job/big2"));
        ok(gpu, "umount /tmp/mnt-repl");
        let sends = |nas: &mut nasos_qemu::Vm| ok(nas, "nasctl logs replication -n 500").matches("sending").count();
        let before = sends(nas);
        // Now, not at the next minute.
        assert!(ok(nas, "nasctl replication send").contains("asked the replication service for a round now"));
        let started = poll_until(
            nas,
            "nasctl logs replication -n 500",
            |o| o.matches("sending").count() > before,
            Duration::from_secs(90),
        );
        assert!(started.matches("sending").count() > before, "no send started: {started}");
        // Cut only once the twin's `zfs receive -s` has taken in part of the stream: a round's
        // ssh and estimate take seconds under TCG, and a cut before the first record leaves no
        // token to resume from (the next round then sends afresh, rightly).
        let twin = pair.dr.as_mut().expect("the DR twin runs");
        let took_in = |o: &str| o.lines().filter_map(|l| l.trim().parse::<u64>().ok()).any(|n| n > 4 << 20);
        let read = poll_until(
            twin,
            "for p in $(pgrep -f '^zfs receive -s'); do sed -n 's/^rchar: //p' /proc/$p/io; done; echo end",
            took_in,
            Duration::from_secs(90),
        );
        assert!(took_in(&read), "the twin received nothing: {read}");
        let nas = &mut pair.nas;
        nas.set_link(0, false).expect("pull the cable");
        // Long enough for the sender's keepalive (3 × 3 s) to give up.
        std::thread::sleep(Duration::from_secs(12));
        nas.set_link(0, true).expect("put the cable back");
        let log =
            poll(nas, "nasctl logs replication -n 500", "resuming the interrupted send", Duration::from_secs(200));
        assert!(log.contains("resuming the interrupted send from its token"), "{log}");
        let dr = dr(pair);
        let there = poll_until(
            dr,
            "sha256sum < /export/tank/train/job/big2 2>/dev/null || echo missing",
            |o| o.contains(&sum),
            Duration::from_secs(150),
        );
        assert!(there.contains(&sum), "{there}");
        // Recorded once the round's holds and pruning are done.
        let job = poll_until(
            &mut pair.nas,
            "nasctl replication --json",
            |o| !o.contains("\"resumed\": 0"),
            Duration::from_secs(90),
        );
        assert!(json(&job)["jobs"][0]["state"]["resumed"].as_u64().is_some_and(|n| n >= 1), "{job}");
    });
}

/// The newest common snapshot is held on both boxes (neither side's pruning nor nasctl removes
/// it); the twin answers SSH only to the appliance's key and only with the forced command.
fn common_held() {
    PAIR.with(|pair| {
        let job = repl_job(&mut pair.nas);
        let common = job["state"]["common"]["name"].as_str().unwrap_or_else(|| panic!("{job}")).to_string();
        let snap = format!("tank/train@{common}");
        let holds = ok(&mut pair.nas, &format!("zfs holds -H {snap}"));
        assert!(holds.contains("nasos-repl-to-dr"), "{holds}");
        let (out, code) = pair.nas.run(&format!("nasctl destroy {snap}"), Duration::from_secs(60)).expect("destroy");
        assert!(code != 0 && out.contains("held by nasos-repl-to-dr"), "{out}");
        let dr = dr(pair);
        // The twin holds the newest snapshot it received, and only that one: it may be a policy
        // snapshot taken between the round's own and the send (`zfs send -I` carries those), and
        // the twin may have received a newer one since the job was read.
        let holds = ok(
            dr,
            "zfs list -H -t snapshot -o name -s createtxg -d1 tank/train | tail -n1; \
             zfs list -H -t snapshot -o name -d1 tank/train | xargs zfs holds -H | grep nasos-repl-from-primary",
        );
        let mut lines = holds.lines().filter(|l| !l.trim().is_empty());
        let newest = lines.next().unwrap_or_else(|| panic!("{holds}")).trim().to_string();
        let held: Vec<&str> = lines.filter_map(|l| l.split('\t').next()).collect();
        assert_eq!(held, [newest.as_str()], "the twin's hold is not on its newest snapshot alone: {holds}");
        // Only the peer's key, only the forced command, only its dataset.
        let ssh = "ssh -i /run/nasos/replication/identity -o UserKnownHostsFile=/run/nasos/replication/known_hosts -o BatchMode=yes -o StrictHostKeyChecking=yes root@10.77.0.2";
        let nas = &mut pair.nas;
        let (out, code) = nas.run(&format!("{ssh} sh -c id"), Duration::from_secs(60)).expect("ssh");
        assert!(code != 0 && out.contains("refused") && !out.contains("uid="), "{out}");
        let (out, code) = nas.run(&format!("{ssh} receive tank/scratch < /dev/null"), Duration::from_secs(60)).expect("ssh");
        assert!(code != 0 && out.contains("may not write tank/scratch"), "{out}");
        let gpu = &mut pair.gpu;
        let (out, code) = gpu.run("timeout 5 bash -c '</dev/tcp/10.77.0.2/22' && echo open", Duration::from_secs(60)).expect("probe");
        assert!(code != 0 && !out.contains("open"), "the twin's SSH answers the client: {out}");
    });
}

/// `nasctl replication promote` on the twin, while a send into it is in flight (a failover does
/// not wait for one): the receive is ended, and the client mounts the copy over RDMA, finds the
/// replicated file, is refused a write before, and writes after.
fn promote() {
    let (name, sum) = REPLICATED.get();
    PAIR.with(|pair| {
        let gpu = &mut pair.gpu;
        ok(gpu, "mkdir -p /tmp/mnt-dr && mount -t nfs -o vers=4.2,proto=rdma,port=20049 10.77.0.2:/export/tank/train /tmp/mnt-dr");
        assert!(ok(gpu, "grep ' /tmp/mnt-dr ' /proc/mounts").contains("proto=rdma"));
        assert_eq!(digest(&ok(gpu, &format!("sha256sum < /tmp/mnt-dr/{name}"))), sum);
        let as_user = "setpriv --reuid=1000 --regid=1000 --clear-groups";
        let (out, code) = gpu.run(&format!("{as_user} touch /tmp/mnt-dr/job/after-failover"), Duration::from_secs(60)).expect("touch");
        assert!(code != 0 && out.contains("Read-only file system"), "a replica took a write: {out}");
        // 64 MiB more on the primary, sent at its 8M/s limit: seconds of receive on the twin.
        ok(&mut pair.nas, "dd if=/dev/urandom of=/export/tank/train/job/in-flight bs=1M count=64 status=none && sync");
        ok(&mut pair.nas, "nasctl replication send");
        let receiving = poll_until(
            dr(pair),
            "test -e /run/nasos/replication/receiving-tank_train.pid && echo receiving || echo idle",
            |o| o.contains("receiving"),
            Duration::from_secs(90),
        );
        assert!(receiving.contains("receiving"), "no receive in flight on the twin: {receiving}");
        let out = ok(dr(pair), "nasctl replication promote tank/train");
        assert!(out.contains("ending the receive into tank/train in flight"), "{out}");
        assert!(out.contains("tank/train is writable now and takes no more replicas from primary"), "{out}");
        let gpu = &mut pair.gpu;
        ok(gpu, &format!("{as_user} dd if=/dev/urandom of=/tmp/mnt-dr/job/after-failover bs=1M count=4 status=none"));
        let local = digest(&ok(gpu, "sync; sha256sum < /tmp/mnt-dr/job/after-failover"));
        ok(gpu, "umount /tmp/mnt-dr");
        let there = digest(&ok(dr(pair), "sha256sum < /export/tank/train/job/after-failover"));
        assert_eq!(local, there);
        let v = ok(dr(pair), "nasctl replication");
        assert!(v.contains("tank/train from primary: PROMOTED, writable"), "{v}");
    });
}

/// With the twin promoted, the appliance's sends are refused: the job's JSON says why and how
/// far behind it is, and once that passes the recipe's two minutes the health agent warns.
fn late_replica() {
    PAIR.with(|pair| {
        let nas = &mut pair.nas;
        let job =
            poll_until(nas, "nasctl replication --json", |o| o.contains("was promoted on dr"), Duration::from_secs(90));
        assert!(job.contains("was promoted on dr"), "{job}");
        // The health agent's current round (alerts from earlier, transient lags while the box
        // rebooted above, are in the history and do not count here).
        let warned = |out: &str| {
            let v = json(out);
            v["report"]["checks"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["id"] == "replication.tank/train.dr" && c["severity"] == "warning"))
        };
        let out = poll_until(nas, "nasctl health --json -n 0", warned, Duration::from_secs(200));
        assert!(warned(&out), "{out}");
        let check = ok(nas, "nasctl health");
        assert!(check.contains("replication tank/train → dr:") && check.contains("behind (alert after 2m)"), "{check}");
        let job = repl_job(nas);
        assert!(job["lag_seconds"].as_u64().is_some_and(|l| l > 120), "{job}");
        assert_eq!(job["lag_alert_seconds"].as_u64(), Some(120), "{job}");
    });
}

/// The scratch policy holds each snapshot 4 minutes: the newest cannot be destroyed or released
/// through nasctl, nor destroyed by zfs itself, before then.
fn held_snapshot() {
    let held = PAIR.with(|Pair { nas, .. }| {
        let snaps = snapshots(nas, "tank/scratch");
        let newest = snaps.iter().rev().find(|s| s["kind"] == "frequently").unwrap_or_else(|| panic!("{snaps:?}"));
        let name = newest["name"].as_str().expect("name").to_string();
        let until = newest["held_until"].as_u64().unwrap_or_else(|| panic!("{name} is not held: {newest}"));
        let now: u64 = box_now(nas);
        assert!(until > now + 60, "{name} is held only until {until} (now {now})");
        for cmd in ["destroy", "release"] {
            let (out, code) = nas.run(&format!("nasctl {cmd} {name}"), Duration::from_secs(60)).expect(cmd);
            assert_ne!(code, 0, "nasctl {cmd} of a held snapshot succeeded: {out}");
            assert!(out.contains(&format!("refusing to {cmd} {name}: it is held until")), "{out}");
        }
        let (out, code) = nas.run(&format!("zfs destroy {name}"), Duration::from_secs(60)).expect("zfs destroy");
        assert_ne!(code, 0, "zfs destroyed a held snapshot: {out}");
        assert!(out.contains("it's being held"), "{out}");
        (name, until)
    });
    HELD.set(held);
}

/// An operator's snapshot, which the policy never prunes, and a name the policy owns refused; a
/// rollback that is not confirmed changes nothing, a confirmed one brings the old file back, one
/// past a held snapshot is refused and destroys nothing.
fn manual_and_rollback() {
    // The pool's root dataset: no policy and no replication takes snapshots of it, so none can
    // come between (tank/train's would be destroyed by the rollback, or refuse it when held).
    PAIR.with(|Pair { nas, .. }| {
        ok(nas, "echo before > /export/tank/note");
        let out = ok(nas, "nasctl snapshot tank before-change");
        assert!(out.contains("took tank@before-change"), "{out}");
        ok(nas, "echo after > /export/tank/note");
        let (out, code) = nas.run("nasctl snapshot tank auto-mine", Duration::from_secs(60)).expect("snapshot");
        assert!(code != 0 && out.contains("belong to the snapshot policy"), "{out}");
        let (out, code) =
            nas.run("echo no | nasctl rollback tank@before-change", Duration::from_secs(60)).expect("rollback");
        assert!(code != 0 && out.contains("not confirmed: nothing was changed"), "{out}");
        assert!(out.contains("Type the dataset's name (tank)"), "{out}");
        assert_eq!(ok(nas, "cat /export/tank/note").trim(), "after");
        let out = ok(nas, "echo tank | nasctl rollback tank@before-change");
        assert!(out.contains("rolled back to tank@before-change"), "{out}");
        assert_eq!(ok(nas, "cat /export/tank/note").trim(), "before");
        ok(nas, "rm /export/tank/note");
        assert!(ok(nas, "nasctl destroy tank@before-change").contains("destroyed tank@before-change"));
        // Past a held snapshot, a rollback is refused before anything changes.
        ok(nas, "nasctl snapshot tank/scratch old && nasctl snapshot tank/scratch pinned --hold 10m");
        let (out, code) = nas.run("nasctl rollback tank/scratch@old --yes", Duration::from_secs(60)).expect("rollback");
        assert!(code != 0 && out.contains("refusing to roll back to tank/scratch@old"), "{out}");
        assert!(out.contains("tank/scratch@pinned (it is held until"), "{out}");
        assert!(
            ok(nas, "nasctl snapshots tank/scratch").contains("tank/scratch@old"),
            "a refused rollback destroyed a snapshot"
        );
        ok(nas, "nasctl destroy tank/scratch@old");
    });
}

/// Minutes after the first snapshot, with reboots, an upgrade and a power cut between: exactly 3
/// frequent snapshots of tank/train remain, their names in the order they were taken, the
/// newest from the last two minutes, and the one restored from earlier is gone.
fn policy_kept_three() {
    PAIR.with(|Pair { nas, .. }| {
        // A round takes the new snapshot, then prunes: a listing in between sees one more.
        let mut snaps = snapshots(nas, "tank/train");
        for _ in 0..20 {
            if snaps.iter().filter(|s| s["kind"] == "frequently").count() == 3 {
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
            snaps = snapshots(nas, "tank/train");
        }
        let frequent: Vec<&serde_json::Value> = snaps.iter().filter(|s| s["kind"] == "frequently").collect();
        assert_eq!(frequent.len(), 3, "{:#?}", names_of(&snaps, "frequently"));
        let names: Vec<&str> = frequent.iter().filter_map(|s| s["name"].as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "listed by creation, the names sort the same way");
        let created: Vec<u64> = frequent.iter().filter_map(|s| s["created"].as_u64()).collect();
        assert!(created.windows(2).all(|w| w[0] < w[1]), "{created:?}");
        let now: u64 = box_now(nas);
        assert!(now - created[2] < 150, "the newest frequent snapshot is {}s old", now - created[2]);
        assert_eq!(names_of(&snaps, "hourly").len(), 1, "{snaps:?}");
        assert_eq!(names_of(&snaps, "daily").len(), 1, "{snaps:?}");
        let log = ok(nas, "nasctl logs snapshots -n 400");
        assert!(log.contains("pruned tank/train@auto-"), "{log}");
    });
}

/// The snapshot held earlier is gone once its hold passed; what remains of scratch's frequent
/// snapshots is the newest 2 and those still inside their hold.
fn held_snapshots_go() {
    let (name, until) = HELD.get();
    PAIR.with(|Pair { nas, .. }| {
        // On a fast host the suite gets here before the hold (and the round that releases it)
        // has passed: wait for it, not longer.
        let mut now: u64 = box_now(nas);
        if now <= until + 70 {
            let wait = (until + 72 - now).min(300);
            eprintln!("waiting {wait}s for the hold of {name} to end");
            std::thread::sleep(Duration::from_secs(wait));
            now = box_now(nas);
        }
        assert!(now > until + 70, "the hold has not ended ({now} vs {until})");
        // A round releases and prunes one snapshot after another: one seen between the two (no
        // longer held, not yet pruned) is gone by the next round.
        let settled = |snaps: &[serde_json::Value], now: u64| {
            let frequent: Vec<&serde_json::Value> = snaps.iter().filter(|s| s["kind"] == "frequently").collect();
            let older = &frequent[..frequent.len().saturating_sub(2)];
            older.iter().all(|s| s["held_until"].as_u64().is_some_and(|u| u + 70 > now))
        };
        let mut snaps = snapshots(nas, "tank/scratch");
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        while !settled(&snaps, now) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_secs(5));
            now = box_now(nas);
            snaps = snapshots(nas, "tank/scratch");
        }
        assert!(!snaps.iter().any(|s| s["name"] == name.as_str()), "{name} outlived its hold: {snaps:#?}");
        let frequent: Vec<&serde_json::Value> = snaps.iter().filter(|s| s["kind"] == "frequently").collect();
        let (older, newest) = frequent.split_at(frequent.len().saturating_sub(2));
        assert_eq!(newest.len(), 2, "the policy keeps 2: {frequent:#?}");
        for s in older {
            // Beyond the count, so still inside its hold (released a round after it ends).
            let until = s["held_until"].as_u64().unwrap_or(0);
            assert!(until + 70 > now && until < now + 250, "{s} should be gone or held");
        }
        // Released and pruned in whichever boot its time passed (the box rebooted since).
        let log = ok(nas, &format!("cat /var/lib/nasos/boots/*/log/snapshots.log* | grep -aF '{name}'"));
        assert!(log.contains(&format!("released {name}")) && log.contains(&format!("pruned {name}")), "{log}");
    });
}

/// Plugs a new blank disk into bay `n` and waits for udev to give it the bay's name.
fn plug_blank(nas: &mut nasos_qemu::Vm, n: u32) {
    let blank = repo().join(format!("build/e2e/datapath/blank-bay{n:02}.qcow2"));
    let _ = std::fs::remove_file(&blank);
    nas.plug_bay(n, &blank).unwrap_or_else(|e| panic!("plug a blank disk into BAY{n:02}: {e:#}"));
    poll(nas, "ls /dev/disk/by-bay/", &format!("BAY{n:02}"), Duration::from_secs(15));
}

/// A disk image holding an ext4 filesystem, as a disk from another machine would.
fn foreign_disk(name: &str) -> std::path::PathBuf {
    let dir = repo().join("build/e2e/datapath");
    let raw = dir.join(format!("{name}.raw"));
    let qcow = dir.join(format!("{name}.qcow2"));
    let _ = std::fs::remove_file(&qcow);
    let run = |cmd: &mut std::process::Command| {
        let o = cmd.output().expect("run");
        assert!(o.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    run(std::process::Command::new("truncate").args(["-s", "4G"]).arg(&raw));
    run(std::process::Command::new("mkfs.ext4").args(["-q", "-F", "-L", "elsewhere"]).arg(&raw));
    run(std::process::Command::new("qemu-img").args(["convert", "-q", "-O", "qcow2"]).arg(&raw).arg(&qcow));
    let _ = std::fs::remove_file(&raw);
    qcow
}

/// The JSON a command printed (after anything the console added before it).
/// Runs `cmd` (JSON out) until its value satisfies `done` or `within` has passed; returns the
/// last value.
fn poll_json(
    vm: &mut nasos_qemu::Vm,
    cmd: &str,
    done: impl Fn(&serde_json::Value) -> bool,
    within: Duration,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + within;
    loop {
        let v = json(&ok(vm, cmd));
        if done(&v) || std::time::Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn json(out: &str) -> serde_json::Value {
    nasos_tests::console_json(out)
}
