//! The upgrade history on the state partition: one JSON object per line, oldest first, bounded.
//! It survives reboots and upgrades; a factory reset clears it.

use nasos_layout::state::{self, State};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Seconds since the epoch.
    pub at: u64,
    /// installed, refused, failed, booted, blessed, rolled-back.
    pub event: String,
    pub version: String,
    /// The version that ran when it happened.
    pub from: String,
    /// The slot written or booted ("a", "b"), when one was.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub slot: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

pub use crate::unix_now as now;

/// Appends an event (fsynced), keeping the newest [`state::UPGRADE_HISTORY_KEPT`].
pub fn record(st: &State, e: &Event) -> std::io::Result<()> {
    crate::jsonl::append(&st.path(state::UPGRADE_HISTORY), std::slice::from_ref(e), state::UPGRADE_HISTORY_KEPT)
}

/// Every event kept, oldest first (lines that do not parse are skipped).
pub fn read(st: &State) -> Vec<Event> {
    crate::jsonl::read(&st.path(state::UPGRADE_HISTORY))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_kept_in_order_and_bounded() {
        let t = std::env::temp_dir().join(format!("nasos-history-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        let st = State::at(&t);
        for i in 0..(state::UPGRADE_HISTORY_KEPT + 5) {
            let e = Event {
                at: i as u64,
                event: "installed".into(),
                version: format!("0.{i}.0"),
                from: "0.1.0".into(),
                slot: "b".into(),
                detail: String::new(),
            };
            record(&st, &e).expect("record");
        }
        let all = read(&st);
        assert_eq!(all.len(), state::UPGRADE_HISTORY_KEPT);
        assert_eq!(all[0].at, 5);
        assert_eq!(all.last().map(|e| e.at), Some(state::UPGRADE_HISTORY_KEPT as u64 + 4));
        let _ = std::fs::remove_dir_all(&t);
    }
}
