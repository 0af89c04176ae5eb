//! Early boot, as PID 1 only: the API filesystems, the hostname, and stable bay names.

use std::fs;
use std::path::{Path, PathBuf};

use nasos_board::plan::BayPlan;
use nasos_layout::paths::{BAY_DIR, EXPORT_ROOT};
use nix::errno::Errno;
use nix::mount::{MsFlags, mount};

use crate::console::Console;

struct Mount {
    source: &'static str,
    target: &'static str,
    fstype: &'static str,
    flags: MsFlags,
    data: &'static str,
}

/// Mounts what every Linux userspace expects. A failure is reported and boot goes on: a PID 1
/// that stops here leaves an operator nothing to log in to.
pub fn mount_api_filesystems(console: &Console) {
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    let table = [
        Mount { source: "proc", target: "/proc", fstype: "proc", flags: nosuid_nodev | MsFlags::MS_NOEXEC, data: "" },
        Mount { source: "sysfs", target: "/sys", fstype: "sysfs", flags: nosuid_nodev | MsFlags::MS_NOEXEC, data: "" },
        // Where the kernel says whether it is locked down (Secure Boot), as systemd mounts it.
        Mount {
            source: "securityfs",
            target: "/sys/kernel/security",
            fstype: "securityfs",
            flags: nosuid_nodev | MsFlags::MS_NOEXEC,
            data: "",
        },
        Mount { source: "devtmpfs", target: "/dev", fstype: "devtmpfs", flags: MsFlags::MS_NOSUID, data: "mode=0755" },
        Mount {
            source: "devpts",
            target: "/dev/pts",
            fstype: "devpts",
            flags: MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            data: "gid=5,mode=0620,ptmxmode=0666",
        },
        Mount { source: "tmpfs", target: "/dev/shm", fstype: "tmpfs", flags: nosuid_nodev, data: "mode=1777" },
        Mount { source: "tmpfs", target: "/run", fstype: "tmpfs", flags: nosuid_nodev, data: "mode=0755,size=10%" },
        Mount { source: "tmpfs", target: "/tmp", fstype: "tmpfs", flags: nosuid_nodev, data: "mode=1777,size=10%" },
        Mount {
            source: "cgroup2",
            target: "/sys/fs/cgroup",
            fstype: "cgroup2",
            flags: nosuid_nodev | MsFlags::MS_NOEXEC,
            data: "nsdelegate",
        },
        // Datasets mount below /export; the root filesystem is read-only, so it needs a tmpfs.
        Mount { source: "tmpfs", target: EXPORT_ROOT, fstype: "tmpfs", flags: nosuid_nodev, data: "mode=0755,size=1m" },
    ];
    for m in &table {
        let _ = fs::create_dir_all(m.target);
        match mount(Some(m.source), m.target, Some(m.fstype), m.flags, Some(m.data)) {
            // Already mounted (by the kernel, or by the initramfs and moved over).
            Ok(()) | Err(Errno::EBUSY) => {}
            Err(e) => console.say(&format!("cannot mount {} on {}: {e}", m.fstype, m.target)),
        }
    }
    for (link, target) in [
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        let _ = std::os::unix::fs::symlink(target, link);
    }
}

/// Where the upper layers of /etc and /var live (on the /run tmpfs).
pub const VOLATILE_OVERLAYS: &str = "/run/nasos/overlay";

/// The root is read-only; /etc and /var get a tmpfs overlay so daemons can write their state
/// (nfs-utils writes /var/lib/nfs, exportfs writes /etc/exports). Persistent state lives in the
/// pools and on the data partition, not here.
pub fn writable_overlays(console: &Console) {
    for dir in ["etc", "var"] {
        let upper = format!("{VOLATILE_OVERLAYS}/{dir}/upper");
        let work = format!("{VOLATILE_OVERLAYS}/{dir}/work");
        if fs::create_dir_all(&upper).and_then(|_| fs::create_dir_all(&work)).is_err() {
            console.say(&format!("cannot prepare the /{dir} overlay"));
            continue;
        }
        let opts = format!("lowerdir=/{dir},upperdir={upper},workdir={work}");
        if let Err(e) =
            mount(Some("overlay"), format!("/{dir}").as_str(), Some("overlay"), MsFlags::empty(), Some(opts.as_str()))
        {
            console.say(&format!("cannot make /{dir} writable (overlay): {e}"));
        }
    }
}

