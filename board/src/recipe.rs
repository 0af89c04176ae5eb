//! The recipe: what to build for a board. Every field here is part of the user-facing TOML format,
//! and its doc comment becomes the description editors show from `nasos schema`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A board recipe: one appliance image, declared.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// Identity of the image and the board it is built for.
    pub image: Image,
    /// Debian packages beyond what the plan derives from the recipe.
    #[serde(default)]
    pub packages: Packages,
    /// Kernel modules beyond what the plan derives from the recipe and board.
    #[serde(default)]
    pub kernel: KernelExtras,
    /// Who may log in on the serial console, and how.
    pub console: Console,
    /// Network links of the appliance.
    #[serde(default)]
    pub network: Network,
    /// The RoCE v2 fabric: which links carry RDMA and how they are made lossless.
    #[serde(default)]
    pub fabric: Option<Fabric>,
    /// ZFS module settings.
    #[serde(default)]
    pub zfs: Zfs,
    /// ZFS pools, built from bays of the board.
    #[serde(default)]
    pub pools: Vec<Pool>,
    /// ZFS datasets inside the pools.
    #[serde(default)]
    pub datasets: Vec<Dataset>,
    /// Snapshot policies: which datasets get automatic snapshots, how many of each kind are
    /// kept, and how long they are held against deletion.
    #[serde(default)]
    pub snapshots: Vec<SnapshotPolicy>,
    /// Other nasos boxes this one replicates to or receives replicas from.
    #[serde(default)]
    pub peers: Vec<Peer>,
    /// Datasets sent to a peer, incrementally, on a schedule.
    #[serde(default)]
    pub replicate: Vec<Replicate>,
    /// This box's own replication key.
    #[serde(default)]
    pub replication: Replication,
    /// Teams sharing the box: each owns a dataset subtree, its client networks (and optionally
    /// VLANs) and the exports inside its subtree, which only its networks are offered.
    #[serde(default)]
    pub tenants: Vec<Tenant>,
    /// The Kerberos realm the box's `sec=krb5*` exports belong to, and the users whose
    /// principals own files on it.
    #[serde(default)]
    pub kerberos: Option<Kerberos>,
    /// The kernel NFS server and its exports.
    #[serde(default)]
    pub nfs: Option<Nfs>,
    /// Health checks and the hardware watchdog.
    #[serde(default)]
    pub health: Health,
    /// Field upgrades: who may sign them and how many tries a new slot gets.
    #[serde(default)]
    pub upgrade: Upgrade,
    /// UEFI Secure Boot: the db key that signs the boot chain and the out-of-tree modules.
    #[serde(default)]
    pub secure_boot: Option<SecureBoot>,
    /// How long bring-up may take before nasinit acts: per-service start timeouts, the
    /// boot-to-ready deadline, and how many missed deadlines in a row before the box stays up.
    #[serde(default)]
    pub liveness: Liveness,
    /// Fault injection for tests; development images only.
    #[serde(default)]
    pub debug: DebugFaults,
}

impl Recipe {
    /// The tenant whose subtree holds `dataset` (its root or a dataset below it).
    pub fn tenant_of(&self, dataset: &str) -> Option<&Tenant> {
        self.tenants.iter().find(|t| within(dataset, &t.dataset))
    }

    /// Every dataset the recipe makes: `[[datasets]]` and the tenants' roots.
    pub fn dataset_names(&self) -> impl Iterator<Item = &str> {
        self.datasets.iter().map(|d| d.name.as_str()).chain(self.tenants.iter().map(|t| t.dataset.as_str()))
    }
}

/// `dataset` is `root` or below it (`tank/a/b` is within `tank/a`, `tank/ab` is not).
pub fn within(dataset: &str, root: &str) -> bool {
    dataset == root || dataset.strip_prefix(root).is_some_and(|rest| rest.starts_with('/'))
}

