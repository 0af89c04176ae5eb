//! The ZFS kernel module, built by DKMS in a trixie build root for the image's exact kernel. The
//! build root is locked like the image (`[[build_package]]` in the recipe's lock: the compiler,
//! the kernel headers, zfs-dkms and the rest of Debian's buildd set, each with its .deb's
//! sha256), and the module is cached by (kernel, ZFS, that package set): minutes the first time,
//! nothing afterwards. The cache keeps a record beside the modules — the inputs that made them
//! and each file's sha256 — and a cached module that does not match it is rebuilt, with a line
//! saying so.
//!
//! One patch is applied to ZFS's source before DKMS builds it
//! (`patches/zfs-no-load-benchmarks.patch`): the module no longer benchmarks every fletcher-4,
//! RAID-Z, SHA-2 and BLAKE3 implementation each time it loads (about 1 s of every boot under
//! QEMU's TCG, 0.1–0.2 s on an EPYC) but takes the last supported implementation of each, the
//! choice ZFS's userspace build already makes. Its text is part of the module's cache key, and a
//! built module that still has the benchmarks is refused.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::archive::{SOURCES, SUITE};
use crate::lock::{Lock, LockedPackage};
use crate::rootfs::{Bootstrap, Cache};

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

/// The patch applied to ZFS's source before DKMS builds it, and the name DKMS knows it by.
pub const PATCH: &str = include_str!("../patches/zfs-no-load-benchmarks.patch");
pub const PATCH_NAME: &str = "zfs-no-load-benchmarks.patch";

/// Functions only ZFS's load-time benchmarks have: a module that has them was built without
/// [`PATCH`].
const BENCHMARK_SYMBOLS: [&str; 2] = ["benchmark_raidz_impl", "fletcher_4_benchmark_impl"];

/// DKMS's per-module configuration (`/etc/dkms/zfs.conf`, read after the source's `dkms.conf`):
/// it names the patch DKMS applies to its copy of the source before it builds.
fn dkms_conf() -> String {
    format!("# nasos: applied to DKMS's copy of the ZFS source before the build.\nPATCH[0]=\"{PATCH_NAME}\"\n")
}

/// The upstream version of a Debian package version (`2.3.9` of `2.3.9-0+deb13u1`), which names
/// the source's folder (`/usr/src/zfs-2.3.9`).
fn upstream(debian_version: &str) -> &str {
    let v = debian_version.split_once(':').map_or(debian_version, |(_, v)| v);
    v.rsplit_once('-').map_or(v, |(u, _)| u)
}

/// Which of [`BENCHMARK_SYMBOLS`] `nm`'s listing of a module names.
fn benchmarks_left(nm: &str) -> Vec<&'static str> {
    BENCHMARK_SYMBOLS
        .into_iter()
        .filter(|s| nm.lines().any(|l| l.split_whitespace().nth(2).is_some_and(|n| n.split('.').next() == Some(s))))
        .collect()
}

/// Fails if the built `zfs.ko` (or `.ko.xz`) in `dir` still benchmarks at load.
fn check_patched(dir: &Path) -> anyhow::Result<()> {
    let (xz, plain) = (dir.join("zfs.ko.xz"), dir.join("zfs.ko"));
    let listing = if xz.exists() {
        let scratch = dir.with_extension("nm.ko");
        let o = std::process::Command::new("xz").arg("-dc").arg(&xz).output().context("running xz -dc")?;
        if !o.status.success() {
            bail!("xz -dc {} failed: {}", xz.display(), String::from_utf8_lossy(&o.stderr));
        }
        std::fs::write(&scratch, o.stdout)?;
        let listing = nm(&scratch);
        let _ = std::fs::remove_file(&scratch);
        listing?
    } else {
        nm(&plain)?
    };
    let left = benchmarks_left(&listing);
    if !left.is_empty() {
        bail!(
            "DKMS built zfs without {PATCH_NAME} (the module still has {}): is /etc/dkms/zfs.conf read by this DKMS?",
            left.join(", ")
        );
    }
    Ok(())
}

