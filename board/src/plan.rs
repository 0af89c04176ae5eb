//! The plan: the fully resolved description of one image. Every later stage (image build, nasinit,
//! the services) consumes this, never the recipe, so what runs is derived in exactly one place.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use serde::{Deserialize, Serialize};

use crate::board::{Board, DeviceMatch, RdmaKind};
use crate::recipe::{Access, CreatePolicy, NfsVersion, Recipe, RootLogin, VdevKind};
use crate::units::{format_size, parse_size};
use nasos_layout::agents;
use nasos_layout::paths::{BAY_DIR, EXPORT_ROOT, NASINIT};

/// Bumped whenever the plan's JSON changes incompatibly.
pub const PLAN_VERSION: u32 = 1;

/// Why a plan file cannot be used.
#[derive(Debug)]
pub enum PlanError {
    Json(serde_json::Error),
    /// Made by a nasos whose plan format this one does not read.
    Version(u32),
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Json(e) => write!(f, "not a plan: {e}"),
            PlanError::Version(v) => {
                write!(
                    f,
                    "plan format version {v}, but this nasinit reads version {PLAN_VERSION}: image and programs disagree"
                )
            }
        }
    }
}

impl std::error::Error for PlanError {}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub plan_version: u32,
    pub image: ImagePlan,
    /// Debian packages of the root filesystem, sorted.
    pub packages: Vec<String>,
    pub kernel: KernelPlan,
    pub console: ConsolePlan,
    pub bays: Vec<BayPlan>,
    pub links: Vec<LinkPlan>,
    pub fabric: Option<FabricPlan>,
    pub zfs: ZfsPlan,
    pub pools: Vec<PoolPlan>,
    pub datasets: Vec<DatasetPlan>,
    pub nfs: Option<NfsPlan>,
    pub health: HealthPlan,
    pub upgrade: UpgradePlan,
    /// The service graph nasinit supervises, in a valid start order.
    pub services: Vec<Service>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImagePlan {
    pub name: String,
    pub version: String,
    pub hostname: String,
    pub board: String,
    pub emulated_board: bool,
    pub development: bool,
    pub size_budget_mib: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelPlan {
    /// Modules the initramfs loads to reach the root filesystem.
    pub initramfs_modules: Vec<String>,
    /// Modules nasinit loads before starting services, in order.
    pub modules: Vec<String>,
    /// Module parameters (`modprobe NAME KEY=VALUE`), by module.
    pub module_options: BTreeMap<String, BTreeMap<String, String>>,
    /// Kernel command line, without the root and verity arguments the image stage adds.
    pub cmdline: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConsolePlan {
    pub device: String,
    pub baud: u32,
    pub root_login: RootLogin,
    pub root_password_hash: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BayPlan {
    pub name: String,
    /// How nasinit finds the drive.
    #[serde(rename = "match")]
    pub matcher: DeviceMatch,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkPlan {
    pub name: String,
    pub port: String,
    #[serde(rename = "match")]
    pub matcher: DeviceMatch,
    pub driver: String,
    pub speed_mbps: u32,
    pub mtu: u32,
    pub addresses: Vec<String>,
    pub vlans: Vec<VlanPlan>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VlanPlan {
    pub name: String,
    pub id: u32,
    pub addresses: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FabricPlan {
    pub lossless_priority: u8,
    pub pfc_required: bool,
    /// ETS shares per traffic class, or `None` to leave the NIC's ETS alone.
    pub ets_bandwidth: Option<[u8; 8]>,
    /// DSCP → priority entries for the DCB APP table.
    pub dscp: Vec<DscpPlan>,
    pub links: Vec<FabricLinkPlan>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DscpPlan {
    pub dscp: u8,
    pub priority: u8,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FabricLinkPlan {
    pub link: String,
    pub rdma: RdmaKind,
    /// The RDMA device to create (soft-RoCE) or `None` when the NIC's own device is found at runtime.
    pub rxe_device: Option<String>,
    /// How DCB is applied on this link.
    pub dcb: DcbMethod,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DcbMethod {
    /// Through dcbnl (rtnetlink).
    Dcbnl,
    /// The NIC has no DCB: reported as "not supported by this NIC", never pretended.
    Unsupported,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ZfsPlan {
    pub arc_max_bytes: Option<u64>,
    pub tunables: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolPlan {
    pub name: String,
    pub create: CreatePolicy,
    pub ashift: u32,
    pub mountpoint: String,
    pub vdevs: Vec<VdevPlan>,
    pub spares: Vec<String>,
    pub properties: BTreeMap<String, String>,
    pub filesystem: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VdevPlan {
    #[serde(rename = "type")]
    pub kind: VdevKind,
    pub bays: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetPlan {
    pub name: String,
    pub mountpoint: String,
    /// Every property the dataset must have, quota and reservation included.
    pub properties: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NfsPlan {
    pub versions: Vec<NfsVersion>,
    pub threads: u32,
    pub tcp_port: u16,
    /// The RDMA listener, when any export asks for RDMA.
    pub rdma_port: Option<u16>,
    pub grace_seconds: u32,
    pub lease_seconds: u32,
    /// NFSv3 needs rpcbind and rpc.statd; NFSv4 alone does not.
    pub rpcbind: bool,
    pub exports: Vec<ExportPlan>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportPlan {
    pub dataset: String,
    pub path: String,
    /// Its clients mount it over RDMA (what made nfsd listen on the RDMA port).
    pub rdma: bool,
    pub clients: Vec<ExportClientPlan>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportClientPlan {
    pub network: String,
    /// exports(5) options, in order.
    pub options: Vec<String>,
}

impl Plan {
    /// A plan that runs nothing: what PID 1 falls back to when the image's plan cannot be read,
    /// so the appliance still comes up far enough to be inspected.
    pub fn empty(hostname: &str) -> Plan {
        Plan {
            plan_version: PLAN_VERSION,
            image: ImagePlan {
                name: "unknown".into(),
                version: "0.0.0".into(),
                hostname: hostname.into(),
                board: "unknown".into(),
                emulated_board: false,
                development: false,
                size_budget_mib: None,
            },
            packages: Vec::new(),
            kernel: KernelPlan {
                initramfs_modules: Vec::new(),
                modules: Vec::new(),
                module_options: BTreeMap::new(),
                cmdline: Vec::new(),
            },
            console: ConsolePlan {
                device: "ttyS0".into(),
                baud: 115200,
                root_login: RootLogin::Locked,
                root_password_hash: None,
            },
            bays: Vec::new(),
            links: Vec::new(),
            fabric: None,
            zfs: ZfsPlan { arc_max_bytes: None, tunables: BTreeMap::new() },
            pools: Vec::new(),
            datasets: Vec::new(),
            nfs: None,
            health: HealthPlan {
                watchdog_driver: String::new(),
                watchdog_identity: String::new(),
                watchdog_timeout_seconds: 60,
                nvme_temperature_warn_celsius: 70,
                pool_capacity_warn_percent: 80,
                check_interval_seconds: 10,
            },
            upgrade: UpgradePlan { boot_tries: 3 },
            services: Vec::new(),
        }
    }
}

impl NfsPlan {
    /// The /etc/exports text, one line per export.
    pub fn exports_table(&self) -> String {
        let mut out = String::new();
        for e in &self.exports {
            let _ = write!(out, "{}", e.path);
            for c in &e.clients {
                let _ = write!(out, " {}({})", c.network, c.options.join(","));
            }
            out.push('\n');
        }
        out
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthPlan {
    pub watchdog_driver: String,
    pub watchdog_identity: String,
    pub watchdog_timeout_seconds: u32,
    pub nvme_temperature_warn_celsius: u32,
    pub pool_capacity_warn_percent: u32,
    pub check_interval_seconds: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpgradePlan {
    pub boot_tries: u32,
}

/// One supervised service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Service {
    pub name: String,
    /// argv; the first element is an absolute path.
    pub command: Vec<String>,
    /// Services that must be ready before this one starts.
    pub after: Vec<String>,
    pub readiness: Readiness,
    pub restart: RestartPolicy,
    /// Run on shutdown before the service is stopped (e.g. export pools).
    pub stop_command: Option<Vec<String>>,
    /// How long the service gets to stop before its cgroup is killed.
    pub stop_timeout_ms: u64,
    #[serde(default)]
    pub environment: BTreeMap<String, String>,
    /// Run as this user (and its primary group); root when absent.
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub working_directory: Option<String>,
}

/// When a service counts as ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Readiness {
    /// As soon as the process runs.
    Started,
    /// When it exits with status 0 (a oneshot).
    Exited,
    /// When it sends `READY=1` on its notify socket (`$NOTIFY_SOCKET`, as sd_notify does).
    Notify,
    /// When it writes a newline to this file descriptor (s6's readiness protocol).
    Fd { fd: u32 },
    /// When this command exits 0.
    Check { command: Vec<String>, interval_ms: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartPolicy {
    pub when: Restart,
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
    /// Starts within `start_limit_window_ms` after which the service is `failed`.
    pub start_limit: u32,
    pub start_limit_window_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Restart {
    Always,
    OnFailure,
    Never,
}

/// Resolves a validated recipe on its board into a plan.
///
/// The recipe must have passed validation: names it refers to exist, sizes parse.
pub fn resolve(r: &Recipe, b: &Board) -> Plan {
    let uses_zfs = !r.pools.is_empty();
    let rdma_exports = r.nfs.as_ref().is_some_and(|n| n.exports.iter().any(|e| e.rdma));
    let port_of = |name: &str| b.ports.iter().find(|p| p.name == name);

    let mut packages: Vec<String> = [
        "linux-image-amd64",
        "kmod",
        "udev",
        "util-linux",
        "iproute2",
        "ethtool",
        "nvme-cli",
        "procps",
        "login",
        "passwd",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if uses_zfs {
        packages.push("zfsutils-linux".into());
    }
    if r.nfs.is_some() {
        packages.push("nfs-kernel-server".into());
    }
    if r.fabric.is_some() {
        packages.extend(["rdma-core", "ibverbs-providers", "ibverbs-utils"].map(String::from));
    }
    packages.extend(b.packages.iter().cloned());
    packages.extend(r.packages.extra.iter().cloned());
    packages.sort();
    packages.dedup();

    let boot_drivers: &[&str] =
        if b.boot.matcher.virtio_serial.is_some() { &["virtio_pci", "virtio_blk"] } else { &["nvme"] };
    let mut initramfs_modules: Vec<String> = boot_drivers.iter().map(|s| s.to_string()).collect();
    initramfs_modules.extend(["dm-mod", "dm-verity", "erofs"].map(String::from));
    let mut modules: Vec<String> = b.kernel.modules.clone();
    let mut push = |m: &str| {
        if !modules.iter().any(|x| x == m) {
            modules.push(m.to_string());
        }
    };
    push("nvme");
    push(&b.watchdog.driver);
    // The ESP is FAT: blessing a boot entry renames a file on it.
    push("vfat");
    for link in &r.network.links {
        if let Some(port) = port_of(&link.port) {
            push(&port.driver);
        }
        if !link.vlans.is_empty() {
            push("8021q");
        }
    }
    if let Some(f) = &r.fabric {
        for l in &f.links {
            if let Some(port) = r.network.links.iter().find(|x| &x.name == l).and_then(|x| port_of(&x.port)) {
                port.rdma.modules().iter().for_each(|m| push(m));
            }
        }
        push("ib_uverbs");
        push("rdma_ucm");
    }
    if uses_zfs {
        push("zfs");
    }
    if r.nfs.is_some() {
        push("nfsd");
    }
    if rdma_exports {
        push("rpcrdma");
    }
    for m in &r.kernel.modules {
        push(m);
    }
    let mut module_options: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    if uses_zfs {
        let mut zfs: BTreeMap<String, String> = r.zfs.tunables.clone();
        if let Some(arc) = r.zfs.arc_max.as_deref().and_then(parse_size) {
            zfs.insert("zfs_arc_max".into(), arc.to_string());
        }
        if !zfs.is_empty() {
            module_options.insert("zfs".into(), zfs);
        }
    }
    let mut cmdline = vec![format!("console={},{}", b.console.device, b.console.baud), "panic=10".to_string()];
    cmdline.extend(b.kernel.cmdline.iter().cloned());

    let bays = b.bays.iter().map(|bay| BayPlan { name: bay.name.clone(), matcher: bay.matcher.clone() }).collect();

    let links = r
        .network
        .links
        .iter()
        .filter_map(|l| {
            let port = port_of(&l.port)?;
            Some(LinkPlan {
                name: l.name.clone(),
                port: port.name.clone(),
                matcher: port.matcher.clone(),
                driver: port.driver.clone(),
                speed_mbps: port.speed_mbps,
                mtu: l.mtu,
                addresses: l.addresses.clone(),
                vlans: l
                    .vlans
                    .iter()
                    .map(|v| VlanPlan {
                        name: format!("{}.{}", l.name, v.id),
                        id: v.id,
                        addresses: v.addresses.clone(),
                    })
                    .collect(),
            })
        })
        .collect();

    let fabric = r.fabric.as_ref().map(|f| FabricPlan {
        lossless_priority: clamp_u8(f.lossless_priority),
        pfc_required: f.pfc_required,
        ets_bandwidth: f.ets_bandwidth.as_ref().and_then(|v| {
            let arr: Vec<u8> = v.iter().map(|x| clamp_u8(*x)).collect();
            arr.try_into().ok()
        }),
        dscp: f.dscp.iter().map(|d| DscpPlan { dscp: clamp_u8(d.dscp), priority: clamp_u8(d.priority) }).collect(),
        links: f
            .links
            .iter()
            .filter_map(|name| {
                let port = port_of(&r.network.links.iter().find(|x| &x.name == name)?.port)?;
                Some(FabricLinkPlan {
                    link: name.clone(),
                    rdma: port.rdma,
                    rxe_device: (port.rdma == RdmaKind::SoftRoce).then(|| format!("rxe_{name}")),
                    dcb: if port.dcb { DcbMethod::Dcbnl } else { DcbMethod::Unsupported },
                })
            })
            .collect(),
    });

    let pools = r
        .pools
        .iter()
        .map(|p| PoolPlan {
            name: p.name.clone(),
            create: p.create,
            ashift: p.ashift,
            mountpoint: format!("{EXPORT_ROOT}/{}", p.name),
            vdevs: p.vdevs.iter().map(|v| VdevPlan { kind: v.kind, bays: v.bays.clone() }).collect(),
            spares: p.spares.clone(),
            properties: p.properties.clone(),
            filesystem: p.filesystem.clone(),
        })
        .collect();

    let datasets = r
        .datasets
        .iter()
        .map(|d| {
            let mut properties = d.properties.clone();
            if let Some(q) = &d.quota {
                properties.insert("quota".into(), q.clone());
            }
            if let Some(q) = &d.reservation {
                properties.insert("reservation".into(), q.clone());
            }
            DatasetPlan { name: d.name.clone(), mountpoint: format!("{EXPORT_ROOT}/{}", d.name), properties }
        })
        .collect();

    let nfs = r.nfs.as_ref().map(|n| {
        let mut versions = n.versions.clone();
        versions.sort();
        versions.dedup();
        NfsPlan {
            rpcbind: versions.contains(&NfsVersion::V3),
            versions,
            threads: n.threads,
            tcp_port: 2049,
            rdma_port: rdma_exports.then(|| u16::try_from(n.rdma_port).unwrap_or(20049)),
            grace_seconds: n.grace_seconds,
            lease_seconds: n.lease_seconds,
            exports: n
                .exports
                .iter()
                .map(|e| ExportPlan {
                    dataset: e.dataset.clone(),
                    path: format!("{EXPORT_ROOT}/{}", e.dataset),
                    rdma: e.rdma,
                    clients: e
                        .clients
                        .iter()
                        .map(|c| {
                            let mut o = vec![match c.access {
                                Access::Rw => "rw",
                                Access::Ro => "ro",
                            }];
                            o.push(if c.sync { "sync" } else { "async" });
                            o.push(if c.root_squash { "root_squash" } else { "no_root_squash" });
                            o.extend(["no_subtree_check", "sec=sys"]);
                            ExportClientPlan {
                                network: c.network.clone(),
                                options: o.into_iter().map(String::from).collect(),
                            }
                        })
                        .collect(),
                })
                .collect(),
        }
    });

    let health = HealthPlan {
        watchdog_driver: b.watchdog.driver.clone(),
        watchdog_identity: b.watchdog.identity.clone(),
        watchdog_timeout_seconds: r.health.watchdog_timeout_seconds,
        nvme_temperature_warn_celsius: r.health.nvme_temperature_warn_celsius,
        pool_capacity_warn_percent: r.health.pool_capacity_warn_percent,
        check_interval_seconds: r.health.check_interval_seconds,
    };

    let console = console_service(r.console.root_login, &b.console.device, b.console.baud);
    let mut services = services(r.fabric.is_some() || !r.network.links.is_empty(), uses_zfs, r.nfs.is_some());
    services.splice(0..0, console);

    Plan {
        plan_version: PLAN_VERSION,
        image: ImagePlan {
            name: r.image.name.clone(),
            version: r.image.version.clone(),
            hostname: r.image.hostname.clone().unwrap_or_else(|| r.image.name.clone()),
            board: b.board.name.clone(),
            emulated_board: b.board.emulated,
            development: r.image.development,
            size_budget_mib: r.image.size_budget_mib,
        },
        packages,
        kernel: KernelPlan { initramfs_modules, modules, module_options, cmdline },
        console: ConsolePlan {
            device: b.console.device.clone(),
            baud: b.console.baud,
            root_login: r.console.root_login,
            root_password_hash: (r.console.root_login == RootLogin::Password)
                .then(|| r.console.root_password_hash.clone())
                .flatten(),
        },
        bays,
        links,
        fabric,
        zfs: ZfsPlan { arc_max_bytes: r.zfs.arc_max.as_deref().and_then(parse_size), tunables: r.zfs.tunables.clone() },
        pools,
        datasets,
        nfs,
        health,
        upgrade: UpgradePlan { boot_tries: r.upgrade.boot_tries },
        services,
    }
}

fn clamp_u8(v: u32) -> u8 {
    u8::try_from(v).unwrap_or(u8::MAX)
}

/// A getty on the serial console, unless the console is locked. It depends on nothing, so an
/// operator can log in while storage is still coming up (or failing to).
fn console_service(login: RootLogin, device: &str, baud: u32) -> Option<Service> {
    let mut command = vec!["/usr/sbin/agetty".to_string()];
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
        environment: BTreeMap::new(),
        user: None,
        working_directory: None,
    })
}

/// The service graph. Order matters: it is a valid start order, and shutdown runs it backwards.
fn services(network: bool, storage: bool, nfs: bool) -> Vec<Service> {
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
            environment: BTreeMap::new(),
            user: None,
            working_directory: None,
        });
    };
    // Modules load in a supervised oneshot, not in PID 1 itself: a hung modprobe then shows up
    // as a service that does not become ready, instead of a box that does not boot.
    let load_modules = vec![NASINIT.to_string(), agents::NASINIT_LOAD_MODULES.to_string()];
    let modules_policy = RestartPolicy { start_limit: 3, ..oneshot.clone() };
    // udev names devices the way libzfs waits for them (a pool's partitions), and loads drivers
    // for what it finds. systemd-udevd speaks sd_notify.
    add("udev", vec!["/usr/lib/systemd/systemd-udevd".into()], Readiness::Notify, &daemon, None, &[]);
    add("modules", load_modules, Readiness::Exited, &modules_policy, None, &["udev"]);
    if network {
        add("fabric", agents::FABRIC.command("up"), Readiness::Exited, &oneshot, None, &["modules"]);
    }
    if storage {
        add(
            "storage",
            agents::STORAGE.command("up"),
            Readiness::Exited,
            &oneshot,
            Some(agents::STORAGE.command("export")),
            &["modules"],
        );
    }
    if nfs {
        add("nfs", agents::NFS.command("serve"), Readiness::Notify, &daemon, None, &["storage", "fabric"]);
    }
    add("health", agents::HEALTH.command("run"), Readiness::Notify, &daemon, None, &["modules", "storage", "nfs"]);
    let never = RestartPolicy { when: Restart::Never, ..oneshot.clone() };
    add(
        "bless",
        agents::UPGRADE.command("bless"),
        Readiness::Exited,
        &never,
        None,
        &["fabric", "storage", "nfs", "health"],
    );
    out
}

impl Plan {
    /// Reads a plan as the image carries it, refusing one of another format version (a field
    /// whose meaning changed must not be guessed at).
    pub fn from_json(text: &str) -> Result<Plan, PlanError> {
        #[derive(Deserialize)]
        struct Versioned {
            plan_version: u32,
        }
        let v: Versioned = serde_json::from_str(text).map_err(PlanError::Json)?;
        if v.plan_version != PLAN_VERSION {
            return Err(PlanError::Version(v.plan_version));
        }
        serde_json::from_str(text).map_err(PlanError::Json)
    }
}

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
        writeln!(f, "  modules            {}", self.kernel.modules.join(" "))?;
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
            "  warn at NVMe {}°C, pool {}% full; checks every {}s",
            h.nvme_temperature_warn_celsius, h.pool_capacity_warn_percent, h.check_interval_seconds
        )?;
        writeln!(f, "\nupgrade")?;
        writeln!(f, "  {} boot tries before the previous slot boots again", self.upgrade.boot_tries)?;
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
                "  {:<8} {:<38} ready: {ready:<9} restart: {}{after}",
                s.name,
                s.command.join(" "),
                word(&s.restart.when)
            )?;
            if let Some(stop) = &s.stop_command {
                writeln!(f, "           on stop: {}", stop.join(" "))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_round_trips_and_another_format_version_is_refused() {
        let mut plan = Plan::empty("box");
        plan.image.version = "1.2.3".into();
        let json = serde_json::to_string(&plan).expect("serializes");
        assert_eq!(Plan::from_json(&json).expect("reads back"), plan);
        plan.plan_version = PLAN_VERSION + 1;
        let newer = serde_json::to_string(&plan).expect("serializes");
        let e = Plan::from_json(&newer).expect_err("newer format");
        assert!(e.to_string().contains(&format!("plan format version {}", PLAN_VERSION + 1)), "{e}");
        assert!(Plan::from_json("{}").is_err());
    }
}
