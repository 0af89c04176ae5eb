//! The service graph of a plan: the console, the drives' driver (`modules-drives`) → udev → the
//! module sets side by side (`modules`, `modules-storage`, `modules-net`, `modules-nfs`) →
//! firewall → fabric, storage → nfs → health → bless, each service after the sets it needs.

use super::*;
use crate::recipe::Liveness;
use nasos_layout::agents;
use nasos_layout::paths::{self, NASINIT};

/// ZFS's event daemon, from the zfs-zed package.
const ZED: &str = "/usr/sbin/zed";

/// A getty on the serial console, unless the console is locked. It depends on nothing, so an
/// operator can log in while storage is still coming up (or failing to). Password login with no
/// hash in the recipe (every production image) goes through `nasinit console`, which asks for
/// root's password on the first boot and keeps it on the state partition.
pub(super) fn console_service(login: RootLogin, has_hash: bool, device: &str, baud: u32) -> Option<Service> {
    let mut command = Vec::new();
    if login == RootLogin::Password && !has_hash {
        command.extend([
            NASINIT.to_string(),
            agents::NASINIT_CONSOLE.to_string(),
            device.to_string(),
            "--".to_string(),
        ]);
    }
    command.push("/usr/sbin/agetty".to_string());
    match login {
        RootLogin::Locked => return None,
        RootLogin::Autologin => command.extend(["--autologin".to_string(), "root".to_string()]),
        RootLogin::Password => {}
    }
    command.extend(["--noclear", "--local-line"].map(String::from));
    command.extend([baud.to_string(), device.to_string(), "vt220".to_string()]);
    Some(Service {
        name: "console".into(),
        command,
        after: Vec::new(),
        readiness: Readiness::Started,
        // A logout ends agetty: start a fresh one at once, but do not spin if it cannot run.
        restart: RestartPolicy {
            when: Restart::Always,
            backoff_initial_ms: 100,
            backoff_max_ms: 10_000,
            start_limit: 20,
            start_limit_window_ms: 60_000,
        },
        stop_command: None,
        stop_timeout_ms: 5_000,
        start_timeout_ms: None,
        environment: BTreeMap::new(),
        user: None,
        working_directory: None,
        boot_nice: BOOT_NICE,
    })
}

/// The service graph. Order matters: it is a valid start order, and shutdown runs it backwards.
/// Every service name a plan may have, for recipe settings that name services.
pub const SERVICE_NAMES: &[&str] = &[
    "console",
    MODULES_DRIVES,
    "udev",
    MODULES,
    MODULES_STORAGE,
    MODULES_NET,
    MODULES_NFS,
    "firewall",
    "fabric",
    "storage",
    "zed",
    DRIVE_IDS,
    "nfs",
    "snapshots",
    "sshd",
    "replication",
    "health",
    "bless",
];

/// The module sets' services (see [`super::ModuleSet`]): what the board and the box need, what
/// storage needs (the drives' driver, zfs), what the links need (NIC, RDMA, nftables), what
/// NFS needs (nfsd, its RDMA transport).
pub const MODULES: &str = "modules";
/// The drives' driver alone, before udevd starts: udev then never sees the ~48 events of the
/// drives' controllers, generic character devices, hwmon sensors and subsystems (about 2 s of
/// udev's CPU under TCG, for no rule the box uses), and the storage set replays only the drives'
/// block devices, whose rules name the bays and which libzfs's import waits for.
pub const MODULES_DRIVES: &str = "modules-drives";
pub const MODULES_STORAGE: &str = "modules-storage";
pub const MODULES_NET: &str = "modules-net";
pub const MODULES_NFS: &str = "modules-nfs";
/// What serving does not need (the USB controller, for a stick with a bundle): loaded once the box
/// serves, at the lowest priority, so it takes no CPU from the boot's critical path (under QEMU's
/// TCG the controller's init alone took 11 s of a one-vCPU boot). Nothing waits for it.
pub const MODULES_LATE: &str = "modules-late";
/// udev's full probe of the pools' members (their vdev GUIDs, which zed matches a pulled drive
/// by), once the box serves: the storage agent's `probe`.
pub const DRIVE_IDS: &str = "drive-ids";