/// Turns off the kernel's autogroup scheduling. With it (Debian's default), every session shares
/// the CPU equally with every other, and nasinit starts each service in its own session: a
/// service's niceness then counted only against itself (a boot trace showed nice-19 work taking
/// a fifth of the CPU beside zfs's load). Without it, niceness is what the plan says.
pub fn scheduler_without_autogroups(console: &Console) {
    let knob = "/proc/sys/kernel/sched_autogroup_enabled";
    match std::fs::write(knob, "0") {
        Ok(()) => {}
        // A kernel built without autogroups shares the CPU by niceness already.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            console.say(&format!("cannot turn off autogroup scheduling ({knob}: {e}); service niceness is weaker"))
        }
    }
}

pub fn set_hostname(name: &str, console: &Console) {
    if let Err(e) = nix::unistd::sethostname(name) {
        console.say(&format!("cannot set hostname {name}: {e}"));
    }
}

/// The bays whose drive udev has named (`/dev/disk/by-bay/BAYnn`, made by the plan's rules, see
/// `nasos_board::plan::udev`), with every partition the kernel knows on it (`BAYnn-partN`): what
/// an import by bay needs. `dir` is normally [`BAY_DIR`], `sys_block` `/sys/class/block`.
pub fn present_bays(dir: &Path, sys_block: &Path, bays: &[BayPlan]) -> Vec<String> {
    bays.iter().filter(|b| bay_named(dir, sys_block, &b.name)).map(|b| b.name.clone()).collect()
}

fn bay_named(dir: &Path, sys_block: &Path, bay: &str) -> bool {
    // A link whose device is gone does not count (udev drops it on removal; leftovers).
    let Ok(dev) = fs::canonicalize(dir.join(bay)) else { return false };
    let Some(name) = dev.file_name().and_then(|n| n.to_str()) else { return false };
    let Ok(entries) = fs::read_dir(sys_block.join(name)) else { return true };
    entries.flatten().all(|e| {
        let part = e.file_name();
        let part = part.to_string_lossy();
        // Partitions are the subdirectories named DEVpN (nvme3n1p1), numbered by the kernel.
        match part.strip_prefix(name).and_then(|p| p.strip_prefix('p')).filter(|n| n.parse::<u32>().is_ok()) {
            Some(n) => dir.join(format!("{bay}-part{n}")).exists(),
            None => true,
        }
    })
}

