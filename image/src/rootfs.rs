//! The root filesystem: Debian trixie (main + contrib, with its updates and security fixes)
//! assembled by mmdebstrap with exactly the plan's packages, as a tarball. Downloaded .debs are
//! kept in a content-addressed cache and fed back to apt, so a rebuild downloads nothing; what was
//! installed is compared with the lock. The ZFS module's build root is made the same way.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::archive::{Origins, SOURCES, SUITE};
use crate::lock::{Lock, LockedPackage};
use crate::stage::sha256_file;

/// Where cached work lives: `$NASOS_CACHE`, else `$XDG_CACHE_HOME/nasos`, else `~/.cache/nasos`.
pub struct Cache {
    pub root: PathBuf,
}

impl Cache {
    pub fn open() -> anyhow::Result<Cache> {
        let root = std::env::var_os("NASOS_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|x| PathBuf::from(x).join("nasos")))
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/nasos")))
            .context("no cache directory: set NASOS_CACHE")?;
        for sub in ["debs", "rootfs", "zfs"] {
            std::fs::create_dir_all(root.join(sub))
                .with_context(|| format!("creating {}", root.join(sub).display()))?;
        }
        Ok(Cache { root })
    }

    /// Holds the cache's lock on `what` until dropped. Two builds sharing a cache (two test
    /// lanes, an engineer's two terminals) then make an expensive output once: the second waits,
    /// then finds it cached, instead of compiling ZFS twice on the same cores. The lock is
    /// advisory and dies with its process, so a killed build never leaves the cache locked.
    pub fn lock(&self, what: &str) -> anyhow::Result<nix::fcntl::Flock<std::fs::File>> {
        use nix::fcntl::{Flock, FlockArg};
        let path = self.root.join(format!("{what}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(held) => Ok(held),
            Err((file, nix::errno::Errno::EWOULDBLOCK)) => {
                eprintln!("nasos: waiting for another build sharing {} to finish its {what}", self.root.display());
                Flock::lock(file, FlockArg::LockExclusive)
                    .map_err(|(_, e)| e)
                    .with_context(|| format!("locking {}", path.display()))
            }
            Err((_, e)) => Err(e).with_context(|| format!("locking {}", path.display())),
        }
    }

    /// The .deb with this sha256, if cached.
    pub fn deb(&self, sha256: &str) -> PathBuf {
        self.root.join("debs").join(format!("{sha256}.deb"))
    }
}

/// Runs mmdebstrap into `out` (a tarball) and returns what it installed, as a lock.
pub fn build(cache: &Cache, packages: &[String], lock: Option<&Lock>, epoch: u64, out: &Path) -> anyhow::Result<Lock> {
    let root = Bootstrap {
        variant: "essential",
        include: packages,
        // Documentation, manuals and translations are not needed on an appliance; copyrights stay.
        slim: true,
        essential: &[],
        customize: &[],
        what: "mmdebstrap",
    };
    let seed = lock.map_or(&[][..], |l| &l.packages[..]);
    let packages = bootstrap(cache, &root, seed, epoch, out)?;
    Ok(Lock { sources: SOURCES.iter().map(|s| s.to_string()).collect(), epoch, packages, build_packages: Vec::new() })
}

/// One mmdebstrap run: a Debian trixie tree of a variant with more packages, its .debs kept in
/// the cache and what it installed returned, each with its .deb's sha256 and archive.
pub struct Bootstrap<'a> {
    /// mmdebstrap's variant: `essential` for an image, `buildd` for a build root.
    pub variant: &'a str,
    pub include: &'a [String],
    /// Leave out documentation, manuals and translations.
    pub slim: bool,
    /// Hooks run once the essential packages are installed, before the rest are unpacked
    /// (mmdebstrap's `--essential-hook`, `$1` the tree).
    pub essential: &'a [String],
    /// Hooks run once the packages are installed (mmdebstrap's `--customize-hook`, `$1` the tree).
    pub customize: &'a [String],
    /// What the progress line calls it.
    pub what: &'a str,
}

/// Runs `b` into `out` (a tarball, or /dev/null for a tree only its hooks need), offering apt the
/// cached .debs of `seed` so a rebuild downloads nothing; returns what was installed, sorted.
pub fn bootstrap(
    cache: &Cache,
    b: &Bootstrap,
    seed: &[LockedPackage],
    epoch: u64,
    out: &Path,
) -> anyhow::Result<Vec<LockedPackage>> {
    let work = if out == Path::new("/dev/null") {
        cache.root.join(format!("bootstrap.{}.work", std::process::id()))
    } else {
        out.with_extension("work")
    };
    let _ = std::fs::remove_dir_all(&work);
    let seed_dir = work.join("seed");
    let archives = work.join("archives");
    std::fs::create_dir_all(&seed_dir)?;
    std::fs::create_dir_all(&archives)?;
    // Offer apt every cached .deb of the lock under the name apt expects; apt checks each against
    // the repository's hashes before it uses it.
    for p in seed {
        let cached = cache.deb(&p.sha256);
        if cached.exists() {
            std::fs::hard_link(&cached, seed_dir.join(p.deb_name()))
                .or_else(|_| std::fs::copy(&cached, seed_dir.join(p.deb_name())).map(|_| ()))?;
        }
    }
    // What the hooks report comes out through mmdebstrap's `sync-out`: in its unshare mode (a
    // build as a normal user) the hooks run as the namespace's users, which may not write here.
    let out_dir = work.join("out");
    std::fs::create_dir_all(&out_dir)?;
    let installed = out_dir.join("installed.tsv");
    let lists = out_dir.join("lists");
    let q = |p: &Path| shell_quote(&p.display().to_string());
    let mut cmd = Command::new("mmdebstrap");
    cmd.arg(format!("--variant={}", b.variant))
        .arg(format!("--include={}", b.include.join(",")))
        .arg("--components=main,contrib")
        .arg("--aptopt=APT::Install-Recommends \"false\"")
        .arg("--aptopt=Acquire::Retries \"3\"");
    if b.slim {
        cmd.args(
            [
                "/usr/share/doc/*",
                "/usr/share/man/*",
                "/usr/share/info/*",
                "/usr/share/locale/*",
                "/usr/share/lintian/*",
            ]
            .map(|p| format!("--dpkgopt=path-exclude={p}")),
        )
        .arg("--dpkgopt=path-include=/usr/share/doc/*/copyright");
    }
    cmd.arg("--skip=download/empty")
        .arg("--skip=essential/unlink")
        .arg("--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives/")
        .arg(format!("--setup-hook=sync-in {} /var/cache/apt/archives/", q(&seed_dir)))
        // sync-in gives the directory the owner of `seed`: the user who builds, in mmdebstrap's
        // unshare mode. The tree's is root's, whoever builds it.
        .arg("--setup-hook=chown 0:0 \"$1\"/var/cache/apt/archives")
        .args(b.essential.iter().map(|h| format!("--essential-hook={h}")))
        .args(b.customize.iter().map(|h| format!("--customize-hook={h}")))
        .arg(format!("--customize-hook=sync-out /var/cache/apt/archives {}", q(&archives)))
        // The installed list, and apt's indexes, which say which archive each .deb is from (read
        // below, by sha256).
        .arg(
            "--customize-hook=mkdir -p \"$1\"/nasos-out/lists && \
             chroot \"$1\" dpkg-query -W -f='${Package}\\t${Version}\\t${Architecture}\\n' > \"$1\"/nasos-out/installed.tsv && \
             cp \"$1\"/var/lib/apt/lists/*_Packages \"$1\"/nasos-out/lists/",
        )
        .arg(format!("--customize-hook=sync-out /nasos-out {}", q(&out_dir)))
        .arg(
            "--customize-hook=rm -rf \"$1\"/nasos-out \"$1\"/var/cache/apt/archives/*.deb \"$1\"/var/lib/apt/lists/*_Packages",
        )
        .arg(SUITE)
        .arg(out)
        .args(SOURCES)
        .env("SOURCE_DATE_EPOCH", epoch.to_string())
        // A kernel's postinst must not build an initramfs: nasos makes its own.
        .env("INITRD", "No");
    crate::progress::run_tool(&mut cmd, b.what)?;
    // Move every .deb into the content-addressed cache and index it by apt's file name.
    let mut by_name: HashMap<String, String> = HashMap::new();
    for e in std::fs::read_dir(&archives)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".deb") {
            continue;
        }
        let sha = sha256_file(&e.path())?;
        let dest = cache.deb(&sha);
        if !dest.exists() {
            std::fs::rename(e.path(), &dest).or_else(|_| std::fs::copy(e.path(), &dest).map(|_| ()))?;
        }
        by_name.insert(name, sha);
    }
    let origins = Origins::read_lists(&lists, SOURCES)?;
    let listing = std::fs::read_to_string(&installed).context("reading the installed package list")?;
    let mut packages_out = Vec::new();
    for line in listing.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let [name, version, arch] = f[..] else { continue };
        let mut p = LockedPackage {
            name: name.into(),
            version: version.into(),
            architecture: arch.into(),
            sha256: String::new(),
            suite: String::new(),
        };
        p.sha256 = by_name
            .get(&p.deb_name())
            .cloned()
            .with_context(|| format!("{} was installed but its .deb was not kept", p.deb_name()))?;
        p.suite = origins
            .suite(&p.sha256)
            .with_context(|| format!("{}: no archive index lists a .deb with sha256 {}", p.deb_name(), p.sha256))?
            .to_string();
        packages_out.push(p);
    }
    let _ = crate::userns::remove_tree(&work);
    packages_out.sort();
    Ok(packages_out)
}

/// Single-quotes a path for the shell snippets mmdebstrap's hooks are.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}
