//! The plan: the fully resolved description of one image (types here; `resolve` makes it from a
//! recipe and its board, `services` builds its service graph, `display` is what `nasos plan` prints). Every later stage (image build, nasinit,
//! the services) consumes this, never the recipe, so what runs is derived in exactly one place.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use serde::{Deserialize, Serialize};

use crate::board::{DeviceMatch, RdmaKind};
use crate::recipe::{CreatePolicy, NfsVersion, RootLogin, VdevKind};

mod display;
pub mod firewall;
mod resolve;
mod services;
pub mod udev;

pub use resolve::resolve;
pub use services::SERVICE_NAMES;

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
    /// Automatic snapshot policies, one per dataset.
    #[serde(default)]
    pub snapshots: Vec<SnapshotPlan>,
    /// Peers, what is sent to them and what they may send here.
    #[serde(default)]
    pub replication: ReplicationPlan,
    /// Teams sharing the box, each with its dataset subtree and networks.
    #[serde(default)]
    pub tenants: Vec<TenantPlan>,
    /// The Kerberos realm of the `sec=krb5*` exports.
    #[serde(default)]
    pub kerberos: Option<KerberosPlan>,
    pub nfs: Option<NfsPlan>,
    pub health: HealthPlan,
    pub upgrade: UpgradePlan,
    pub liveness: LivenessPlan,
    /// What the box answers on beyond what the plan serves (`firewall::allowed` adds those).
    pub firewall: FirewallPlan,
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
    /// The Secure Boot db certificate the boot chain is signed for, as the recipe names it
    /// (relative to the recipe); none: unsigned.
    #[serde(default)]
    pub secure_boot_db: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelPlan {
    /// Modules the initramfs loads to reach the root filesystem.
    pub initramfs_modules: Vec<String>,
    /// Every module the image keeps and the box loads: the module sets' modules, in order.
    pub modules: Vec<String>,
    /// The same modules split by who needs them, each set loaded by its own supervised oneshot
    /// (the set's `service`): a consumer starts once its own drivers are in, so storage does not
    /// wait for nfsd, nor the links for zfs.
    pub module_sets: Vec<ModuleSet>,
    /// Module parameters (`modprobe NAME KEY=VALUE`), by module.
    pub module_options: BTreeMap<String, BTreeMap<String, String>>,
    /// Kernel command line, without the root and verity arguments the image stage adds.
    pub cmdline: Vec<String>,
}

/// Modules one `nasinit load-modules SERVICE` oneshot loads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModuleSet {
    /// The service that loads the set (`modules-drives`, `modules`, `modules-storage`,
    /// `modules-net`, `modules-nfs`, `modules-late`).
    pub service: String,
    /// The modules, in load order (modprobe brings their dependencies).
    pub modules: Vec<String>,
    /// The storage set: before its modules load, replay the drives' block devices' add events
    /// (their driver was in before udevd ran: in the initramfs when the box boots from NVMe, or
    /// in `modules-drives`), for udev to name the bays and for libzfs's import, which waits for
    /// udev on each member; once its modules are in, wait for the bays to be named. Nothing
    /// else is replayed (a full coldplug costs seconds of udev work under emulation, for no
    /// rule the box uses).
    pub bays: bool,
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
    /// The tenant whose VLAN it is: NFS on it answers only that tenant's networks.
    #[serde(default)]
    pub tenant: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KerberosPlan {
    pub realm: String,
    /// The NFSv4 id-mapping domain: the realm in lowercase.
    pub idmap_domain: String,
    /// Accounts the realm's principals map to: (name, uid, gid).
    pub users: Vec<(String, u32, u32)>,
}

impl KerberosPlan {
    /// /etc/krb5.conf: the realm is the default, and nothing is looked up in DNS (the box
    /// resolves no names; accepting a ticket needs only the keytab).
    pub fn krb5_conf(&self) -> String {
        format!(
            "# Written by nasos from the plan.\n[libdefaults]\n\tdefault_realm = {}\n\tdns_lookup_kdc = false\n\tdns_lookup_realm = false\n",
            self.realm
        )
    }