/// Gives each service that is not ready at once its start timeout (the recipe's, or its
/// override), and swaps in a program that never finishes for services a development recipe
/// wants hung.
pub(super) fn apply_liveness(services: &mut [Service], liveness: &Liveness, hang: &[String]) {
    for s in services {
        if s.readiness != Readiness::Started {
            let secs = liveness.start_timeouts.get(&s.name).copied().unwrap_or(liveness.start_timeout_seconds);
            s.start_timeout_ms = Some(u64::from(secs) * 1000);
        }
        if hang.contains(&s.name) {
            s.command = vec![NASINIT.to_string(), agents::NASINIT_DEBUG_HANG.to_string()];
        }
    }
}

/// What the recipe asks the box to run, beyond the modules.
pub(super) struct Features {
    pub network: bool,
    pub storage: bool,
    pub nfs: bool,
    pub snapshots: bool,
    /// Datasets are sent to peers.
    pub send: bool,
    /// Peers may send here (sshd, with a forced command).
    pub receive: bool,
}

pub(super) fn services(module_sets: &[&str], f: &Features) -> Vec<Service> {
    let Features { network, storage, nfs, snapshots, send, receive } = *f;
    let oneshot = RestartPolicy {
        when: Restart::OnFailure,
        backoff_initial_ms: 1000,
        backoff_max_ms: 30_000,
        start_limit: 5,
        start_limit_window_ms: 300_000,
    };
    let daemon = RestartPolicy { when: Restart::Always, ..oneshot.clone() };
    let mut out: Vec<Service> = Vec::new();
    let mut add = |name: &str, command, readiness, restart: &RestartPolicy, stop_command, after: &[&str]| {
        let present: Vec<String> =
            after.iter().filter(|a| out.iter().any(|s| s.name == **a)).map(|a| a.to_string()).collect();
        out.push(Service {
            name: name.to_string(),
            command,
            after: present,
            readiness,
            restart: restart.clone(),
            stop_command,
            stop_timeout_ms: 30_000,
            start_timeout_ms: None,
            environment: BTreeMap::new(),
            user: None,
            working_directory: None,
            boot_nice: 0,
        });
    };
    // Modules load in supervised oneshots, not in PID 1 itself: a hung modprobe then shows up
    // as a service that does not become ready, instead of a box that does not boot. The sets
    // load side by side; each consumer waits for the base set and its own.
    let modules_policy = RestartPolicy { start_limit: 3, ..oneshot.clone() };
    // udev names devices the way libzfs waits for them (a pool's partitions), and loads drivers
    // for what it finds. systemd-udevd speaks sd_notify.
    let load = |set: &str| vec![NASINIT.to_string(), agents::NASINIT_LOAD_MODULES.to_string(), set.to_string()];
    if module_sets.contains(&MODULES_DRIVES) {
        add(MODULES_DRIVES, load(MODULES_DRIVES), Readiness::Exited, &modules_policy, None, &[]);
    }
    add("udev", vec!["/usr/lib/systemd/systemd-udevd".into()], Readiness::Notify, &daemon, None, &[MODULES_DRIVES]);
    for set in module_sets.iter().filter(|s| **s != MODULES_LATE && **s != MODULES_DRIVES) {
        add(set, load(set), Readiness::Exited, &modules_policy, None, &["udev"]);
    }
    if network {
        // The plan's ruleset, as one nft transaction, before any link is up or anything listens:
        // if it cannot be loaded, the links stay down (the box fails closed, and says why).
        let load = vec![paths::NFT.to_string(), "-f".to_string(), paths::FIREWALL_RULES.to_string()];
        add("firewall", load, Readiness::Exited, &oneshot, None, &[MODULES, MODULES_NET]);
        let after = [MODULES, MODULES_NET, "firewall"];
        add("fabric", agents::FABRIC.command("up"), Readiness::Exited, &oneshot, None, &after);
    }
    if storage {
        add(
            "storage",
            agents::STORAGE.command("up"),
            Readiness::Exited,
            &oneshot,
            Some(agents::STORAGE.command("export")),
            &[MODULES, MODULES_DRIVES, MODULES_STORAGE],
        );
        // ZFS's event daemon: it marks a pulled drive REMOVED from the hot-plug event itself
        // (without it ZFS notices only at the next I/O to that drive), swaps in a hot spare for a
        // faulted or removed member, and runs ZFS's own reactions to pool events. It and the
        // snapshot and replication agents wait for storage only: `after` is a requirement, so
        // ordered after nfs they would never start on a box whose NFS failed, and protecting the
        // data must not depend on serving.
        add("zed", vec![ZED.to_string(), "-F".into()], Readiness::Started, &daemon, None, &["storage"]);
        // After storage only, like zed, whose matching it feeds; it waits for the boot to be over
        // itself, so a box whose NFS fails gets it too.
        add(DRIVE_IDS, agents::STORAGE.command("probe"), Readiness::Exited, &oneshot, None, &["udev", "storage"]);
    }
    if nfs {
        let after = [MODULES, MODULES_NFS, "storage", "fabric"];
        add("nfs", agents::NFS.command("serve"), Readiness::Notify, &daemon, None, &after);
    }
    if module_sets.contains(&MODULES_LATE) {
        add(MODULES_LATE, load(MODULES_LATE), Readiness::Exited, &modules_policy, None, &["udev", "storage", "nfs"]);
    }
    if storage && snapshots {
        // Takes and prunes the policies' snapshots; ready once it runs (the first round must not
        // hold up serving), restarted if it dies.
        add("snapshots", agents::SNAPSHOTS.command("run"), Readiness::Started, &daemon, None, &["storage"]);
    }
    if storage && network && receive {
        // OpenSSH's server, for peers only: their keys log in to a forced command that can do
        // nothing but receive into the datasets the recipe lets them write.
        let after = ["firewall", "fabric", "storage"];
        add("sshd", agents::REPLICATION.command("sshd"), Readiness::Started, &daemon, None, &after);
    }
    if storage && network && send {
        let after = ["fabric", "storage"];
        add("replication", agents::REPLICATION.command("run"), Readiness::Started, &daemon, None, &after);
    }
    add(
        "health",
        agents::HEALTH.command("run"),
        Readiness::Notify,
        &daemon,
        None,
        &[MODULES, MODULES_DRIVES, MODULES_STORAGE, MODULES_NET, MODULES_NFS, "firewall", "storage", "zed", "nfs"],
    );
    let never = RestartPolicy { when: Restart::Never, ..oneshot.clone() };
    // Ready once it runs: a version on trial is watched for the recipe's time after the box is
    // ready, and the box does not wait for that.
    add(
        "bless",
        agents::UPGRADE.command("bless"),
        Readiness::Started,
        &never,
        None,
        &[MODULES, "fabric", "storage", "nfs", "health"],
    );
    for s in out.iter_mut().filter(|s| AFTER_SERVING.contains(&s.name.as_str())) {
        s.boot_nice = BOOT_NICE;
    }
    out
}

/// What nothing on the way to serving waits for. While the box boots these run at
/// [`BOOT_NICE`]: on one TCG vCPU, zed's zedlets for the import's events, the agents' first
/// rounds and the console's login took 1–2 s of CPU from the import and nfsd's start.
/// (Ordering them after nfs instead would keep them from starting at all on a box whose NFS
/// fails, and protecting the data must not depend on serving.)
pub const AFTER_SERVING: &[&str] =
    &["console", "zed", DRIVE_IDS, "snapshots", "sshd", "replication", "health", "bless", MODULES_LATE];
/// Their niceness while the box boots: the lowest, so they take the CPU only when nothing on
/// the way to serving wants it.
pub const BOOT_NICE: i8 = 19;
