//! The ESP while the upgrade agent works on it: mounted read-write for as long as the guard
//! lives, synced and unmounted when it goes. Entries are systemd-boot's Type #2 UKIs in
//! `EFI/Linux` (`nasos_layout::entry`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use nasos_layout::entry;

use crate::run;

/// Where the agent mounts the ESP.
pub const MOUNT: &str = "/run/nasos/esp";
/// A UKI being written: not an entry (systemd-boot takes only `*.efi`) until it is renamed.
pub const PARTIAL: &str = "nasos-upgrade.partial";

pub struct Esp {
    pub root: PathBuf,
    mounted: bool,
    /// Held while mounted: bless, apply and status each mount it here, one at a time.
    _lock: Option<nix::fcntl::Flock<std::fs::File>>,
}

impl Esp {
    /// Mounts `device` (vfat) at [`MOUNT`], waiting for whoever has it mounted now.
    pub fn mount(device: &Path) -> anyhow::Result<Esp> {
        std::fs::create_dir_all(MOUNT)?;
        let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open("/run/nasos/esp.lock")?;
        let lock = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| anyhow::anyhow!("locking the ESP: {e}"))?;
        let _ = run("modprobe", &["vfat"]);
        run("mount", &["-t", "vfat", "-o", "rw,nosuid,nodev,noexec", &device.display().to_string(), MOUNT])
            .with_context(|| format!("mounting the ESP {}", device.display()))?;
        Ok(Esp { root: PathBuf::from(MOUNT), mounted: true, _lock: Some(lock) })
    }

    /// An ESP tree in a directory (tests).
    pub fn at(root: impl Into<PathBuf>) -> Esp {
        Esp { root: root.into(), mounted: false, _lock: None }
    }

    pub fn dir(&self) -> PathBuf {
        self.root.join(entry::DIR)
    }

    /// nasos's entries, by file name.
    pub fn entries(&self) -> Vec<(String, entry::Entry)> {
        let mut v: Vec<(String, entry::Entry)> = std::fs::read_dir(self.dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                entry::parse(&name).map(|p| (name, p))
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Free bytes on the ESP.
    pub fn free_bytes(&self) -> u64 {
        nix::sys::statvfs::statvfs(&self.root).map(|s| s.blocks_available() * s.fragment_size()).unwrap_or(0)
    }

    /// Makes everything written so far durable (the ESP's filesystem, data and directories).
    pub fn sync(&self) -> anyhow::Result<()> {
        let d = std::fs::File::open(&self.root)?;
        nix::unistd::syncfs(&d).context("syncing the ESP")?;
        Ok(())
    }
}

impl Drop for Esp {
    fn drop(&mut self) {
        if self.mounted {
            nix::unistd::sync();
            let _ = run("umount", &[MOUNT]);
        }
    }
}
