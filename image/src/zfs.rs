//! The ZFS kernel module, built by DKMS in a trixie build root for the image's exact kernel and
//! cached by (kernel version, ZFS version): minutes the first time, nothing afterwards.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::lock::Lock;
use crate::rootfs::{Cache, SOURCE, SUITE};

/// The kernel release and the ZFS version an image's lock pins.
pub struct Versions {
    pub kernel_release: String,
    pub kernel_version: String,
    pub zfs_version: String,
}

pub fn versions(lock: &Lock) -> anyhow::Result<Versions> {
    let (kernel_release, kernel_version) = kernel(lock)?;
    let zfs = lock.version_of("zfsutils-linux").context("the image has no zfsutils-linux")?;
    Ok(Versions { kernel_release, kernel_version, zfs_version: zfs.to_string() })
}

/// The kernel release (`6.12.117+deb13-amd64`) and package version the lock pins.
pub fn kernel(lock: &Lock) -> anyhow::Result<(String, String)> {
    let k = lock
        .packages
        .iter()
        .find(|p| p.name.starts_with("linux-image-") && p.name != "linux-image-amd64")
        .context("the image has no kernel package")?;
    Ok((k.name.trim_start_matches("linux-image-").to_string(), k.version.clone()))
}

/// The cache directory holding the built modules for these versions.
pub fn cached(cache: &Cache, v: &Versions) -> PathBuf {
    cache.root.join("zfs").join(format!("{}_{}", v.kernel_release, v.zfs_version.replace(':', "%3a")))
}

/// Builds the modules unless cached; returns the directory with `zfs.ko*` and `spl.ko*`.
pub fn ensure(cache: &Cache, v: &Versions, epoch: u64) -> anyhow::Result<(PathBuf, bool)> {
    let dir = cached(cache, v);
    if dir.join("zfs.ko.xz").exists() || dir.join("zfs.ko").exists() {
        return Ok((dir, false));
    }
    let tmp = dir.with_extension("tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let headers = format!("linux-headers-{}={}", v.kernel_release, v.kernel_version);
    let dkms = format!("zfs-dkms={}", v.zfs_version);
    let q = shell_quote(&tmp.display().to_string());
    let kr = &v.kernel_release;
    let mut cmd = Command::new("mmdebstrap");
    cmd.arg("--variant=buildd")
        .arg(format!("--include={headers},{dkms}"))
        .arg("--components=main,contrib")
        .arg("--aptopt=APT::Install-Recommends \"false\"")
        .arg("--aptopt=Acquire::Retries \"3\"")
        // zfs-dkms builds in its postinst for the kernels it finds; build explicitly for the
        // image's kernel too, in case the postinst aimed at the host's.
        .arg(format!("--customize-hook=chroot \"$1\" dkms autoinstall -k {kr}"))
        .arg(format!("--customize-hook=sh -c 'cp \"$1\"/usr/lib/modules/{kr}/updates/dkms/*.ko* {q}/' -- \"$1\""))
        .arg(SUITE)
        .arg("/dev/null")
        .arg(SOURCE)
        .env("INITRD", "No")
        .env("SOURCE_DATE_EPOCH", epoch.to_string());
    crate::progress::run_tool(&mut cmd, "the ZFS build root (mmdebstrap + DKMS)")?;
    if !tmp.join("zfs.ko.xz").exists() && !tmp.join("zfs.ko").exists() {
        bail!("DKMS finished but no zfs module was produced for {kr}");
    }
    std::fs::rename(&tmp, &dir).with_context(|| format!("moving {} into place", dir.display()))?;
    Ok((dir, true))
}

/// Copies the built modules into a root tree and records them in its module index.
pub fn install(modules: &Path, root: &Path, kernel_release: &str) -> anyhow::Result<()> {
    let dest = root.join("usr/lib/modules").join(kernel_release).join("updates/dkms");
    std::fs::create_dir_all(&dest)?;
    for e in std::fs::read_dir(modules)?.flatten() {
        std::fs::copy(e.path(), dest.join(e.file_name()))?;
    }
    // The image's own depmod, so the index matches the image's kmod.
    let status = Command::new("chroot")
        .arg(root)
        .args(["/usr/sbin/depmod", kernel_release])
        .status()
        .context("running depmod in the image tree")?;
    if !status.success() {
        bail!("depmod failed: {status}");
    }
    Ok(())
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}
