//! The ZFS kernel module, built by DKMS in a trixie build root for the image's exact kernel and
//! cached by (kernel version, ZFS version): minutes the first time, nothing afterwards. The
//! cache keeps a record beside the modules — the inputs that made them and each file's sha256 —
//! and a cached module that does not match it is rebuilt, with a line saying so.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::archive::{SOURCES, SUITE};
use crate::lock::Lock;
use crate::rootfs::Cache;

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

/// The record kept beside the cached modules.
const RECORD: &str = "record";

/// What made the modules: the first lines of their record.
fn inputs(v: &Versions) -> String {
    format!(
        "kernel {} {}\nzfs {}\nsource {} {SUITE}\n",
        v.kernel_release,
        v.kernel_version,
        v.zfs_version,
        SOURCES.join(" | ")
    )
}

/// The module files in a cache directory, by name.
pub fn modules_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".ko") || n.ends_with(".ko.xz"))
        .collect();
    names.sort();
    names
}

/// The record of the modules in `dir`: their inputs, then `sha256  name` per module.
fn record_text(dir: &Path, v: &Versions) -> anyhow::Result<String> {
    let mut out = inputs(v);
    for m in modules_in(dir) {
        out.push_str(&format!("{}  {m}\n", crate::stage::sha256_file(&dir.join(&m))?));
    }
    Ok(out)
}

/// Whether the cached modules are the ones their record describes, for these versions; why not.
fn check(dir: &Path, v: &Versions) -> Result<(), String> {
    let record =
        std::fs::read_to_string(dir.join(RECORD)).map_err(|_| "the cached module has no record".to_string())?;
    let Some(hashes) = record.strip_prefix(&inputs(v)) else {
        return Err("the cached module's record names other inputs".into());
    };
    let recorded: Vec<(&str, &str)> = hashes.lines().filter_map(|l| l.split_once("  ")).collect();
    let present = modules_in(dir);
    if recorded.iter().map(|(_, n)| n.to_string()).collect::<Vec<_>>() != present {
        return Err(format!("the cached modules ({}) are not the recorded ones", present.join(" ")));
    }
    for (want, name) in recorded {
        let got = crate::stage::sha256_file(&dir.join(name)).map_err(|e| format!("{e:#}"))?;
        if got != want {
            return Err(format!(
                "cached module {} does not match the sha256 recorded when it was built",
                dir.join(name).display()
            ));
        }
    }
    Ok(())
}

/// A module cached before records were kept is adopted only if what it says of itself matches:
/// every module's vermagic names the kernel release and zfs.ko's version is the locked one.
fn adoptable(dir: &Path, v: &Versions) -> Result<(), String> {
    let names = modules_in(dir);
    if !names.iter().any(|n| n.starts_with("zfs.ko")) {
        return Err("no zfs module".into());
    }
    for n in &names {
        let path = dir.join(n);
        let bytes = if n.ends_with(".xz") {
            let o = Command::new("xz").arg("-dc").arg(&path).output().map_err(|e| format!("xz: {e}"))?;
            if !o.status.success() {
                return Err(format!("{} does not decompress", path.display()));
            }
            o.stdout
        } else {
            std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?
        };
        let info: Vec<&[u8]> = bytes.split(|b| *b == 0).collect();
        let vermagic = format!("vermagic={} ", v.kernel_release);
        if !info.iter().any(|f| f.starts_with(vermagic.as_bytes())) {
            return Err(format!("{} was not built for {}", path.display(), v.kernel_release));
        }
        let version = format!("version={}", v.zfs_version);
        if n.starts_with("zfs.ko") && !info.contains(&version.as_bytes()) {
            return Err(format!("{} is not zfs {}", path.display(), v.zfs_version));
        }
    }
    Ok(())
}

