//! What each replication job last did, kept on the state partition (`replication/`): the newest
//! common snapshot, when the last send ended, what it moved, the last error. `nasctl
//! replication`, the health checks and the metrics read it.

use std::path::PathBuf;

use nasos_layout::state::State;
use serde::{Deserialize, Serialize};

use super::Snap;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobState {
    pub dataset: String,
    pub peer: String,
    pub target: String,
    /// The newest snapshot both boxes hold: what the lag is measured from.
    pub common: Option<Snap>,
    /// Seconds since the epoch.
    #[serde(default)]
    pub first_attempt: u64,
    pub last_attempt: u64,
    pub last_success: u64,
    /// Bytes the last send moved, and every send since the state was made.
    pub last_bytes: u64,
    pub total_bytes: u64,
    /// Sends continued from a resume token.
    pub resumed: u64,
    /// Why the last round failed; none after a round that succeeded.
    pub last_error: Option<String>,
}

impl JobState {
    /// Seconds since the newest common snapshot was taken (none: nothing in common yet).
    pub fn lag(&self, now: u64) -> Option<u64> {
        self.common.as_ref().map(|c| now.saturating_sub(c.created))
    }
}

pub fn path(st: &State, dataset: &str, peer: &str) -> PathBuf {
    st.path(&format!("{}/{}@{peer}.json", nasos_layout::state::REPLICATION, dataset.replace('/', "_")))
}

pub fn read(st: &State, dataset: &str, peer: &str) -> Option<JobState> {
    std::fs::read_to_string(path(st, dataset, peer)).ok().and_then(|t| serde_json::from_str(&t).ok())
}

/// Writes it through a temporary name and a rename (a power cut keeps the old or the new).
pub fn write(st: &State, s: &JobState) -> std::io::Result<()> {
    let p = path(st, &s.dataset, &s.peer);
    if let Some(dir) = p.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = p.with_extension("tmp");
    let text = serde_json::to_vec_pretty(s).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, &p)
}

/// Where `nasctl replication promote` marks a dataset this box no longer takes replicas into.
pub fn promoted_path(st: &State, dataset: &str) -> PathBuf {
    st.path(&format!("{}/promoted/{}", nasos_layout::state::REPLICATION, dataset.replace('/', "_")))
}

/// Where the forced command keeps the pid of the `zfs receive` it runs into `dataset`, so a
/// promote can end a receive in flight (it keeps the dataset busy).
pub fn receiving_path(dataset: &str) -> PathBuf {
    std::path::Path::new(super::sshd::RUN_DIR).join(format!("receiving-{}.pid", dataset.replace('/', "_")))
}

pub fn is_promoted(st: &State, dataset: &str) -> bool {
    promoted_path(st, dataset).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_state_round_trips_and_measures_lag_from_the_common_snapshot() {
        let dir = std::env::temp_dir().join(format!("nasos-repl-state-{}", std::process::id()));
        let st = State::at(&dir);
        assert_eq!(read(&st, "tank/train", "dr"), None);
        let s = JobState {
            dataset: "tank/train".into(),
            peer: "dr".into(),
            target: "tank/train".into(),
            common: Some(Snap { name: "repl-dr-x".into(), guid: 7, created: 1000 }),
            last_bytes: 64 << 20,
            ..JobState::default()
        };
        write(&st, &s).expect("write");
        assert_eq!(read(&st, "tank/train", "dr"), Some(s.clone()));
        assert_eq!(s.lag(1090), Some(90));
        assert_eq!(JobState::default().lag(1090), None);
        assert!(path(&st, "tank/train", "dr").ends_with("replication/tank_train@dr.json"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