/// Deadlines that turn a hang into a counted failed boot (what makes rollback work).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Liveness {
    /// How long a service may take to become ready before it is stopped and counted as failed,
    /// in seconds (its restart policy then applies).
    #[serde(default = "default_start_timeout")]
    #[schemars(range(min = 5, max = 86400))]
    pub start_timeout_seconds: u32,
    /// Per-service start timeouts, in seconds, by service name (e.g. `storage = 1800` for a box
    /// whose pools take long to import).
    #[serde(default)]
    pub start_timeouts: std::collections::BTreeMap<String, u32>,
    /// How long after nasinit starts the appliance must be ready, in seconds; a boot that misses
    /// it is reported and rebooted.
    #[serde(default = "default_ready_deadline")]
    #[schemars(range(min = 30, max = 86400))]
    pub ready_deadline_seconds: u32,
    /// After this many boots in a row missed their deadline, the box stays up (not ready) and
    /// says why, instead of rebooting again.
    #[serde(default = "default_guard")]
    #[schemars(range(min = 1, max = 20))]
    pub failed_boots_before_staying_up: u32,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            start_timeout_seconds: default_start_timeout(),
            start_timeouts: Default::default(),
            ready_deadline_seconds: default_ready_deadline(),
            failed_boots_before_staying_up: default_guard(),
        }
    }
}

fn default_start_timeout() -> u32 {
    600
}
fn default_ready_deadline() -> u32 {
    1800
}
fn default_guard() -> u32 {
    3
}

/// Faults a development image can be built with, to test what the appliance does about them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DebugFaults {
    /// Services whose program is replaced by one that never finishes (never becomes ready).
    #[serde(default)]
    pub hang_services: Vec<String>,
}

/// Identity of the image.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Image {
    /// Image name: lowercase letters, digits and dashes.
    pub name: String,
    /// Image version, `MAJOR.MINOR.PATCH` (used to name boot entries and bundles).
    pub version: String,
    /// The board this image runs on, by name (see `board/boards/`).
    pub board: String,
    /// Hostname of the appliance; defaults to the image name.
    #[serde(default)]
    pub hostname: Option<String>,
    /// A development image: allows console autologin. Never ship one.
    #[serde(default)]
    pub development: bool,
    /// The most the root filesystem may weigh, in MiB; the build fails above it.
    #[serde(default)]
    pub size_budget_mib: Option<u32>,
}

/// Extra Debian packages.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Packages {
    /// Debian trixie package names to add to the image.
    #[serde(default)]
    pub extra: Vec<String>,
}

/// Extra kernel modules.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KernelExtras {
    /// Modules to load at boot (and keep in the image), e.g. `["nfsv4", "rpcrdma"]` for an
    /// NFS-over-RDMA client.
    #[serde(default)]
    pub modules: Vec<String>,
}

/// Console access.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Console {
    /// How root logs in on the serial console.
    pub root_login: RootLogin,
    /// crypt(3) hash of root's password (`$y$…` yescrypt or `$6$…` sha512-crypt), for `password` login.
    #[serde(default)]
    pub root_password_hash: Option<String>,
}

/// How root logs in on the serial console.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RootLogin {
    /// No console login at all.
    Locked,
    /// Login with the password whose hash is `root_password_hash`.
    Password,
    /// Root is logged in without a password (development images only).
    Autologin,
}

/// Network links.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Network {
    /// One entry per board port the appliance uses.
    #[serde(default)]
    pub links: Vec<Link>,
    /// Ports the box answers on beyond what its plan serves (NFS, RoCE, metrics are opened by
    /// the plan itself); everything else is dropped.
    #[serde(default)]
    pub allow: Vec<Allow>,
}

/// One more port the box answers on, on one link.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Allow {
    /// The link (or VLAN interface, `data0.100`) it answers on.
    pub link: String,
    pub proto: Proto,
    #[schemars(range(min = 1, max = 65535))]
    pub port: u32,
    /// Only from these networks (CIDR); empty: from anywhere.
    #[serde(default)]
    pub from: Vec<String>,
    /// What it is for (shown by `nasctl firewall`).
    pub why: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
}

