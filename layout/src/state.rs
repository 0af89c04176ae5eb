//! The state partition: everything that must survive a reboot or an upgrade, and nothing else.
//! nasinit mounts it at [`MOUNT`] before any service starts; what lives where below it is
//! defined here, for nasinit (which writes most of it), the agents and nasctl (which read it).
//!
//! | path | what | factory reset |
//! |---|---|---|
//! | `identity/machine-id` | this box's machine id, made on first boot | cleared (a new identity) |
//! | `identity/hostnqn`, `identity/hostid` | NVMe host NQN and host id | cleared |
//! | `credentials/root.hash` | root's password hash, set at the first-boot prompt | cleared (asks again) |
//! | `nfs/` | nfsd's state (`/var/lib/nfs`: NFSv4 client tracking for reclaim after a reboot) | cleared |
//! | `boots/N/` | one directory per boot: `log/SERVICE.log`, `end` (how it ended) | cleared |
//! | `failed-boots` | boots in a row that missed their deadline | cleared |
//! | `identity/replication-ed25519` | the box's replication key (its `.pub` goes into peers' recipes) | cleared (a new key) |
//! | `replication/` | each replication job's last result; datasets promoted here | cleared |
//! | `upgrade/history` | one JSON line per upgrade step: installed, booted, blessed, rolled back, refused | cleared |
//!
//! The ZFS pools are not here and a factory reset never touches them.

use std::path::PathBuf;

/// Where nasinit mounts the state partition.
pub const MOUNT: &str = "/var/lib/nasos";
/// Its filesystem, made on first boot when the partition is blank.
pub const FS_TYPE: &str = "ext4";
/// Its filesystem label (and GPT partition name, see [`crate::slot::LABEL_DATA`]).
pub const FS_LABEL: &str = crate::slot::LABEL_DATA;

pub const MACHINE_ID: &str = "identity/machine-id";
pub const HOSTNQN: &str = "identity/hostnqn";
pub const HOSTID: &str = "identity/hostid";
pub const ROOT_PASSWORD_HASH: &str = "credentials/root.hash";
pub const NFS: &str = "nfs";
pub const BOOTS: &str = "boots";
pub const FAILED_BOOTS: &str = "failed-boots";
/// The upgrade history: one JSON object per line, oldest first.
pub const UPGRADE_HISTORY: &str = "upgrade/history";
/// How many history lines are kept.
pub const UPGRADE_HISTORY_KEPT: usize = 200;
/// Health alerts (transitions between ok, warning and critical), one JSON object per line.
pub const HEALTH_ALERTS: &str = "health/alerts";
/// How many alerts the history keeps.
pub const HEALTH_ALERTS_KEPT: usize = 500;
/// Boots in a row that ended in a watchdog reset for a fatal condition (the reboot-loop guard).
pub const FATAL_RESETS: &str = "fatal-resets";
/// The box's replication key (OpenSSH, ed25519), made on first boot unless a development image
/// carries one; `.pub` beside it.
pub const REPLICATION_KEY: &str = "identity/replication-ed25519";
/// Each replication job's last result (`DATASET@PEER.json`, `/` as `_`), and `promoted/`.
pub const REPLICATION: &str = "replication";
/// The box's Kerberos keytab (its `nfs/` service key), joined once with `nasctl kerberos join`.
/// A factory reset forgets it, like every credential.
pub const KEYTAB: &str = "credentials/krb5.keytab";
/// Written by `nasctl factory-reset`; the next boot formats the partition afresh.
pub const FACTORY_RESET: &str = "factory-reset";
/// How many earlier boots keep their logs.
pub const BOOTS_KEPT: usize = 10;

/// How a boot ended, as the next boot finds it in `boots/N/end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootEnd {
    /// Still running, or it never got to say: a power loss, a reset, a kernel panic.
    Unclean,
    Poweroff,
    Reboot,
    Halt,
    /// The hardware watchdog reset the box (the next boot sees the watchdog's boot status).
    Watchdog,
    /// The boot missed its deadline and nasinit rebooted it.
    Deadline,
    /// The kernel panicked (its last words were found in pstore; kept in `boots/N/pstore/`).
    Panic,
    /// Health reported a fatal condition that outlasted its grace, and nasinit stopped feeding
    /// the watchdog (what it was is in `boots/N/fatal`).
    Fatal,
}

