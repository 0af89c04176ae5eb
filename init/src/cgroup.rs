//! One cgroup (v2) per service, so that stopping a service stops everything it started, however
//! it forked. Without a usable cgroup2 hierarchy services fall back to process groups, which a
//! daemon calling setsid(2) escapes; nasinit says so when it starts.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The directory under which nasinit creates one cgroup per service.
#[derive(Debug, Clone)]
pub struct CgroupRoot {
    dir: PathBuf,
}

impl CgroupRoot {
    /// For PID 1: the cgroup2 hierarchy nasinit mounted itself.
    pub fn at(dir: &Path) -> io::Result<Self> {
        let root = CgroupRoot { dir: dir.join("nasos") };
        fs::create_dir_all(&root.dir)?;
        Ok(root)
    }

    /// For a supervisor that is not PID 1: a private subtree below the cgroup it runs in.
    pub fn beside_self() -> io::Result<Self> {
        let mount = cgroup2_mount()?;
        let own = fs::read_to_string("/proc/self/cgroup")?;
        let rel = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .ok_or_else(|| io::Error::other("no cgroup2 entry in /proc/self/cgroup"))?;
        let dir = mount.join(rel.trim_start_matches('/')).join(format!("nasinit-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        Ok(CgroupRoot { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates (or reuses) the cgroup of a service and opens its `cgroup.procs` for the child to
    /// join before it execs: writing "0" there moves the writer, with no allocation after fork.
    pub fn prepare(&self, service: &str) -> io::Result<(PathBuf, OwnedFd)> {
        let dir = self.dir.join(service);
        fs::create_dir_all(&dir)?;
        let procs = fs::OpenOptions::new().write(true).open(dir.join("cgroup.procs"))?;
        Ok((dir, procs.into()))
    }

    /// Removes the subtree (empty cgroups only); used when a test-mode supervisor exits.
    pub fn remove(&self) {
        if let Ok(entries) = fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                if e.path().is_dir() {
                    let _ = fs::remove_dir(e.path());
                }
            }
        }
        let _ = fs::remove_dir(&self.dir);
    }
}

/// Pids in a cgroup.
pub fn pids(cgroup: &Path) -> Vec<Pid> {
    fs::read_to_string(cgroup.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse::<i32>().ok()).map(Pid::from_raw).collect())
        .unwrap_or_default()
}

/// Sets the niceness of every thread in a cgroup (niceness is per thread on Linux, and a
/// process's threads and children inherit their creator's).
pub fn renice_all(cgroup: &Path, nice: i8) {
    let threads = fs::read_to_string(cgroup.join("cgroup.threads")).unwrap_or_default();
    for tid in threads.lines().filter_map(|l| l.trim().parse::<nix::libc::id_t>().ok()) {
        // SAFETY: setpriority takes plain integers and touches no memory of ours.
        unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, tid, nice.into()) };
    }
}

/// Kills every process in a cgroup: `cgroup.kill` (Linux ≥ 5.14), else SIGKILL to each member.
pub fn kill_all(cgroup: &Path) {
    if fs::write(cgroup.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    for pid in pids(cgroup) {
        let _ = kill(pid, Signal::SIGKILL);
    }
}

/// Signals every process in a cgroup.
pub fn signal_all(cgroup: &Path, sig: Signal) {
    for pid in pids(cgroup) {
        let _ = kill(pid, sig);
    }
}

fn cgroup2_mount() -> io::Result<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    for line in info.lines() {
        // "... mountpoint opts ... - fstype source superopts"
        let Some((left, right)) = line.split_once(" - ") else { continue };
        if right.split_whitespace().next() == Some("cgroup2")
            && let Some(mp) = left.split_whitespace().nth(4)
        {
            return Ok(PathBuf::from(mp));
        }
    }
    Err(io::Error::new(io::ErrorKind::NotFound, "no cgroup2 hierarchy is mounted"))
}
