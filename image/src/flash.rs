//! `nasos flash IMAGE DEVICE`: writes a raw disk image to a block device and reads it back to
//! verify it. It refuses anything that is not a whole block device, a device with anything
//! mounted on it, and the disk the running system lives on: flashing the wrong disk at 3 a.m.
//! must be impossible, not merely unlikely.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileTypeExt;
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
    Ok(disk)
}

/// Writes `image` to `device`, then reads it back and compares sha256 digests.
pub fn flash(image: &Path, device: &Path) -> anyhow::Result<String> {
    let disk = check_target(device)?;
    let mut src = File::open(image).with_context(|| format!("opening {}", image.display()))?;
    let len = src.metadata()?.len();
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(device)
        .with_context(|| format!("opening {}", device.display()))?;
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