impl BootEnd {
    pub const ALL: [BootEnd; 8] = [
        BootEnd::Unclean,
        BootEnd::Poweroff,
        BootEnd::Reboot,
        BootEnd::Halt,
        BootEnd::Watchdog,
        BootEnd::Deadline,
        BootEnd::Panic,
        BootEnd::Fatal,
    ];
}

impl BootEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            BootEnd::Unclean => "unclean",
            BootEnd::Poweroff => "poweroff",
            BootEnd::Reboot => "reboot",
            BootEnd::Halt => "halt",
            BootEnd::Watchdog => "watchdog",
            BootEnd::Deadline => "deadline",
            BootEnd::Panic => "panic",
            BootEnd::Fatal => "fatal",
        }
    }

    pub fn parse(s: &str) -> Option<BootEnd> {
        BootEnd::ALL.into_iter().find(|e| e.as_str() == s.trim())
    }

    /// What an operator reads.
    pub fn describe(self) -> &'static str {
        match self {
            BootEnd::Unclean => "unclean (power loss, reset or kernel panic)",
            BootEnd::Poweroff => "clean poweroff",
            BootEnd::Reboot => "clean reboot",
            BootEnd::Halt => "clean halt",
            BootEnd::Watchdog => "hardware watchdog reset",
            BootEnd::Deadline => "missed its boot deadline, rebooted by nasinit",
            BootEnd::Panic => "kernel panic (its log is kept with that boot's record)",
            BootEnd::Fatal => "reset by the watchdog for a fatal condition health reported",
        }
    }
}

/// The state directory's parts, under a root (`/var/lib/nasos` on the box, a fixture in tests).
#[derive(Debug, Clone)]
pub struct State {
    pub root: PathBuf,
}

impl State {
    pub fn at(root: impl Into<PathBuf>) -> State {
        State { root: root.into() }
    }

    /// The mounted state partition.
    pub fn mounted() -> State {
        State::at(MOUNT)
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub fn boot_dir(&self, seq: u64) -> PathBuf {
        self.root.join(BOOTS).join(seq.to_string())
    }

    /// The boots recorded, oldest first.
    pub fn boots(&self) -> Vec<u64> {
        let mut seqs: Vec<u64> = std::fs::read_dir(self.root.join(BOOTS))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        seqs.sort_unstable();
        seqs
    }

    /// The boot `back` boots before the newest (0: this one, 1: the previous one).
    pub fn boot_back(&self, back: usize) -> Option<u64> {
        let b = self.boots();
        b.len().checked_sub(back + 1).map(|i| b[i])
    }

    /// A service's log file in boot `seq`.
    pub fn log_file(&self, seq: u64, service: &str) -> PathBuf {
        self.boot_dir(seq).join("log").join(format!("{service}.log"))
    }

    /// How boot `seq` ended; `None` when it left no record.
    pub fn boot_end(&self, seq: u64) -> Option<BootEnd> {
        BootEnd::parse(&std::fs::read_to_string(self.boot_dir(seq).join("end")).ok()?)
    }

    pub fn end_file(&self, seq: u64) -> PathBuf {
        self.boot_dir(seq).join("end")
    }

    /// Why a boot that ended [`BootEnd::Fatal`] was reset: the condition, in words.
    pub fn fatal_file(&self, seq: u64) -> PathBuf {
        self.boot_dir(seq).join("fatal")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boots_are_listed_in_order_and_counted_back() {
        let t = std::env::temp_dir().join(format!("nasos-layout-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        let s = State::at(&t);
        for seq in [9, 10, 8] {
            std::fs::create_dir_all(s.boot_dir(seq)).expect("fixture");
        }
        std::fs::write(s.end_file(9), "reboot\n").expect("fixture");
        assert_eq!(s.boots(), vec![8, 9, 10]);
        assert_eq!(s.boot_back(0), Some(10));
        assert_eq!(s.boot_back(1), Some(9));
        assert_eq!(s.boot_back(3), None);
        assert_eq!(s.boot_end(9), Some(BootEnd::Reboot));
        assert_eq!(s.boot_end(10), None);
        assert_eq!(s.log_file(9, "storage"), t.join("boots/9/log/storage.log"));
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn boot_ends_round_trip() {
        for e in BootEnd::ALL {
            assert_eq!(BootEnd::parse(&format!("{}\n", e.as_str())), Some(e));
        }
        assert_eq!(BootEnd::parse("exploded"), None);
    }
}