/// Builds the modules unless cached and verified; returns the directory with `zfs.ko*` and
/// `spl.ko*`, and whether they were built now.
pub fn ensure(cache: &Cache, v: &Versions, epoch: u64) -> anyhow::Result<(PathBuf, bool)> {
    let dir = cached(cache, v);
    if !modules_in(&dir).is_empty() {
        let verdict = if dir.join(RECORD).exists() {
            check(&dir, v)
        } else {
            adoptable(&dir, v).map(|()| {
                eprintln!(
                    "nasos: zfs        the cached module predates records: its vermagic and version match; recording its hashes"
                );
            })
        };
        match verdict {
            Ok(()) => {
                if !dir.join(RECORD).exists() {
                    crate::stage::write_atomic(&dir.join(RECORD), record_text(&dir, v)?.as_bytes())?;
                }
                return Ok((dir, false));
            }
            Err(why) => {
                eprintln!("nasos: zfs        {why}; rebuilding it");
                std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
            }
        }
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
        // Out through `sync-out`: as a normal user mmdebstrap runs the hooks as its namespace's
        // users, which may not write to the cache.
        .arg(format!("--customize-hook=sync-out /usr/lib/modules/{kr}/updates/dkms {q}"))
        .arg(SUITE)
        .arg("/dev/null")
        .args(SOURCES)
        .env("INITRD", "No")
        .env("SOURCE_DATE_EPOCH", epoch.to_string());
    crate::progress::run_tool(&mut cmd, "the ZFS build root (mmdebstrap + DKMS)")?;
    if !tmp.join("zfs.ko.xz").exists() && !tmp.join("zfs.ko").exists() {
        bail!("DKMS finished but no zfs module was produced for {kr}");
    }
    crate::stage::write_atomic(&tmp.join(RECORD), record_text(&tmp, v)?.as_bytes())?;
    std::fs::rename(&tmp, &dir).with_context(|| format!("moving {} into place", dir.display()))?;
    Ok((dir, true))
}

/// Copies the built modules into a root tree and records them in its module index.
pub fn install(modules: &Path, root: &Path, kernel_release: &str) -> anyhow::Result<()> {
    let dest = root.join("usr/lib/modules").join(kernel_release).join("updates/dkms");
    std::fs::create_dir_all(&dest)?;
    // The modules only: the cache's record stays in the cache.
    for m in modules_in(modules) {
        std::fs::copy(modules.join(&m), dest.join(&m))?;
    }
    // The image's own depmod, so the index matches the image's kmod.
    let status = crate::userns::tree_command("chroot")
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

#[cfg(test)]
mod tests {
    use super::*;

    fn versions() -> Versions {
        Versions {
            kernel_release: "6.12.117+deb13-amd64".into(),
            kernel_version: "6.12.117-1".into(),
            zfs_version: "2.3.9-0+deb13u1".into(),
        }
    }

    /// A stand-in module: the `.modinfo` strings a real one carries, NUL-separated.
    fn module(dir: &Path, name: &str, vermagic: &str, version: &str) {
        let body = format!("\0junk\0vermagic={vermagic} SMP preempt mod_unload modversions \0version={version}\0");
        std::fs::write(dir.join(name), body).expect("module");
    }

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("nasos-zfs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    #[test]
    fn a_recorded_module_is_trusted_until_a_byte_changes() {
        let (d, v) = (temp("record"), versions());
        module(&d, "spl.ko", &v.kernel_release, "2.3.9-0+deb13u1");
        module(&d, "zfs.ko", &v.kernel_release, "2.3.9-0+deb13u1");
        assert_eq!(check(&d, &v), Err("the cached module has no record".into()));
        std::fs::write(d.join(RECORD), record_text(&d, &v).expect("record")).expect("write");
        assert_eq!(check(&d, &v), Ok(()));
        let other = Versions { zfs_version: "2.3.10-1".into(), ..versions() };
        assert!(check(&d, &other).is_err_and(|e| e.contains("other inputs")));
        let mut bytes = std::fs::read(d.join("zfs.ko")).expect("read");
        bytes[1] ^= 1;
        std::fs::write(d.join("zfs.ko"), bytes).expect("tamper");
        assert!(
            check(&d, &v).is_err_and(|e| e.contains("zfs.ko does not match the sha256 recorded")),
            "{:?}",
            check(&d, &v)
        );
        std::fs::remove_dir_all(&d).expect("cleanup");
    }

    #[test]
    fn an_unrecorded_module_is_adopted_only_for_its_kernel_and_version() {
        let (d, v) = (temp("adopt"), versions());
        module(&d, "spl.ko", &v.kernel_release, "2.3.9-0+deb13u1");
        module(&d, "zfs.ko", &v.kernel_release, "2.3.9-0+deb13u1");
        assert_eq!(adoptable(&d, &v), Ok(()));
        module(&d, "zfs.ko", "6.12.99+deb13-amd64", "2.3.9-0+deb13u1");
        assert!(adoptable(&d, &v).is_err_and(|e| e.contains("was not built for 6.12.117+deb13-amd64")));
        module(&d, "zfs.ko", &v.kernel_release, "2.3.8-1");
        assert!(adoptable(&d, &v).is_err_and(|e| e.contains("is not zfs 2.3.9-0+deb13u1")));
        std::fs::remove_dir_all(&d).expect("cleanup");
    }
}