    /// /etc/idmapd.conf: owners travel as `name@domain`; a principal of the realm is the
    /// account of its name. Debian's unknown-owner group is `nogroup`: rpc.idmapd exits when
    /// the group it is told (by default `nobody`) does not exist.
    pub fn idmapd_conf(&self) -> String {
        format!(
            "# Written by nasos from the plan.\n[General]\nDomain = {}\nLocal-Realms = {}\n\n[Mapping]\nNobody-User = nobody\nNobody-Group = nogroup\n\n[Translation]\nMethod = nsswitch\n",
            self.idmap_domain, self.realm
        )
    }
}

/// One team on the box.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantPlan {
    pub name: String,
    /// The root of its subtree (created with its quota and reservation, in `datasets`).
    pub dataset: String,
    pub networks: Vec<String>,
    /// Its quota in bytes; none: unlimited.
    pub quota_bytes: Option<u64>,
    pub reservation_bytes: Option<u64>,
    /// `root` or `all` (every user mapped to `anon_uid`/`anon_gid`).
    pub squash: String,
    /// Its VLAN interfaces (`data0.100`).
    pub vlans: Vec<String>,
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

impl PoolPlan {
    /// Every bay the pool uses: its vdevs' members, then its spares.
    pub fn member_bays(&self) -> impl Iterator<Item = &String> {
        self.vdevs.iter().flat_map(|v| v.bays.iter()).chain(self.spares.iter())
    }
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
    /// Who owns its top directory when it is created (uid, gid): a tenant that maps every
    /// client user to one account gets a root directory that account can write in.
    #[serde(default)]
    pub owner: Option<(u32, u32)>,
}

/// One dataset's snapshot policy: what the `snapshots` service takes, keeps and holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotPlan {
    pub dataset: String,
    pub recursive: bool,
    /// The period of frequent snapshots, in minutes (it divides the hour).
    pub frequent_minutes: u32,
    pub keep: Retention,
    /// How long each snapshot the policy takes is held after it was taken; 0: not held.
    pub hold_seconds: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicationPlan {
    /// Development images: the box's secret key (OpenSSH format), the same for every box of the
    /// image. Otherwise each box makes its own on first boot (state partition).
    pub identity: Option<String>,
    pub peers: Vec<PeerPlan>,
    pub jobs: Vec<ReplicationJobPlan>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerPlan {
    pub name: String,
    pub address: String,
    /// Its OpenSSH public key line (`ssh-ed25519 AAAA… comment`).
    pub key: String,
    /// The link of this box whose subnet holds the peer's address, and this box's address there.
    pub link: String,
    pub local_address: String,
    /// Datasets it may replicate into on this box.
    pub receive: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicationJobPlan {
    pub dataset: String,
    pub peer: String,
    /// Its name on the peer.
    pub target: String,
    pub every_minutes: u32,
    /// Bytes per second a send may use; none: unlimited.
    pub bandwidth_bytes: Option<u64>,
    /// Alert when the newest common snapshot is older than this.
    pub lag_alert_seconds: u64,
}

/// How many snapshots of each kind a policy keeps (0: the kind is not taken).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    pub frequently: u32,
    pub hourly: u32,
    pub daily: u32,
    pub weekly: u32,
    pub monthly: u32,
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
    /// An export asks for Kerberos: rpc.svcgssd (with the joined keytab) and rpc.idmapd run.
    #[serde(default)]
    pub gss: bool,
    pub exports: Vec<ExportPlan>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportPlan {
    pub dataset: String,
    pub path: String,
    /// The tenant whose export it is (offered to its networks only).
    #[serde(default)]
    pub tenant: Option<String>,
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
                secure_boot_db: None,
            },
            packages: Vec::new(),
            kernel: KernelPlan {
                initramfs_modules: Vec::new(),
                modules: Vec::new(),
                module_sets: Vec::new(),
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
            snapshots: Vec::new(),
            replication: ReplicationPlan::default(),
            tenants: Vec::new(),
            kerberos: None,
            nfs: None,
            health: HealthPlan {
                watchdog_driver: String::new(),
                watchdog_identity: String::new(),
                watchdog_timeout_seconds: 60,
                nvme_temperature_warn_celsius: 70,
                pool_capacity_warn_percent: 80,
                tenant_quota_warn_percent: 90,
                check_interval_seconds: 10,
                nvme_spare_warn_percent: 10,
                nvme_wear_warn_percent: 90,
                cpu_temperature_warn_celsius: 90,
                fatal_grace_seconds: 120,
                syslog: Vec::new(),
                metrics: None,
            },
            upgrade: UpgradePlan {
                boot_tries: 3,
                min_version: "0.0.0".into(),
                trusted_keys: Vec::new(),
                bless_after_seconds: 300,
            },
            liveness: LivenessPlan { ready_deadline_seconds: 0, failed_boots_before_staying_up: 3 },
            firewall: FirewallPlan::default(),
            services: Vec::new(),
        }
    }
}

