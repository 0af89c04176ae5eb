//! `nasos flash IMAGE DEVICE`: writes a raw disk image to a block device and reads it back to
//! verify it. It refuses anything that is not a whole block device, the disk the running system
//! lives on, a disk with anything mounted on it, a disk the kernel holds (device-mapper, md,
//! an active swap area) or that is a member of a storage stack even when nothing has it open (a
//! ZFS pool member, an LVM or md member, a swap area), and it opens the disk with O_EXCL so
//! whatever the checks missed still makes the open fail: flashing the wrong disk at 3 a.m. must
//! be impossible, not merely unlikely.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

const CHUNK: usize = 4 << 20;

/// The kernel name of a block device (`sdb`, `nvme1n1`, `loop3`) and of the disk it belongs to.
fn kernel_names(device: &Path) -> anyhow::Result<(String, String)> {
    let meta = std::fs::metadata(device).with_context(|| format!("{} does not exist", device.display()))?;
    if !meta.file_type().is_block_device() {
        bail!("{} is not a block device; nasos flash writes whole disks (e.g. /dev/sdb)", device.display());
    }
    let rdev = std::os::unix::fs::MetadataExt::rdev(&meta);
    let (major, minor) = (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
    let sys =
        std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).context("finding the device in sysfs")?;
    let name = sys.file_name().map(|n| n.to_string_lossy().into_owned()).context("device name")?;
    // A partition's sysfs directory sits inside its disk's.
    let disk = if sys.join("partition").exists() {
        sys.parent().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).context("parent disk")?
    } else {
        name.clone()
    };
    Ok((name, disk))
}

/// Disks (kernel names) holding a mounted filesystem, with where they are mounted. Device-mapper
/// and md devices count for the disks under them.
fn mounted_disks() -> Vec<(String, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out = Vec::new();
    for line in info.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(devno), Some(mp)) = (f.get(2), f.get(4)) else { continue };
        let Ok(sys) = std::fs::canonicalize(format!("/sys/dev/block/{devno}")) else { continue };
        for disk in disks_under(&sys) {
            out.push((disk, mp.to_string()));
        }
    }
    out
}

/// The whole disks a block device (partition, dm or md device) ultimately lives on.
fn disks_under(sys: &Path) -> Vec<String> {
    let slaves: Vec<PathBuf> =
        std::fs::read_dir(sys.join("slaves")).into_iter().flatten().flatten().map(|e| e.path()).collect();
    if !slaves.is_empty() {
        return slaves.iter().filter_map(|s| std::fs::canonicalize(s).ok()).flat_map(|s| disks_under(&s)).collect();
    }
    let dir =
        if sys.join("partition").exists() { sys.parent().map(Path::to_path_buf) } else { Some(sys.to_path_buf()) };
    dir.and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned())).into_iter().collect()
}

/// Where the kernel lists block devices, their partitions and their holders.
const SYS_BLOCK: &str = "/sys/class/block";

/// Signatures of storage stacks a disk must not be flashed over, even when nothing has it open
/// now (an exported pool, an inactive volume group, a swap area not in use), with what blkid's
/// TYPE means and how to clear it once the operator is sure.
const MEMBER_TYPES: &[(&str, &str, &str)] = &[
    ("zfs_member", "a ZFS pool member", "zpool labelclear -f"),
    ("swap", "a swap area", "wipefs -a"),
    ("LVM2_member", "an LVM physical volume", "pvremove"),
    ("linux_raid_member", "an md RAID member", "mdadm --zero-superblock"),
    ("crypto_LUKS", "a LUKS-encrypted volume", "cryptsetup erase, then wipefs -a"),
    ("bcache", "a bcache backing or cache device", "wipefs -a"),
];