/// One network link: a board port, named, with its addresses.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// The interface name on the appliance (at most 15 characters).
    pub name: String,
    /// The board port this link uses (a port name from the board file).
    pub port: String,
    /// MTU in bytes, 576–9216. RoCE wants jumbo frames (9000).
    #[serde(default = "default_mtu")]
    #[schemars(range(min = 576, max = 9216))]
    pub mtu: u32,
    /// Addresses in CIDR form, e.g. `10.40.0.10/24`.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// VLAN sub-interfaces on this link.
    #[serde(default)]
    pub vlans: Vec<Vlan>,
}

fn default_mtu() -> u32 {
    1500
}

/// An 802.1Q VLAN on a link.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Vlan {
    /// VLAN id, 1–4094.
    #[schemars(range(min = 1, max = 4094))]
    pub id: u32,
    /// Addresses in CIDR form.
    #[serde(default)]
    pub addresses: Vec<String>,
}

/// The RoCE v2 fabric.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Fabric {
    /// Links that carry RoCE v2 (names from `[[network.links]]`).
    pub links: Vec<String>,
    /// The 802.1p priority made lossless with PFC, 0–7 (3 is the RoCE convention).
    #[schemars(range(min = 0, max = 7))]
    pub lossless_priority: u32,
    /// Fail bring-up when a link cannot apply PFC (a NIC without DCB).
    #[serde(default)]
    pub pfc_required: bool,
    /// ETS bandwidth share in percent for traffic classes 0–7 (priority N maps to class N); sums to 100.
    #[serde(default)]
    #[schemars(length(min = 8, max = 8), inner(range(min = 0, max = 100)))]
    pub ets_bandwidth: Option<Vec<u32>>,
    /// DSCP → priority entries of the DCB APP table (RoCE data is usually DSCP 26 → 3, CNP 48 → 6).
    #[serde(default)]
    pub dscp: Vec<DscpMapping>,
}

/// One DSCP → priority mapping.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DscpMapping {
    /// DSCP code point, 0–63.
    #[schemars(range(min = 0, max = 63))]
    pub dscp: u32,
    /// 802.1p priority, 0–7.
    #[schemars(range(min = 0, max = 7))]
    pub priority: u32,
}

/// ZFS module settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Zfs {
    /// ARC size cap, e.g. `"96G"` (K, M, G, T suffixes, powers of 1024).
    #[serde(default)]
    pub arc_max: Option<String>,
    /// Other ZFS module parameters (`/sys/module/zfs/parameters/NAME`), as strings.
    #[serde(default)]
    pub tunables: BTreeMap<String, String>,
}

/// A ZFS pool.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Pool {
    /// Pool name.
    pub name: String,
    /// What bring-up may do when the pool is not found.
    #[serde(default)]
    pub create: CreatePolicy,
    /// log2 of the sector size the pool is built for, 9–16 (12 = 4 KiB, right for NVMe).
    #[serde(default = "default_ashift")]
    #[schemars(range(min = 9, max = 16))]
    pub ashift: u32,
    /// Data vdevs.
    pub vdevs: Vec<Vdev>,
    /// Hot spares, by bay name.
    #[serde(default)]
    pub spares: Vec<String>,
    /// Pool properties (`zpool create -o`), e.g. `autotrim = "on"`.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Properties of the pool's root dataset, inherited by its datasets (`zpool create -O`).
    #[serde(default)]
    pub filesystem: BTreeMap<String, String>,
}

fn default_ashift() -> u32 {
    12
}

/// What bring-up may do when a pool is not found on its disks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CreatePolicy {
    /// Create the pool, but only if every member disk is blank.
    #[default]
    BlankDisks,
    /// Never create; wait for the pool to be imported.
    ImportOnly,
}

