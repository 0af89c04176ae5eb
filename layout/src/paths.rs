//! Paths the image provides and the appliance relies on.

/// The resolved plan, baked into the image.
pub const PLAN: &str = "/usr/lib/nasos/plan.json";
/// nasinit, PID 1 (the initramfs execs it after switching to the verified root).
pub const NASINIT: &str = "/usr/sbin/nasinit";
/// nasctl, the operator's command.
pub const NASCTL: &str = "/usr/sbin/nasctl";
/// Where the agents (the services' programs) live.
pub const AGENT_DIR: &str = "/usr/lib/nasos";
/// os-release of the image (also carried in the UKI's .osrel section).
pub const OS_RELEASE: &str = "/usr/lib/nasos/os-release";
/// Datasets are mounted below this tmpfs, since the root filesystem is read-only.
pub const EXPORT_ROOT: &str = "/export";
/// Stable names for bays (`BAY01`, `BAY01-part1`), made by udev from the plan's bay map.
pub const BAY_DIR: &str = "/dev/disk/by-bay";
/// The udev rules that make them (written at build time from the plan).
pub const BAY_RULES: &str = "/etc/udev/rules.d/61-nasos-bays.rules";
/// Until this file exists udev gives NVMe drives only what the pool import needs (the by-id,
/// by-path and by-bay names); then its full rules, blkid's probe of the disk and each partition
/// included. The storage agent creates it once its imports are done. See [`BOOT_UDEV_RULES`].
pub const IMPORT_DONE: &str = "/run/nasos/import-done";
/// nasinit creates this when the boot is over: every service on the way to serving is ready (or
/// a minute has passed). What waits for it is work serving does not need but that costs CPU the
/// boot's critical path wants, such as udev's probe of the pools' members.
pub const BOOT_OVER: &str = "/run/nasos/boot-over";
/// The rules that defer blkid's probe of the drives until the import is done (written at build
/// time; before 60-persistent-storage.rules, whose flag they set).
pub const BOOT_UDEV_RULES: &str = "/etc/udev/rules.d/59-nasos-boot.rules";
/// Packaged udev rules the image masks (a file of the same name in /etc/udev/rules.d), with why.
/// Each ran a program for every drive, partition or block device for nothing the appliance uses:
/// ZFS's, 36 block events took 11.4 s to settle under TCG with them, 3.5 s without; nfs-common's,
/// 0.12 s of CPU per block device at every boot. And one that undid what nasos does: udev's
/// interface naming.
pub const MASKED_UDEV_RULES: [(&str, &str); 4] = [
    (
        "/etc/udev/rules.d/69-vdev.rules",
        "Masked by nasos: vdev_id names disks from /etc/zfs/vdev_id.conf, which the appliance does not \
         have; its bays are named by 61-nasos-bays.rules. The script ran for every disk and partition.",
    ),
    (
        "/etc/udev/rules.d/90-zfs.rules",
        "Masked by nasos: nasinit's modules-storage service loads zfs. This rule ran modprobe zfs for \
         every pool member, and while zfs was loading each run waited for the load, holding up udev.",
    ),
    (
        "/etc/udev/rules.d/99-nfs.rules",
        "Masked by nasos: nfsrahead sets the readahead of NFS client mounts, and the appliance mounts \
         no NFS (it serves it). The rule ran the program for every block device's bdi.",
    ),
    (
        "/etc/udev/rules.d/80-net-setup-link.rules",
        "Masked by nasos: the fabric agent names the plan's links (by MAC or PCI address) and udev must \
         not rename them back. Handling a NIC's add event after fabric had named it, udev renamed \
         data0 to enp0s14 while it was up, and the link lost its soft-RoCE device.",
    ),
];
/// The plan's nftables ruleset (written at build time, loaded by the `firewall` service).
pub const FIREWALL_RULES: &str = "/usr/lib/nasos/firewall.nft";
/// Module options for the watchdog core: it must not stop the timer on a reboot, so the one nasinit
/// leaves running across a kexec keeps watching the next kernel (nasinit disarms it itself before
/// every other reboot).
pub const WATCHDOG_MODPROBE: &str = "/etc/modprobe.d/nasos-watchdog.conf";
pub const WATCHDOG_MODPROBE_OPTIONS: &str = "options watchdog stop_on_reboot=0\n";
/// nftables' command.
pub const NFT: &str = "/usr/sbin/nft";
/// The health agent's latest round (checks, recent alerts, what it read), for nasctl; on tmpfs.
pub const HEALTH_REPORT: &str = "/run/nasos/health.json";
/// The health agent's verdict for nasinit: the fatal conditions it sees and since when (JSON,
/// `nasos_api::HealthVerdict`); on tmpfs, rewritten every round.
pub const HEALTH_VERDICT: &str = "/run/nasos/health-verdict.json";
/// nasinit's control socket (D-Bus, peer to peer, root only).
pub const CONTROL_SOCKET: &str = "/run/nasinit/control.sock";
/// Where nasinit keeps each service's log file.
pub const SERVICE_LOG_DIR: &str = "/var/log/nasinit";

/// The initramfs's own files.
pub mod initramfs {
    /// The initramfs's init program.
    pub const INIT: &str = "/init";
    /// The file that marks an initramfs (systemd's convention).
    pub const MARKER: &str = "/etc/initrd-release";
    /// Modules to load, one .ko path per line, in dependency order (written at build time).
    pub const MODULE_LIST: &str = "/etc/nasos/modules";
    /// Where the root is mounted before the switch.
    pub const NEW_ROOT: &str = "/sysroot";
    /// Present only in a development image's initramfs: it then takes `nasos.init=`.
    pub const DEVELOPMENT: &str = "/etc/nasos/development";
}

/// `dir` joined with an absolute image path, for code that works on a tree or a test fixture
/// instead of `/`.
pub fn under(dir: &std::path::Path, path: &str) -> std::path::PathBuf {
    dir.join(path.trim_start_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_keeps_the_path_below_the_tree() {
        let p = under(std::path::Path::new("/tmp/tree"), PLAN);
        assert_eq!(p, std::path::Path::new("/tmp/tree/usr/lib/nasos/plan.json"));
    }
}
