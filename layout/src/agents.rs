//! The one list of nasos programs: what the image installs and which service of the plan runs
//! each. The plan's service graph names agents from here and the image installs exactly these,
//! so a new agent is added in one place.

use crate::paths;

/// A program nasos builds and installs into the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Program {
    /// The cargo binary name.
    pub binary: &'static str,
    /// Where it goes in the image.
    pub dest: &'static str,
    /// In the root filesystem, or only in the initramfs.
    pub place: Place,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Root,
    Initramfs,
}

/// An agent: a service program that nasinit supervises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agent {
    /// The cargo binary name (`nasos-fabric`).
    pub binary: &'static str,
    /// Where it lives in the image: in [`paths::AGENT_DIR`], named as the binary.
    pub path: &'static str,
    /// The verbs it accepts (`up`, `export`, …).
    pub verbs: &'static [&'static str],
}

impl Agent {
    /// The command line that runs `verb`.
    ///
    /// # Panics
    /// Never for the agents of [`AGENTS`]: asking for a verb an agent does not have is a bug that
    /// the tests of the service graph catch.
    pub fn command(&self, verb: &str) -> Vec<String> {
        debug_assert!(self.verbs.contains(&verb), "{} has no verb {verb}", self.binary);
        vec![self.path.to_string(), verb.to_string()]
    }
}

pub const FABRIC: Agent = Agent { binary: "nasos-fabric", path: "/usr/lib/nasos/nasos-fabric", verbs: &["up"] };
pub const STORAGE: Agent =
    Agent { binary: "nasos-storage", path: "/usr/lib/nasos/nasos-storage", verbs: &["up", "export", "probe"] };
pub const NFS: Agent = Agent { binary: "nasos-nfs", path: "/usr/lib/nasos/nasos-nfs", verbs: &["serve"] };
pub const HEALTH: Agent = Agent { binary: "nasos-health", path: "/usr/lib/nasos/nasos-health", verbs: &["run"] };
pub const SNAPSHOTS: Agent =
    Agent { binary: "nasos-snapshots", path: "/usr/lib/nasos/nasos-snapshots", verbs: &["run"] };
pub const REPLICATION: Agent =
    Agent { binary: "nasos-replication", path: "/usr/lib/nasos/nasos-replication", verbs: &["run", "sshd", "serve"] };
pub const UPGRADE: Agent = Agent { binary: "nasos-upgrade", path: "/usr/lib/nasos/nasos-upgrade", verbs: &["bless"] };

/// nasinit's verbs that the service graph and the agents run: load the plan's modules (the
/// `modules` service), wait for udev to name the bays again (storage, after partitioning a new pool).
pub const NASINIT_LOAD_MODULES: &str = "load-modules";
pub const NASINIT_WAIT_BAYS: &str = "wait-bays";
/// The console service's first step on a box whose recipe has no password: ask for root's on
/// the first boot, keep it, then exec the getty.
pub const NASINIT_CONSOLE: &str = "console";
/// A program that never finishes: what a development recipe's `[debug] hang_services` runs.
pub const NASINIT_DEBUG_HANG: &str = "debug-hang";

/// Every agent.
pub const AGENTS: &[Agent] = &[FABRIC, STORAGE, NFS, SNAPSHOTS, REPLICATION, HEALTH, UPGRADE];

/// The initramfs's init, its own small program.
pub const INITRAMFS_INIT: Program =
    Program { binary: "nasos-initramfs", dest: paths::initramfs::INIT, place: Place::Initramfs };

/// Every program the image carries: nasinit, nasctl, the agents, and the initramfs's init.
pub fn programs() -> Vec<Program> {
    let mut out = vec![
        Program { binary: "nasinit", dest: paths::NASINIT, place: Place::Root },
        Program { binary: "nasctl", dest: paths::NASCTL, place: Place::Root },
    ];
    out.extend(AGENTS.iter().map(|a| Program { binary: a.binary, dest: a.path, place: Place::Root }));
    out.push(INITRAMFS_INIT);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_agent_is_installed_where_its_services_run_it() {
        let programs = programs();
        for a in AGENTS {
            let p = programs.iter().find(|p| p.binary == a.binary).expect("agent installed");
            assert_eq!(p.dest, a.path);
            assert_eq!(a.path, format!("{}/{}", paths::AGENT_DIR, a.binary));
            assert_eq!(p.place, Place::Root);
            for v in a.verbs {
                assert_eq!(a.command(v), vec![a.path.to_string(), v.to_string()]);
            }
        }
    }

    #[test]
    fn programs_have_distinct_names_and_places() {
        let programs = programs();
        for (i, a) in programs.iter().enumerate() {
            for b in &programs[i + 1..] {
                assert_ne!(a.binary, b.binary);
                assert_ne!(a.dest, b.dest);
            }
        }
    }
}