/// One vdev.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Vdev {
    /// Vdev type.
    #[serde(rename = "type")]
    pub kind: VdevKind,
    /// Member bays, by name.
    pub bays: Vec<String>,
}

/// Vdev types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum VdevKind {
    /// A single disk, no redundancy.
    Disk,
    /// N-way mirror (2 or more disks).
    Mirror,
    /// Single parity (2 or more disks; 3–9 recommended).
    Raidz1,
    /// Double parity (3 or more disks; 4–9 recommended).
    Raidz2,
    /// Triple parity (4 or more disks; 5–9 recommended).
    Raidz3,
}

impl VdevKind {
    /// The width range ZFS accepts for this vdev type.
    pub fn width_range(self) -> (usize, usize) {
        match self {
            VdevKind::Disk => (1, 1),
            VdevKind::Mirror => (2, 255),
            VdevKind::Raidz1 => (2, 255),
            VdevKind::Raidz2 => (3, 255),
            VdevKind::Raidz3 => (4, 255),
        }
    }

    /// The name `zpool create` uses, `None` for a plain disk.
    pub fn zpool_word(self) -> Option<&'static str> {
        match self {
            VdevKind::Disk => None,
            VdevKind::Mirror => Some("mirror"),
            VdevKind::Raidz1 => Some("raidz1"),
            VdevKind::Raidz2 => Some("raidz2"),
            VdevKind::Raidz3 => Some("raidz3"),
        }
    }
}

/// A ZFS dataset.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Dataset {
    /// Full dataset name, `POOL/NAME[/…]`.
    pub name: String,
    /// Quota, e.g. `"40T"`.
    #[serde(default)]
    pub quota: Option<String>,
    /// Reservation, e.g. `"1T"`.
    #[serde(default)]
    pub reservation: Option<String>,
    /// Other ZFS properties, as strings (`recordsize = "1M"`).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

/// Kerberos for NFS: the box accepts tickets for its `nfs/` service principal (its keytab is
/// joined once with `nasctl kerberos join FILE` and kept on the state partition) and maps each
/// principal of the realm to the account of the same name.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Kerberos {
    /// The realm, in capitals (`EXAMPLE.COM`); its lowercase is the NFSv4 id-mapping domain.
    pub realm: String,
    /// The accounts principals of the realm map to (`alice@REALM` → `alice`): files a user
    /// writes are owned by its uid on the box.
    #[serde(default)]
    pub users: Vec<KerberosUser>,
}

/// An account on the box for a principal of the realm.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KerberosUser {
    /// The principal's name without the realm, and the account's (`alice`).
    pub name: String,
    #[schemars(range(min = 1000, max = 60000))]
    pub uid: u32,
    #[schemars(range(min = 1000, max = 60000))]
    pub gid: u32,
}

/// One team on a shared box. Its dataset is created with its quota and reservation; the
/// exports of datasets inside it are its exports, offered only to its networks (a client of
/// another tenant neither mounts them nor sees them in the NFSv4 pseudo-filesystem), with its
/// squash policy.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tenant {
    /// The tenant's name: lowercase letters, digits and dashes (`vision`).
    pub name: String,
    /// The root of its dataset subtree, `POOL/NAME[/…]` (`tank/vision`); nasos creates it. The
    /// datasets below it may be declared in `[[datasets]]`.
    pub dataset: String,
    /// The most its subtree may hold, snapshots included (`"20T"`): a client that writes past
    /// it gets EDQUOT ("Disk quota exceeded") while other tenants write on.
    #[serde(default)]
    pub quota: Option<String>,
    /// Space kept for it whatever the other tenants write (`"1T"`).
    #[serde(default)]
    pub reservation: Option<String>,
    /// Other ZFS properties of its root dataset, as strings.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Its client networks (CIDR). No two tenants' networks overlap.
    pub networks: Vec<String>,
    /// Whose identity a client's requests carry on its files.
    #[serde(default)]
    pub squash: Squash,
    /// With `squash = "all"`: the uid every client user is mapped to.
    #[serde(default)]
    pub anon_uid: Option<u32>,
    /// With `squash = "all"`: the gid every client user is mapped to.
    #[serde(default)]
    pub anon_gid: Option<u32>,
    /// Its own VLANs on the box's links (usually the fabric links), each with the box's
    /// addresses there. NFS on a tenant's VLAN answers only that tenant's networks.
    #[serde(default)]
    pub vlans: Vec<TenantVlan>,
}

