//! Health: checks with stable ids and severities over what sysfs, the NVMe SMART logs, ZFS,
//! nfsd and nasinit say; alerts on each transition (console, state partition, syslog); the
//! report `nasctl health` shows; Prometheus metrics. Reading (`observe`, `smart`) is apart from
//! deciding (`checks`, `alerts`), so host tests reach the decisions with made-up observations.

mod agent;
pub mod alerts;
pub mod checks;
pub mod metrics;
pub mod observe;
pub mod smart;
pub mod syslog;

pub use agent::run;

use nasos_layout::state::{self, State};

/// The alert history kept on the state partition, oldest first.
pub fn history(st: &State) -> Vec<alerts::Alert> {
    crate::jsonl::read(&st.path(state::HEALTH_ALERTS))
}

/// The health agent's latest report, if it has written one this boot.
pub fn report() -> Option<alerts::Report> {
    let text = std::fs::read_to_string(nasos_layout::paths::HEALTH_REPORT).ok()?;
    serde_json::from_str(&text).ok()
}
