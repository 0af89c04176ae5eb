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

/// Creates `/dev/disk/by-bay/BAYnn` for every bay whose drive is present. Returns the bays found.
pub fn link_bays(bays: &[BayPlan], console: &Console) -> Vec<String> {
    let found = find_bays(Path::new("/sys"), bays);
    let _ = fs::create_dir_all(BAY_DIR);
    let mut linked = Vec::new();
    for (bay, dev) in &found {
        let link = Path::new(BAY_DIR).join(bay);
        let _ = fs::remove_file(&link);
        match std::os::unix::fs::symlink(Path::new("/dev").join(dev), &link) {
            Ok(()) => linked.push(bay.clone()),
            Err(e) => console.say(&format!("cannot link {}: {e}", link.display())),
        }
        // Partitions as udev names them (BAY01-part1): ZFS looks for its label there.
        for (n, part) in partitions(Path::new("/sys"), dev) {
            let link = Path::new(BAY_DIR).join(format!("{bay}-part{n}"));
            let _ = fs::remove_file(&link);
            let _ = std::os::unix::fs::symlink(Path::new("/dev").join(part), &link);
        }
    }
    linked
}

/// Maps bays to NVMe block devices (`nvme3n1`) by controller serial or PCI address, from sysfs.
/// Kernel numbering is never trusted: it does not follow bay order.
pub fn find_bays(sys: &Path, bays: &[BayPlan]) -> Vec<(String, String)> {
    let Ok(entries) = fs::read_dir(sys.join("block")) else { return Vec::new() };
    let mut disks: Vec<(String, Option<String>, Vec<String>)> = Vec::new();
    for e in entries.flatten() {
        let dev = e.file_name().to_string_lossy().into_owned();
        // Whole namespaces only: nvme0n1, not nvme0n1p1 nor the hidden multipath nvme0c0n1.
        let is_ns = dev.starts_with("nvme") && dev.contains('n') && !dev.contains('p') && !dev[4..].contains('c');
        if !is_ns {
            continue;
        }
        let device = e.path().join("device");
        let serial = read_trim(&device.join("serial"));
        let mut addresses: Vec<String> = read_trim(&device.join("address")).into_iter().collect();
        // With native multipath, `device` is the subsystem; its controllers carry the addresses.
        for ctrl in fs::read_dir(&device).into_iter().flatten().flatten() {
            let name = ctrl.file_name().to_string_lossy().into_owned();
            if name.starts_with("nvme") && name[4..].chars().all(|c| c.is_ascii_digit()) {
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

/// The partitions of a block device: (number, device name).
pub fn partitions(sys: &Path, dev: &str) -> Vec<(u32, String)> {
    let mut out: Vec<(u32, String)> = fs::read_dir(sys.join("block").join(dev))
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

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

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
    fn bays_are_found_by_serial_and_by_pci_address_not_by_kernel_order() {
        let sys = std::env::temp_dir().join(format!("nasinit-sys-{}", std::process::id()));
        let mk = |dev: &str, files: &[(&str, &str)]| {
            let d = sys.join("block").join(dev).join("device");
            fs::create_dir_all(&d).expect("dir");
            for (rel, text) in files {
                let p = d.join(rel);
                fs::create_dir_all(p.parent().expect("parent")).expect("dir");
                fs::write(p, text).expect("write");
            }
        };
        // Kernel order deliberately differs from bay order.
        mk("nvme0n1", &[("serial", "BAY02  \n"), ("address", "0000:42:00.0\n")]);
        mk("nvme1n1", &[("serial", "BAY01\n"), ("address", "0000:41:00.0\n")]);
        // Native multipath: the head's device is the subsystem; the address is on its controller.
        mk("nvme2n1", &[("serial", "S5XYZ\n"), ("nvme3/address", "0000:43:00.0\n")]);
        mk("nvme1n1p1", &[("serial", "BAY01\n")]);
        mk("nvme2c2n1", &[("serial", "S5XYZ\n")]);
        let bays = [
            bay("BAY01", Some("BAY01"), None),
            bay("BAY02", Some("BAY02"), None),
            bay("BAY03", None, Some("0000:43:00.0")),
            bay("BAY04", Some("BAY04"), None),
        ];
        let found = find_bays(&sys, &bays);
        assert_eq!(
            found,
            vec![
                ("BAY01".to_string(), "nvme1n1".to_string()),
                ("BAY02".to_string(), "nvme0n1".to_string()),
                ("BAY03".to_string(), "nvme2n1".to_string()),
            ]
        );
        fs::remove_dir_all(&sys).expect("cleanup");
    }
}