/// A tenant's squash policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Squash {
    /// Client root is mapped to nobody; other users keep their uid and gid.
    #[default]
    Root,
    /// Every client user, root too, is mapped to `anon_uid`/`anon_gid`: the tenant's files all
    /// belong to the tenant's one account, whatever the clients' users are.
    All,
}

/// A tenant's VLAN on one of the box's links.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantVlan {
    /// The link it is on (a name from `[[network.links]]`).
    pub link: String,
    /// VLAN id, 1–4094.
    #[schemars(range(min = 1, max = 4094))]
    pub id: u32,
    /// The box's addresses on it, in CIDR form.
    pub addresses: Vec<String>,
}

/// Automatic snapshots of one dataset, with sanoid's semantics: a snapshot of each kind is taken
/// at the start of each of its periods (UTC: every `frequent_minutes` on the hour, the hour,
/// midnight, Monday, the first of the month), and the newest `N` of each kind are kept. Without
/// counts, sanoid's production template: 36 hourly, 30 daily, 3 monthly.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotPolicy {
    /// The dataset (`tank/train`, or a pool's own root dataset `tank`).
    pub dataset: String,
    /// Snapshot the dataset and every dataset below it atomically, under one name.
    #[serde(default)]
    pub recursive: bool,
    /// The period of frequent snapshots in minutes; it divides the hour (1, 2, 3, 4, 5, 6, 10,
    /// 12, 15, 20, 30 or 60).
    #[serde(default = "default_frequent_minutes")]
    pub frequent_minutes: u32,
    /// How many frequent snapshots to keep.
    #[serde(default)]
    pub frequently: u32,
    /// How many hourly snapshots to keep.
    #[serde(default = "default_hourly")]
    pub hourly: u32,
    /// How many daily snapshots to keep.
    #[serde(default = "default_daily")]
    pub daily: u32,
    /// How many weekly snapshots to keep.
    #[serde(default)]
    pub weekly: u32,
    /// How many monthly snapshots to keep.
    #[serde(default = "default_monthly")]
    pub monthly: u32,
    /// Hold each snapshot this policy takes for this long after it was taken (`"14d"`, `"2w"`;
    /// units s, m, h, d, w): until then neither the policy nor nasctl destroys or releases it,
    /// and ZFS itself refuses to destroy it. Protects against mistakes and compromised clients,
    /// not against root on the appliance.
    #[serde(default)]
    pub hold: Option<String>,
}

/// Another nasos box, reached over SSH (one key per box: the peer's host key when this box sends
/// to it, and the only key that may log in when it sends here, to a forced command that can do
/// nothing but receive into the datasets listed in `receive`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Peer {
    /// A name for the peer (`dr`), used by `[[replicate]] to`.
    pub name: String,
    /// Its address, in the subnet of one of this box's links.
    pub address: String,
    /// Its replication key: an OpenSSH public key file next to this recipe, as `nasctl replication
    /// key` prints it on that box.
    pub key: String,
    /// Datasets the peer may replicate into on this box (their names here); each is kept
    /// read-only until `nasctl replication promote` makes it writable for a failover.
    #[serde(default)]
    pub receive: Vec<String>,
}