/// The disk's partitions (kernel names), from sysfs (`sys_block` is normally [`SYS_BLOCK`]).
fn partitions(sys_block: &Path, disk: &str) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(sys_block.join(disk))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("partition").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// What the kernel says holds the disk or one of its partitions (device-mapper, md, bcache),
/// as `dm-0 (vg-lv) on sdb2`.
fn holders(sys_block: &Path, disk: &str) -> Vec<String> {
    let mut out = Vec::new();
    for dev in std::iter::once(disk.to_string()).chain(partitions(sys_block, disk)) {
        let dir = sys_block.join(&dev).join("holders");
        let mut held: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|h| h.file_name().to_string_lossy().into_owned())
            .collect();
        held.sort();
        for name in held {
            let dm = std::fs::read_to_string(sys_block.join(&name).join("dm/name")).unwrap_or_default();
            let dm = if dm.trim().is_empty() { String::new() } else { format!(" ({})", dm.trim()) };
            out.push(format!("{name}{dm} on {dev}"));
        }
    }
    out
}

/// Active swap areas on the disk, from /proc/swaps.
fn swaps_on(disk: &str) -> Vec<String> {
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    swaps
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .filter(|dev| {
            kernel_names(Path::new(dev)).is_ok_and(|(_, d)| d == disk)
                || std::fs::canonicalize(dev).is_ok_and(|p| p == Path::new("/dev").join(disk))
        })
        .map(String::from)
        .collect()
}

/// The storage-stack signatures blkid's low-level probe finds on the disk or its partitions:
/// (device, what it is, how to clear it).
fn member_signatures(disk: &str) -> Vec<(String, String, &'static str)> {
    let mut out = Vec::new();
    for dev in std::iter::once(disk.to_string()).chain(partitions(Path::new(SYS_BLOCK), disk)) {
        let path = format!("/dev/{dev}");
        let Ok(o) = std::process::Command::new("blkid").args(["-p", "-o", "export", &path]).output() else {
            continue;
        };
        let text = String::from_utf8_lossy(&o.stdout);
        let field = |k: &str| text.lines().find_map(|l| l.strip_prefix(k)).map(str::to_string);
        let Some(ty) = field("TYPE=") else { continue };
        if let Some((_, what, clear)) = MEMBER_TYPES.iter().find(|(t, _, _)| *t == ty) {
            let label = field("LABEL=").map(|l| format!(" (label {l})")).unwrap_or_default();
            out.push((path, format!("{what}{label}"), *clear));
        }
    }
    out
}

/// Refuses devices that must not be written; returns the disk's kernel name.
pub fn check_target(device: &Path) -> anyhow::Result<String> {
    let (name, disk) = kernel_names(device)?;
    if name != disk {
        bail!("{} is a partition of {disk}; flash the whole disk (/dev/{disk})", device.display());
    }
    let mounted = mounted_disks();
    let uses: Vec<&str> = mounted.iter().filter(|(d, _)| *d == disk).map(|(_, mp)| mp.as_str()).collect();
    if uses.iter().any(|mp| *mp == "/" || *mp == "/boot" || *mp == "/usr") {
        bail!("/dev/{disk} holds the running system (mounted on {}); refusing to overwrite it", uses.join(", "));
    }
    if !uses.is_empty() {
        bail!("/dev/{disk} has mounted filesystems ({}); unmount them first", uses.join(", "));
    }
    let swaps = swaps_on(&disk);
    if !swaps.is_empty() {
        bail!("/dev/{disk} is in use as swap ({}); swapoff it first", swaps.join(", "));
    }
    let held = holders(Path::new(SYS_BLOCK), &disk);
    if !held.is_empty() {
        bail!(
            "/dev/{disk} is held by {} (device-mapper, md or bcache); stop what uses it first (dmsetup ls, cat /proc/mdstat)",
            held.join(", ")
        );
    }
    if let Some((dev, what, clear)) = member_signatures(&disk).into_iter().next() {
        bail!(
            "{dev} is {what}, per blkid; nasos flash never writes over a member of a storage stack. \
             If this disk really is to be reused, clear it first ({clear} {dev}) and run again"
        );
    }
    // The kernel's word last: the exclusive open the write will use (it writes nothing).
    drop(open_exclusive(device)?);
    Ok(disk)
}