/// Waits until every bay of the plan and its partitions are named, at most `wait`. Returns the
/// bays present. Empty bays are not an error: they just take the wait.
///
/// udev names the bays (the plan's rules), and keeps the names right across hot-plug. At boot
/// its queue is long (every module set's devices, side by side) and slow (a worker per event;
/// under TCG, 36 drive events took udev 3.5 to 11 s, and at boot one bay was still unnamed after
/// 15 s), so this names the present bays itself from sysfs, with the same match and the same
/// links ([`name_bays`]); udev makes the same links again when it gets to the drives' events.
pub fn wait_for_bays(bays: &[BayPlan], wait: std::time::Duration) -> Vec<String> {
    let t = std::time::Instant::now();
    let mut opened = std::collections::BTreeSet::new();
    loop {
        name_bays(Path::new(BAY_DIR), Path::new(SYS_CLASS_BLOCK), Path::new("/dev"), bays, &mut opened);
        let present = present_bays(Path::new(BAY_DIR), Path::new(SYS_CLASS_BLOCK), bays);
        if present.len() == bays.len() || t.elapsed() >= wait {
            return present;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Maps bays to NVMe namespaces (`nvme3n1`) by controller serial or PCI address, from sysfs
/// (`sys_block` is normally `/sys/class/block`): the match of the plan's udev rules. Kernel
/// numbering is never trusted: it does not follow bay order.
pub fn find_bays(sys_block: &Path, bays: &[BayPlan]) -> Vec<(String, String)> {
    let Ok(entries) = fs::read_dir(sys_block) else { return Vec::new() };
    let mut disks: Vec<(String, Option<String>, Vec<String>)> = Vec::new();
    for e in entries.flatten() {
        let dev = e.file_name().to_string_lossy().into_owned();
        if !is_namespace(&dev) {
            continue;
        }
        let device = e.path().join("device");
        let serial = read_trim(&device.join("serial"));
        let mut addresses: Vec<String> = read_trim(&device.join("address")).into_iter().collect();
        // With native multipath, `device` is the subsystem; its controllers carry the addresses.
        for ctrl in fs::read_dir(&device).into_iter().flatten().flatten() {
            let name = ctrl.file_name().to_string_lossy().into_owned();
            if name.strip_prefix("nvme").is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit())) {
                addresses.extend(read_trim(&ctrl.path().join("address")));
            }
        }
        disks.push((dev, serial, addresses));
    }
    disks.sort();
    let mut out = Vec::new();
    for bay in bays {
        let hit = disks.iter().find(|(_, serial, addrs)| {
            bay.matcher.serial.as_ref().is_some_and(|s| serial.as_ref() == Some(s))
                || bay.matcher.pci.as_ref().is_some_and(|p| addrs.contains(p))
        });
        if let Some((dev, _, _)) = hit {
            out.push((bay.name.clone(), dev.clone()));
        }
    }
    out
}

/// A whole namespace (`nvme0n1`): not a partition (`nvme0n1p1`), not a multipath path
/// (`nvme0c1n1`).
fn is_namespace(dev: &str) -> bool {
    let Some(rest) = dev.strip_prefix("nvme") else { return false };
    let Some((ctrl, ns)) = rest.split_once('n') else { return false };
    !ctrl.is_empty()
        && ctrl.chars().all(|c| c.is_ascii_digit())
        && !ns.is_empty()
        && ns.chars().all(|c| c.is_ascii_digit())
}

/// The partitions of a block device, as sysfs lists them: (number, device name).
pub fn partitions(sys_block: &Path, dev: &str) -> Vec<(u32, String)> {
    let mut out: Vec<(u32, String)> = fs::read_dir(sys_block.join(dev))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = read_trim(&e.path().join("partition"))?.parse().ok()?;
            Some((n, e.file_name().to_string_lossy().into_owned()))
        })
        .collect();
    out.sort();
    out
}

/// Makes `dir/BAYnn` and `dir/BAYnn-partN` for every bay whose drive sysfs shows, as the plan's
/// udev rules name them; a link already right is left alone, a wrong one replaced atomically.
/// Returns the bays named.
///
/// A new disk is in sysfs before the kernel has scanned its partitions, and an open waits for a
/// scan under way (the disk's open mutex). So a drive is named only when it was opened in an
/// earlier round too (`opened` keeps them, a round is ~100 ms): by the later open its scan has
/// begun, and that open returns once the scan is done; the partitions listed then are all.
pub fn name_bays(
    dir: &Path,
    sys_block: &Path,
    dev_dir: &Path,
    bays: &[BayPlan],
    opened: &mut std::collections::BTreeSet<String>,
) -> Vec<String> {
    let _ = fs::create_dir_all(dir);
    let mut named = Vec::new();
    for (bay, dev) in find_bays(sys_block, bays) {
        // Read-only, not exclusive: ZFS may have it open already, and that is fine.
        if fs::File::open(dev_dir.join(&dev)).is_err() {
            opened.remove(&dev);
            continue;
        }
        if opened.insert(dev.clone()) {
            continue;
        }
        let mut links = vec![(bay.clone(), dev.clone())];
        links.extend(partitions(sys_block, &dev).into_iter().map(|(n, part)| (format!("{bay}-part{n}"), part)));
        if links.iter().all(|(name, target)| link(dir, name, &dev_dir.join(target)).is_ok()) {
            named.push(bay);
        }
    }
    named
}