fn nm(ko: &Path) -> anyhow::Result<String> {
    let o = std::process::Command::new("nm").arg(ko).output().context("running nm")?;
    if !o.status.success() {
        bail!("nm {} failed: {}", ko.display(), String::from_utf8_lossy(&o.stderr));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The record's line for the patch.
fn patch_line() -> String {
    format!("patch {PATCH_NAME} {}\n", crate::stage::sha256_bytes(PATCH.as_bytes()))
}

/// The cache directory holding the modules built for these versions in this build root.
pub fn cached(cache: &Cache, v: &Versions, build_root: &[LockedPackage]) -> PathBuf {
    let id = crate::stage::sha256_bytes(format!("{}{}", build_root_lines(build_root), patch_line()).as_bytes());
    cache.root.join("zfs").join(format!("{}_{}_{}", v.kernel_release, v.zfs_version.replace(':', "%3a"), &id[..16]))
}

/// The record kept beside the cached modules.
const RECORD: &str = "record";

/// A build root as its record lists it: `build NAME VERSION ARCH SHA256 SUITE`, sorted.
fn build_root_lines(build_root: &[LockedPackage]) -> String {
    let mut sorted = build_root.to_vec();
    sorted.sort();
    sorted
        .iter()
        .map(|p| format!("build {} {} {} {} {}\n", p.name, p.version, p.architecture, p.sha256, p.suite))
        .collect()
}

/// What made the modules: the first lines of their record.
fn inputs(v: &Versions, build_root: &[LockedPackage]) -> String {
    format!(
        "kernel {} {}\nzfs {}\nsource {} {SUITE}\n{}{}",
        v.kernel_release,
        v.kernel_version,
        v.zfs_version,
        SOURCES.join(" | "),
        patch_line(),
        build_root_lines(build_root)
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
fn record_text(dir: &Path, v: &Versions, build_root: &[LockedPackage]) -> anyhow::Result<String> {
    let mut out = inputs(v, build_root);
    for m in modules_in(dir) {
        out.push_str(&format!("{}  {m}\n", crate::stage::sha256_file(&dir.join(&m))?));
    }
    Ok(out)
}

/// Whether the cached modules are the ones their record describes, for these versions; why not.
fn check(dir: &Path, v: &Versions, build_root: &[LockedPackage]) -> Result<(), String> {
    let record =
        std::fs::read_to_string(dir.join(RECORD)).map_err(|_| "the cached module has no record".to_string())?;
    let Some(hashes) = record.strip_prefix(&inputs(v, build_root)) else {
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

/// The built modules: where they are, whether they were built now, and the build root that
/// made them.
pub struct Module {
    pub dir: PathBuf,
    pub built: bool,
    pub build_root: Vec<LockedPackage>,
}

/// The modules for `v`, from the cache when the lock names their build root and the cached
/// modules match their record; built otherwise. A build resolves its build root afresh (seeded
/// with the locked .debs, so it downloads nothing the cache has): the caller compares it with
/// the lock.
pub fn ensure(cache: &Cache, v: &Versions, locked: &[LockedPackage], epoch: u64) -> anyhow::Result<Module> {
    if !locked.is_empty() {
        let dir = cached(cache, v, locked);
        if !modules_in(&dir).is_empty() {
            match check(&dir, v, locked) {
                Ok(()) => return Ok(Module { dir, built: false, build_root: locked.to_vec() }),
                Err(why) => {
                    eprintln!("nasos: zfs        {why}; rebuilding it");
                    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
                }
            }
        }
    }
    let tmp = cache.root.join("zfs").join(format!("build.{}.tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let include =
        [format!("linux-headers-{}={}", v.kernel_release, v.kernel_version), format!("zfs-dkms={}", v.zfs_version)];
    let kr = &v.kernel_release;
    // The patch and DKMS's configuration go in before zfs-dkms is unpacked, so the build its
    // postinst starts is already the patched one.
    let inputs_dir = cache.root.join("zfs").join(format!("build.{}.in", std::process::id()));
    let _ = std::fs::remove_dir_all(&inputs_dir);
    std::fs::create_dir_all(&inputs_dir)?;
    std::fs::write(inputs_dir.join(PATCH_NAME), PATCH)?;
    std::fs::write(inputs_dir.join("zfs.conf"), dkms_conf())?;
    let patches = format!("/usr/src/zfs-{}/patches", upstream(&v.zfs_version));
    let essential = [
        format!("mkdir -p \"$1\"{patches} \"$1\"/etc/dkms"),
        format!("upload {} {patches}/{PATCH_NAME}", shell_quote(&inputs_dir.join(PATCH_NAME).display().to_string())),
        format!("upload {} /etc/dkms/zfs.conf", shell_quote(&inputs_dir.join("zfs.conf").display().to_string())),
    ];
    let hooks = [
        // zfs-dkms builds in its postinst for the kernels it finds; build explicitly for the
        // image's kernel too, in case the postinst aimed at the host's.
        format!("chroot \"$1\" dkms autoinstall -k {kr}"),
        // Out through `sync-out`: as a normal user mmdebstrap runs the hooks as its namespace's
        // users, which may not write to the cache.
        format!("sync-out /usr/lib/modules/{kr}/updates/dkms {}", shell_quote(&tmp.display().to_string())),
    ];
    let root = Bootstrap {
        variant: "buildd",
        include: &include,
        slim: false,
        essential: &essential,
        customize: &hooks,
        what: "the ZFS build root (mmdebstrap + DKMS)",
    };
    let built = crate::rootfs::bootstrap(cache, &root, locked, epoch, Path::new("/dev/null"));
    let _ = std::fs::remove_dir_all(&inputs_dir);
    let build_root = built?;
    if !tmp.join("zfs.ko.xz").exists() && !tmp.join("zfs.ko").exists() {
        bail!("DKMS finished but no zfs module was produced for {kr}");
    }
    check_patched(&tmp)?;
    crate::stage::write_atomic(&tmp.join(RECORD), record_text(&tmp, v, &build_root)?.as_bytes())?;
    // Kept under the build root it was made in, whether or not the lock names that one.
    let dir = cached(cache, v, &build_root);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).with_context(|| format!("moving {} into place", dir.display()))?;
    Ok(Module { dir, built: true, build_root })
}

/// The sections holding a module's ftrace call sites (and their relocations). Debian's kernel
/// checks each call site against the module's symbols when it loads (`ftrace_module_enable` →
/// `test_for_valid_rec` → `kallsyms_lookup`, a linear scan of ~23,000 symbols per site). For
/// zfs.ko's ~6,600 sites that was 3.1 s of a 5 s `modprobe zfs` under TCG, on the critical path
/// of every boot. The call sites themselves are already NOPs (objtool `--mnop`), so without the
/// records the code is the same and ZFS's functions are simply not traceable with ftrace
/// (kprobes and BPF still are).
pub const FTRACE_SECTIONS: [&str; 2] = ["__mcount_loc", ".rela__mcount_loc"];

/// What [`prepare`] does to the built modules, for the keys of the stages that use them.
pub const PREPARED: &str = "zfs modules: uncompressed, without __mcount_loc";

/// Writes the cached modules into `dest` as the image carries them: uncompressed (EROFS
/// compresses the tree; a compressed module would be decompressed at every load) and without
/// their ftrace call-site records ([`FTRACE_SECTIONS`]). Returns the names written.
pub fn prepare(from: &Path, dest: &Path) -> anyhow::Result<Vec<String>> {
    std::fs::create_dir_all(dest)?;
    let mut written = Vec::new();
    for name in modules_in(from) {
        let plain = name.trim_end_matches(".xz").to_string();
        let out = dest.join(&plain);
        if name.ends_with(".xz") {
            let o =
                std::process::Command::new("xz").arg("-dc").arg(from.join(&name)).output().context("running xz -dc")?;
            if !o.status.success() {
                bail!("xz -dc {} failed: {}", from.join(&name).display(), String::from_utf8_lossy(&o.stderr));
            }
            std::fs::write(&out, o.stdout).with_context(|| format!("writing {}", out.display()))?;
        } else {
            std::fs::copy(from.join(&name), &out).with_context(|| format!("copying {name}"))?;
        }
        let mut objcopy = std::process::Command::new("objcopy");
        for s in FTRACE_SECTIONS {
            objcopy.arg(format!("--remove-section={s}"));
        }
        let o = objcopy.arg(&out).output().context("running objcopy")?;
        if !o.status.success() {
            bail!("objcopy on {} failed: {}", out.display(), String::from_utf8_lossy(&o.stderr));
        }
        written.push(plain);
    }
    Ok(written)
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

    fn build_root() -> Vec<LockedPackage> {
        ["gcc-14 14.2.0-19", "linux-headers-6.12.117+deb13-amd64 6.12.117-1", "zfs-dkms 2.3.9-0+deb13u1"]
            .iter()
            .map(|nv| {
                let (name, version) = nv.split_once(' ').expect("name version");
                LockedPackage {
                    name: name.into(),
                    version: version.into(),
                    architecture: "amd64".into(),
                    sha256: crate::stage::sha256_bytes(name.as_bytes()),
                    suite: "trixie".into(),
                }
            })
            .collect()
    }

    #[test]
    fn a_recorded_module_is_trusted_until_a_byte_changes() {
        let (d, v, b) = (temp("record"), versions(), build_root());
        module(&d, "spl.ko", &v.kernel_release, "2.3.9-0+deb13u1");
        module(&d, "zfs.ko", &v.kernel_release, "2.3.9-0+deb13u1");
        assert_eq!(check(&d, &v, &b), Err("the cached module has no record".into()));
        std::fs::write(d.join(RECORD), record_text(&d, &v, &b).expect("record")).expect("write");
        assert_eq!(check(&d, &v, &b), Ok(()));
        let other = Versions { zfs_version: "2.3.10-1".into(), ..versions() };
        assert!(check(&d, &other, &b).is_err_and(|e| e.contains("other inputs")));
        // Another compiler is another build root.
        let mut newer = build_root();
        newer[0].version = "14.2.0-20".into();
        assert!(check(&d, &v, &newer).is_err_and(|e| e.contains("other inputs")));
        let mut bytes = std::fs::read(d.join("zfs.ko")).expect("read");
        bytes[1] ^= 1;
        std::fs::write(d.join("zfs.ko"), bytes).expect("tamper");
        assert!(
            check(&d, &v, &b).is_err_and(|e| e.contains("zfs.ko does not match the sha256 recorded")),
            "{:?}",
            check(&d, &v, &b)
        );
        std::fs::remove_dir_all(&d).expect("cleanup");
    }

    #[test]
    fn the_patch_goes_where_dkms_looks_for_it() {
        assert_eq!(upstream("2.3.9-0+deb13u1"), "2.3.9");
        assert_eq!(upstream("1:2.3.9-0+deb13u1"), "2.3.9");
        assert_eq!(upstream("2.3.9"), "2.3.9");
        assert!(dkms_conf().contains(&format!("PATCH[0]=\"{PATCH_NAME}\"")));
        // Every file the patch changes is one of ZFS's, relative to the source's root (DKMS
        // applies it with -p1 in its copy of the source).
        let files: Vec<&str> = PATCH.lines().filter_map(|l| l.strip_prefix("+++ b/")).collect();
        assert_eq!(files, ["module/zcommon/zfs_fletcher.c", "module/zfs/vdev_raidz_math.c", "module/zfs/zfs_chksum.c"]);
        assert!(inputs(&versions(), &build_root()).contains(&patch_line()));
    }

    #[test]
    fn a_module_that_still_benchmarks_at_load_is_refused() {
        // `nm zfs.ko` of Debian's zfs-dkms 2.3.9 (excerpt), and of the patched build.
        let stock = "00000000001d4470 t __pfx_benchmark_raidz_impl\n00000000001d4480 t benchmark_raidz_impl\n\
                     0000000000041e00 t fletcher_4_benchmark_impl.constprop.0\n00000000001f7c80 t chksum_benchit\n";
        assert_eq!(benchmarks_left(stock), ["benchmark_raidz_impl", "fletcher_4_benchmark_impl"]);
        let patched =
            "00000000001f7c80 t chksum_benchit\n0000000000041df0 T fletcher_4_init\n                 U memcpy\n";
        assert!(benchmarks_left(patched).is_empty());
    }

    #[test]
    fn the_cache_keys_a_module_by_its_whole_build_root() {
        let cache = Cache { root: PathBuf::from("/c") };
        let (v, b) = (versions(), build_root());
        let here = cached(&cache, &v, &b);
        assert!(
            here.to_string_lossy().starts_with("/c/zfs/6.12.117+deb13-amd64_2.3.9-0+deb13u1_"),
            "{}",
            here.display()
        );
        let mut reordered = b.clone();
        reordered.reverse();
        assert_eq!(cached(&cache, &v, &reordered), here, "the order of the lock's entries does not matter");
        let mut rebuilt = b.clone();
        rebuilt[0].sha256 = "00".repeat(32);
        assert_ne!(cached(&cache, &v, &rebuilt), here, "another .deb of the same version is another key");
        assert_ne!(cached(&cache, &v, &b[1..]), here);
    }
}