impl NfsPlan {
    /// The /etc/exports text, one line per export.
    pub fn exports_table(&self) -> String {
        self.exports_table_of(|_| true)
    }

    /// The table for the exports `serve` says yes to (the others stay off).
    pub fn exports_table_of(&self, serve: impl Fn(&ExportPlan) -> bool) -> String {
        let mut out = String::new();
        for e in self.exports.iter().filter(|e| serve(e)) {
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
    pub tenant_quota_warn_percent: u32,
    pub check_interval_seconds: u32,
    pub nvme_spare_warn_percent: u32,
    pub nvme_wear_warn_percent: u32,
    pub cpu_temperature_warn_celsius: u32,
    /// How long a fatal condition may last before nasinit lets the watchdog reset the box.
    pub fatal_grace_seconds: u32,
    /// Remote syslog receivers for alerts.
    pub syslog: Vec<SyslogTarget>,
    /// Where the Prometheus endpoint listens (`10.77.0.1:9100`), if anywhere.
    pub metrics: Option<std::net::SocketAddr>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyslogTarget {
    pub transport: SyslogTransport,
    pub address: std::net::SocketAddr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyslogTransport {
    Udp,
    Tcp,
}

impl SyslogTarget {
    /// `udp://ADDR:PORT` or `tcp://ADDR:PORT`, with an IP literal (`[v6]:port` for IPv6).
    pub fn parse(url: &str) -> Result<SyslogTarget, String> {
        let (transport, rest) = if let Some(r) = url.strip_prefix("udp://") {
            (SyslogTransport::Udp, r)
        } else if let Some(r) = url.strip_prefix("tcp://") {
            (SyslogTransport::Tcp, r)
        } else {
            return Err("a syslog receiver starts with udp:// or tcp://".into());
        };
        let address = rest.parse().map_err(|_| format!("`{rest}` is not an IP address and port"))?;
        Ok(SyslogTarget { transport, address })
    }
}

impl std::fmt::Display for SyslogTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = match self.transport {
            SyslogTransport::Udp => "udp",
            SyslogTransport::Tcp => "tcp",
        };
        write!(f, "{t}://{}", self.address)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpgradePlan {
    pub boot_tries: u32,
    /// The oldest running version a bundle of this image may replace.
    pub min_version: String,
    /// The keys whose bundles this box installs.
    pub trusted_keys: Vec<TrustedKeyPlan>,
    /// Ready and healthy this long in a row before a new version is blessed.
    pub bless_after_seconds: u32,
}

/// A trusted upgrade key, carried into the image (the box has no recipe tree to read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrustedKeyPlan {
    /// minisign's key id.
    pub id: String,
    /// The file it came from, as the recipe names it.
    pub file: String,
    /// The key file's text (minisign's `.pub` format).
    pub key: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirewallPlan {
    /// The recipe's `[[network.allow]]`.
    pub extra: Vec<FirewallAllowPlan>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirewallAllowPlan {
    pub link: String,
    /// `tcp` or `udp`.
    pub proto: String,
    pub port: u16,
    pub from: Vec<String>,
    pub why: String,
}

/// One supervised service.
/// The appliance's boot deadline and its reboot-loop guard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LivenessPlan {
    /// Seconds after nasinit starts by which the appliance must be ready; 0: no deadline.
    pub ready_deadline_seconds: u32,
    /// Missed deadlines in a row after which the box stays up instead of rebooting.
    pub failed_boots_before_staying_up: u32,
}

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
    /// How long it may take to become ready before it is stopped and counted as failed; none for
    /// services that are ready when started.
    #[serde(default)]
    pub start_timeout_ms: Option<u64>,
    #[serde(default)]
    pub environment: BTreeMap<String, String>,
    /// Run as this user (and its primary group); root when absent.
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub working_directory: Option<String>,
    /// The niceness it runs at while the box boots; 0 once every service without one is ready
    /// (or a minute after nasinit started, whichever is first). For what nothing on the way to
    /// serving waits for: on a small CPU it would otherwise take turns with the import and nfsd.
    #[serde(default)]
    pub boot_nice: i8,
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