/// `dir/name` → `target`, unless it points there already; replaced by a rename, so a reader never
/// finds the name missing.
fn link(dir: &Path, name: &str, target: &Path) -> std::io::Result<()> {
    let path = dir.join(name);
    if fs::canonicalize(&path).ok().as_deref() == fs::canonicalize(target).ok().as_deref() && path.exists() {
        return Ok(());
    }
    let tmp = dir.join(format!(".{name}.nasinit"));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    fs::rename(&tmp, &path)
}

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// Where the kernel lists block devices and their partitions.
pub const SYS_CLASS_BLOCK: &str = "/sys/class/block";

/// The directory for runtime state: /run/nasinit as PID 1.
pub fn run_dir() -> PathBuf {
    PathBuf::from("/run/nasinit")
}

/// CLOCK_BOOTTIME now, in ms: how long the kernel ran before nasinit started.
pub fn kernel_ms() -> i64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(|t| t.tv_sec() * 1000 + t.tv_nsec() / 1_000_000)
        .unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nasos_board::board::DeviceMatch;

    fn bay(name: &str, serial: Option<&str>, pci: Option<&str>) -> BayPlan {
        BayPlan {
            name: name.into(),
            matcher: DeviceMatch { serial: serial.map(String::from), pci: pci.map(String::from), ..Default::default() },
        }
    }

    #[test]
    fn a_bay_is_present_when_udev_named_it_and_its_partitions() {
        let root = std::env::temp_dir().join(format!("nasos-bays-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let (dir, dev, sys) = (root.join("by-bay"), root.join("dev"), root.join("sys"));
        for d in
            [&dir, &dev, &sys.join("nvme1n1/nvme1n1p1"), &sys.join("nvme1n1/queue"), &sys.join("nvme2n1/nvme2n1p1")]
        {
            fs::create_dir_all(d).expect("dir");
        }
        for d in ["nvme1n1", "nvme1n1p1", "nvme2n1", "nvme2n1p1"] {
            fs::write(dev.join(d), b"").expect("node");
        }
        let link = |to: &str, name: &str| std::os::unix::fs::symlink(dev.join(to), dir.join(name)).expect("link");
        // BAY02: the disk and its one partition are named; `queue` is not a partition.
        link("nvme1n1", "BAY02");
        link("nvme1n1p1", "BAY02-part1");
        // BAY04: the disk is named, its partition not yet (udev is still at work).
        link("nvme2n1", "BAY04");
        // BAY03: a link whose device is gone.
        std::os::unix::fs::symlink("/nonexistent/nvme9n1", dir.join("BAY03")).expect("link");
        let bays = [
            bay("BAY01", Some("BAY01"), None),
            bay("BAY02", Some("BAY02"), None),
            bay("BAY03", None, Some("0000:43:00.0")),
            bay("BAY04", Some("BAY04"), None),
        ];
        assert_eq!(present_bays(&dir, &sys, &bays), vec!["BAY02".to_string()]);
        link("nvme2n1p1", "BAY04-part1");
        assert_eq!(present_bays(&dir, &sys, &bays), vec!["BAY02".to_string(), "BAY04".to_string()]);
        fs::remove_dir_all(&root).expect("cleanup");
    }

    /// A fake /sys/class/block: `dev` with files under its `device` link's target (a directory
    /// here) and its partitions as subdirectories holding `partition`.
    fn sys_disk(sys: &Path, dev: &str, files: &[(&str, &str)], parts: &[u32]) {
        let d = sys.join(dev).join("device");
        fs::create_dir_all(&d).expect("dir");
        for (rel, text) in files {
            let p = d.join(rel);
            fs::create_dir_all(p.parent().expect("parent")).expect("dir");
            fs::write(p, text).expect("write");
        }
        for n in parts {
            let p = sys.join(dev).join(format!("{dev}p{n}"));
            fs::create_dir_all(&p).expect("dir");
            fs::write(p.join("partition"), format!("{n}\n")).expect("write");
        }
    }

    #[test]
    fn bays_are_found_by_serial_and_by_pci_address_not_by_kernel_order() {
        let sys = std::env::temp_dir().join(format!("nasinit-sys-{}", std::process::id()));
        let _ = fs::remove_dir_all(&sys);
        // Kernel order deliberately differs from bay order.
        sys_disk(&sys, "nvme0n1", &[("serial", "BAY02  \n"), ("address", "0000:42:00.0\n")], &[]);
        sys_disk(&sys, "nvme1n1", &[("serial", "BAY01\n"), ("address", "0000:41:00.0\n")], &[]);
        // Native multipath: the head's device is the subsystem; the address is on its controller.
        sys_disk(&sys, "nvme2n1", &[("serial", "S5XYZ\n"), ("nvme3/address", "0000:43:00.0\n")], &[]);
        // Neither a partition nor a multipath path is a drive of its own.
        sys_disk(&sys, "nvme1n1p1", &[("serial", "BAY01\n")], &[]);
        sys_disk(&sys, "nvme2c2n1", &[("serial", "S5XYZ\n")], &[]);
        let bays = [
            bay("BAY01", Some("BAY01"), None),
            bay("BAY02", Some("BAY02"), None),
            bay("BAY03", None, Some("0000:43:00.0")),
            bay("BAY04", Some("BAY04"), None),
        ];
        assert_eq!(
            find_bays(&sys, &bays),
            vec![
                ("BAY01".to_string(), "nvme1n1".to_string()),
                ("BAY02".to_string(), "nvme0n1".to_string()),
                ("BAY03".to_string(), "nvme2n1".to_string()),
            ]
        );
        fs::remove_dir_all(&sys).expect("cleanup");
    }

    #[test]
    fn nasinit_names_present_bays_and_their_partitions_as_udev_would() {
        let root = std::env::temp_dir().join(format!("nasinit-name-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let (dir, dev, sys) = (root.join("by-bay"), root.join("dev"), root.join("sys"));
        fs::create_dir_all(&dev).expect("dir");
        for d in ["nvme0n1", "nvme0n1p1", "nvme0n1p9", "nvme1n1", "nvme5n1"] {
            fs::write(dev.join(d), b"").expect("node");
        }
        sys_disk(&sys, "nvme0n1", &[("serial", "BAY02\n")], &[1, 9]);
        sys_disk(&sys, "nvme1n1", &[("serial", "BAY01\n")], &[]);
        // In sysfs, but its node is not there yet: not named this round.
        sys_disk(&sys, "nvme2n1", &[("serial", "BAY03\n")], &[]);
        let bays =
            [bay("BAY01", Some("BAY01"), None), bay("BAY02", Some("BAY02"), None), bay("BAY03", Some("BAY03"), None)];
        // A link left from a drive that was in BAY01 before is replaced.
        fs::create_dir_all(&dir).expect("dir");
        std::os::unix::fs::symlink(dev.join("nvme5n1"), dir.join("BAY01")).expect("link");
        let mut opened = std::collections::BTreeSet::new();
        // The first round only opens the drives; the next names them.
        assert!(name_bays(&dir, &sys, &dev, &bays, &mut opened).is_empty());
        assert_eq!(fs::read_link(dir.join("BAY01")).expect("left as it was"), dev.join("nvme5n1"));
        assert_eq!(name_bays(&dir, &sys, &dev, &bays, &mut opened), vec!["BAY01".to_string(), "BAY02".to_string()]);
        let target = |n: &str| fs::read_link(dir.join(n)).expect(n);
        assert_eq!(target("BAY01"), dev.join("nvme1n1"));
        assert_eq!(target("BAY02"), dev.join("nvme0n1"));
        assert_eq!(target("BAY02-part1"), dev.join("nvme0n1p1"));
        assert_eq!(target("BAY02-part9"), dev.join("nvme0n1p9"));
        assert!(!dir.join("BAY03").exists());
        assert_eq!(present_bays(&dir, &sys, &bays), vec!["BAY01".to_string(), "BAY02".to_string()]);
        // Again: nothing to change, and no temporary links left behind.
        assert_eq!(name_bays(&dir, &sys, &dev, &bays, &mut opened).len(), 2);
        let names: Vec<String> =
            fs::read_dir(&dir).expect("dir").flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
        fs::remove_dir_all(&root).expect("cleanup");
    }
}
