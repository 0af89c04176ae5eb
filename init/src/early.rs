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

/// Waits until udev has named every bay of the plan and its partitions, at most `wait`.
/// Returns the bays present. Empty bays are not an error: they just take the wait. It polls
/// the links rather than waiting for udev's whole queue to settle: other module sets load side
/// by side, and their devices' events are not the bays' business.
pub fn wait_for_bays(bays: &[BayPlan], wait: std::time::Duration) -> Vec<String> {
    let t = std::time::Instant::now();
    loop {
        let present = present_bays(Path::new(BAY_DIR), Path::new(SYS_CLASS_BLOCK), bays);
        if present.len() == bays.len() || t.elapsed() >= wait {
            return present;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
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
}