/// One dataset sent to a peer: incremental `zfs send`, resumable, raw for encrypted datasets.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Replicate {
    /// The dataset on this box.
    pub dataset: String,
    /// The peer (`[[peers]] name`).
    pub to: String,
    /// Its name on the peer; the same name when not given.
    #[serde(default)]
    pub target: Option<String>,
    /// Send every this many minutes (1–1440): a snapshot is taken for it and sent.
    #[serde(default = "default_every_minutes")]
    pub every_minutes: u32,
    /// The most bytes per second a send may use (`"100M"`); unlimited when not given.
    #[serde(default)]
    pub bandwidth: Option<String>,
    /// Alert when the newest snapshot both boxes hold is older than this many minutes; three
    /// intervals and five minutes when not given.
    #[serde(default)]
    pub lag_alert_minutes: Option<u32>,
}

fn default_every_minutes() -> u32 {
    15
}

/// This box's replication key.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Replication {
    /// Development images only: the secret key (an OpenSSH private key file next to this recipe)
    /// every box of this image uses, so test recipes can name each other's keys. Without it, each
    /// box makes its own on first boot and keeps it on the state partition.
    #[serde(default)]
    pub identity: Option<String>,
}

fn default_frequent_minutes() -> u32 {
    15
}

fn default_hourly() -> u32 {
    36
}

fn default_daily() -> u32 {
    30
}

fn default_monthly() -> u32 {
    3
}

/// The kernel NFS server.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Nfs {
    /// Protocol versions served.
    #[serde(default = "default_versions")]
    pub versions: Vec<NfsVersion>,
    /// nfsd threads, 1–1024.
    #[serde(default = "default_threads")]
    #[schemars(range(min = 1, max = 1024))]
    pub threads: u32,
    /// Port of the RDMA listener (20049 by convention).
    #[serde(default = "default_rdma_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub rdma_port: u32,
    /// NFSv4 grace period in seconds after a restart (10–3600).
    #[serde(default = "default_grace")]
    #[schemars(range(min = 10, max = 3600))]
    pub grace_seconds: u32,
    /// NFSv4 lease time in seconds (10–3600).
    #[serde(default = "default_grace")]
    #[schemars(range(min = 10, max = 3600))]
    pub lease_seconds: u32,
    /// Exported datasets.
    #[serde(default)]
    pub exports: Vec<Export>,
}

fn default_versions() -> Vec<NfsVersion> {
    vec![NfsVersion::V4_2]
}
fn default_threads() -> u32 {
    16
}
fn default_rdma_port() -> u32 {
    20049
}
fn default_grace() -> u32 {
    15
}

/// NFS protocol versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub enum NfsVersion {
    /// NFSv3 (needs rpcbind and rpc.statd).
    #[serde(rename = "3")]
    V3,
    /// NFSv4.0.
    #[serde(rename = "4.0")]
    V4_0,
    /// NFSv4.1.
    #[serde(rename = "4.1")]
    V4_1,
    /// NFSv4.2.
    #[serde(rename = "4.2")]
    V4_2,
}

impl NfsVersion {
    /// The spelling `rpc.nfsd` and `nfs.conf` use.
    pub fn as_str(self) -> &'static str {
        match self {
            NfsVersion::V3 => "3",
            NfsVersion::V4_0 => "4.0",
            NfsVersion::V4_1 => "4.1",
            NfsVersion::V4_2 => "4.2",
        }
    }
}

/// One exported dataset.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Export {
    /// The dataset to export (a name from `[[datasets]]`).
    pub dataset: String,
    /// Served over TCP (port 2049). Always: nfsd's listeners serve every export, so `false` is
    /// refused.
    #[serde(default = "default_true")]
    pub tcp: bool,
    /// Served over RDMA: nfsd then listens on the RDMA port (needs a fabric link with RDMA). The
    /// listener serves every export, so one export asking for RDMA makes all reachable over it.
    #[serde(default)]
    pub rdma: bool,
    /// How clients prove who they are: `sys` (the client's word, trusted by address), `krb5`
    /// (a Kerberos ticket), `krb5i` (and every message integrity-checked) or `krb5p` (and
    /// encrypted). Several are offered in the order given.
    #[serde(default = "default_security")]
    pub security: Vec<Security>,
    /// Client networks allowed to mount it. An export inside a tenant's dataset may leave this
    /// out: it is then offered read-write to each of the tenant's networks.
    #[serde(default)]
    pub clients: Vec<ExportClient>,
}