/// Opens the disk for writing, exclusively: for a block device O_EXCL fails with EBUSY while
/// anything holds it (a mount, swap, device-mapper, an imported ZFS pool), whatever the checks
/// above could see.
fn open_exclusive(device: &Path) -> anyhow::Result<File> {
    std::fs::OpenOptions::new().write(true).read(true).custom_flags(nix::libc::O_EXCL).open(device).map_err(|e| {
        if e.raw_os_error() == Some(nix::libc::EBUSY) {
            anyhow::anyhow!(
                "{} is in use (the kernel refused an exclusive open: mounted, swap, a pool member or held by \
                 device-mapper); nothing was written",
                device.display()
            )
        } else {
            anyhow::Error::new(e).context(format!("opening {}", device.display()))
        }
    })
}

/// Writes `image` to `device`, then reads it back and compares sha256 digests.
pub fn flash(image: &Path, device: &Path) -> anyhow::Result<String> {
    let disk = check_target(device)?;
    let mut src = File::open(image).with_context(|| format!("opening {}", image.display()))?;
    let len = src.metadata()?.len();
    let mut dst = open_exclusive(device)?;
    let size = dst.seek(SeekFrom::End(0))?;
    if size < len {
        bail!("{} is {} MiB, smaller than the image ({} MiB)", device.display(), size >> 20, len >> 20);
    }
    dst.seek(SeekFrom::Start(0))?;
    let mut want = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut done = 0u64;
    let bar = crate::progress::bytes(&format!("flashing /dev/{disk}"), len);
    let mut shown = 0;
    loop {
        let n = src.read(&mut buf)?;
        if n == 0 {
            break;
        }
        want.update(&buf[..n]);
        dst.write_all(&buf[..n]).with_context(|| format!("writing {} at {done}", device.display()))?;
        done += n as u64;
        bar.set_position(done);
        // In a log, a line per tenth instead of a bar.
        let tenth = done * 10 / len.max(1);
        if bar.is_hidden() && tenth > shown {
            shown = tenth;
            eprintln!("nasos: flashing /dev/{disk}: {}%", tenth * 10);
        }
    }
    bar.set_message("syncing");
    dst.sync_all()?;
    bar.finish_and_clear();
    eprintln!("nasos: wrote {} MiB to /dev/{disk}; reading it back", len >> 20);
    // Read back from the device, not from the page cache the write just filled.
    let _ = nix::fcntl::posix_fadvise(&dst, 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED);
    dst.seek(SeekFrom::Start(0))?;
    let mut got = Sha256::new();
    let mut left = len;
    while left > 0 {
        let n = (left as usize).min(CHUNK);
        dst.read_exact(&mut buf[..n])?;
        got.update(&buf[..n]);
        left -= n as u64;
    }
    let (w, g) = (crate::stage::hex(&want.finalize()), crate::stage::hex(&got.finalize()));
    if w != g {
        bail!("verification failed: wrote {w}, read back {g}; the device may be failing");
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_of_the_disk_and_its_partitions_are_named() {
        let sys = std::env::temp_dir().join(format!("nasos-flash-sys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&sys);
        for d in ["sdb/sdb1", "sdb/sdb2/holders/dm-0", "sdb/holders/md127", "dm-0/dm", "sdc/holders"] {
            std::fs::create_dir_all(sys.join(d)).expect("dir");
        }
        for p in ["sdb/sdb1/partition", "sdb/sdb2/partition"] {
            std::fs::write(sys.join(p), "1\n").expect("partition");
        }
        // In sysfs a partition's directory is both under its disk and at the top level.
        std::os::unix::fs::symlink(sys.join("sdb/sdb2"), sys.join("sdb2")).expect("link");
        std::fs::write(sys.join("dm-0/dm/name"), "vg0-data\n").expect("dm name");
        assert_eq!(partitions(&sys, "sdb"), ["sdb1", "sdb2"]);
        assert_eq!(holders(&sys, "sdb"), ["md127 on sdb", "dm-0 (vg0-data) on sdb2"]);
        assert!(holders(&sys, "sdc").is_empty());
        std::fs::remove_dir_all(&sys).expect("cleanup");
    }
}