fn default_security() -> Vec<Security> {
    vec![Security::Sys]
}

/// An export's security flavour (exports(5) `sec=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Security {
    Sys,
    Krb5,
    Krb5i,
    Krb5p,
}

impl Security {
    pub fn as_str(self) -> &'static str {
        match self {
            Security::Sys => "sys",
            Security::Krb5 => "krb5",
            Security::Krb5i => "krb5i",
            Security::Krb5p => "krb5p",
        }
    }

    pub fn kerberos(self) -> bool {
        self != Security::Sys
    }
}

/// A client network of an export.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExportClient {
    /// Network in CIDR form, e.g. `10.40.0.0/24`.
    pub network: String,
    /// Read-write or read-only.
    #[serde(default)]
    pub access: Access,
    /// Map client root to nobody. On unless explicitly turned off.
    #[serde(default = "default_true")]
    pub root_squash: bool,
    /// Commit writes to stable storage before replying.
    #[serde(default = "default_true")]
    pub sync: bool,
    /// Required beside a world-open read-write export (`0.0.0.0/0`, `::/0`) or root squash
    /// turned off: the recipe says it means it.
    #[serde(default)]
    pub i_understand: bool,
}

/// Export access mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Read-only.
    #[default]
    Ro,
    /// Read-write.
    Rw,
}

/// Health checks and the watchdog.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// Hardware watchdog timeout in seconds (10–600); the box resets if health stops petting it.
    #[serde(default = "default_watchdog")]
    #[schemars(range(min = 10, max = 600))]
    pub watchdog_timeout_seconds: u32,
    /// Warn when an NVMe drive is hotter than this, in °C.
    #[serde(default = "default_temp")]
    #[schemars(range(min = 30, max = 100))]
    pub nvme_temperature_warn_celsius: u32,
    /// Warn when a pool is fuller than this, in percent.
    #[serde(default = "default_capacity")]
    #[schemars(range(min = 50, max = 99))]
    pub pool_capacity_warn_percent: u32,
    /// Warn when a tenant has used this much of its quota, in percent (its writes fail with
    /// "Disk quota exceeded" at 100%).
    #[serde(default = "default_tenant_quota")]
    #[schemars(range(min = 50, max = 99))]
    pub tenant_quota_warn_percent: u32,
    /// How often health checks run, in seconds (ZFS events and pulled drives are seen at once).
    #[serde(default = "default_interval")]
    #[schemars(range(min = 1, max = 3600))]
    pub check_interval_seconds: u32,
    /// Warn when an NVMe drive's available spare falls under this, in percent.
    #[serde(default = "default_spare")]
    #[schemars(range(min = 1, max = 100))]
    pub nvme_spare_warn_percent: u32,
    /// Warn when an NVMe drive has used this much of its rated endurance, in percent.
    #[serde(default = "default_wear")]
    #[schemars(range(min = 1, max = 255))]
    pub nvme_wear_warn_percent: u32,
    /// Warn when the CPU (k10temp Tctl on EPYC) is hotter than this, in °C.
    #[serde(default = "default_cpu_temp")]
    #[schemars(range(min = 40, max = 110))]
    pub cpu_temperature_warn_celsius: u32,
    /// How long a fatal condition (both NFS listeners gone with the nfs service failed, a pool
    /// suspended) may last before nasinit stops feeding the watchdog, in seconds. A degraded
    /// pool or a hot drive is never fatal.
    #[serde(default = "default_fatal_grace")]
    #[schemars(range(min = 10, max = 3600))]
    pub fatal_grace_seconds: u32,
    /// Send every alert to these syslog receivers (RFC 5424), e.g. `"udp://10.0.0.5:514"` or
    /// `"tcp://10.0.0.5:601"`; addresses are IP literals (the box resolves no names).
    #[serde(default)]
    pub syslog: Vec<String>,
    /// Serve Prometheus metrics here: one of the box's own addresses and a port, e.g.
    /// `{ address = "10.77.0.1", port = 9100 }`. Nothing listens when it is not set.
    #[serde(default)]
    pub metrics: Option<MetricsEndpoint>,
}

/// Where the metrics endpoint listens.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricsEndpoint {
    /// One of the addresses of `[[network.links]]` (without its prefix length).
    pub address: String,
    #[serde(default = "default_metrics_port")]
    pub port: u16,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            watchdog_timeout_seconds: default_watchdog(),
            nvme_temperature_warn_celsius: default_temp(),
            pool_capacity_warn_percent: default_capacity(),
            tenant_quota_warn_percent: default_tenant_quota(),
            check_interval_seconds: default_interval(),
            nvme_spare_warn_percent: default_spare(),
            nvme_wear_warn_percent: default_wear(),
            cpu_temperature_warn_celsius: default_cpu_temp(),
            fatal_grace_seconds: default_fatal_grace(),
            syslog: Vec::new(),
            metrics: None,
        }
    }
}

fn default_tenant_quota() -> u32 {
    90
}
fn default_spare() -> u32 {
    10
}
fn default_wear() -> u32 {
    90
}
fn default_cpu_temp() -> u32 {
    90
}
fn default_fatal_grace() -> u32 {
    120
}
fn default_metrics_port() -> u16 {
    9100
}

fn default_watchdog() -> u32 {
    60
}
fn default_temp() -> u32 {
    70
}
fn default_capacity() -> u32 {
    80
}
fn default_interval() -> u32 {
    10
}

/// UEFI Secure Boot with the builder's own keys (made by `nasos keygen --secure-boot DIR`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecureBoot {
    /// The db certificate (PEM, relative to this recipe) the box's firmware trusts. `nasos build`
    /// signs systemd-boot, the UKI and the ZFS modules with its key: `--secure-boot-key FILE`, or
    /// the `.key` file beside the certificate. `nasos qemu` enrolls it with the PK and KEK
    /// certificates beside it and boots with Secure Boot on.
    pub db: String,
}

/// Field upgrades: who may sign them, what they may replace, how many tries a new slot gets.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Upgrade {
    /// Boots a new slot gets before systemd-boot falls back to the previous one (1–10).
    #[serde(default = "default_tries")]
    #[schemars(range(min = 1, max = 10))]
    pub boot_tries: u32,
    /// The minisign public keys (files relative to this recipe, made by `nasos keygen`) whose
    /// signed bundles this box installs. No keys: the box takes no upgrades.
    #[serde(default)]
    pub trusted_keys: Vec<String>,
    /// Bundles built from this recipe install only over this version or a later one
    /// (`MAJOR.MINOR.PATCH`); an older box must take an intermediate version first.
    #[serde(default = "default_min_version")]
    pub min_version: String,
    /// A new version is blessed (kept for good) once the box has been ready and healthy — no
    /// fatal condition, the health agent reporting — for this long in a row; until then a reset
    /// costs it a try. 0: at the first healthy look after ready.
    #[serde(default = "default_bless_after")]
    #[schemars(range(max = 86400))]
    pub bless_after_seconds: u32,
}

impl Default for Upgrade {
    fn default() -> Self {
        Upgrade {
            boot_tries: default_tries(),
            trusted_keys: Vec::new(),
            min_version: default_min_version(),
            bless_after_seconds: default_bless_after(),
        }
    }
}

fn default_bless_after() -> u32 {
    300
}

fn default_min_version() -> String {
    "0.0.0".into()
}

fn default_true() -> bool {
    true
}

fn default_tries() -> u32 {
    3
}
