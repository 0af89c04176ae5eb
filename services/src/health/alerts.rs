//! Alerts: the transitions between ok, warning and critical of each check, and the report
//! nasctl reads. Transitions are decided here, purely; the agent sends them to the console,
//! the history on the state partition and remote syslog.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::checks::{Check, Severity};
use super::observe::Observation;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alert {
    /// Seconds since the epoch.
    pub at: u64,
    pub id: String,
    pub from: Severity,
    pub to: Severity,
    pub message: String,
}

impl Alert {
    /// One line for the console and syslog: `CRITICAL BAY07: drive missing …` or
    /// `ok again: …`.
    pub fn line(&self) -> String {
        match self.to {
            Severity::Ok => format!("ok again (was {}): {}", self.from, self.message),
            s => format!("{} {}", s.to_string().to_uppercase(), self.message),
        }
    }
}

/// The alerts between the previous round's checks and this round's: a check that changed
/// severity, a new check that is not ok, and a check that was not ok and is gone (its subject
/// is no longer measured, e.g. the SMART log of a pulled drive).
pub fn transitions(before: &BTreeMap<String, Check>, now: &[Check], at: u64) -> Vec<Alert> {
    let mut out = Vec::new();
    for c in now {
        let from = before.get(&c.id).map_or(Severity::Ok, |b| b.severity);
        if from != c.severity {
            out.push(Alert { at, id: c.id.clone(), from, to: c.severity, message: c.message.clone() });
        }
    }
    for (id, b) in before {
        if b.severity != Severity::Ok && !now.iter().any(|c| &c.id == id) {
            out.push(Alert {
                at,
                id: id.clone(),
                from: b.severity,
                to: Severity::Ok,
                message: format!("{} (no longer measured)", b.message),
            });
        }
    }
    out
}

/// What the agent publishes after each round ([`nasos_layout::paths::HEALTH_REPORT`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Seconds since the epoch.
    pub at: u64,
    /// The worst severity of any check.
    pub overall: Severity,
    /// Every check that is not ok, worst first, then the count of those that are.
    pub checks: Vec<Check>,
    pub ok: usize,
    /// What could not be checked on this machine, said once.
    pub unchecked: Vec<String>,
    pub observation: Observation,
}

impl Report {
    pub fn new(at: u64, checks: &[Check], unchecked: Vec<String>, observation: Observation) -> Report {
        let mut bad: Vec<Check> = checks.iter().filter(|c| c.severity != Severity::Ok).cloned().collect();
        bad.sort_by(|a, b| b.severity.cmp(&a.severity).then_with(|| a.id.cmp(&b.id)));
        Report {
            at,
            overall: checks.iter().map(|c| c.severity).max().unwrap_or(Severity::Ok),
            ok: checks.len() - bad.len(),
            checks: bad,
            unchecked,
            observation,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(id: &str, severity: Severity, message: &str) -> Check {
        Check { id: id.into(), severity, message: message.into() }
    }

    #[test]
    fn only_changes_are_alerts_and_a_vanished_problem_clears() {
        let mut before = BTreeMap::new();
        for c in [
            check("bay.BAY07.present", Severity::Ok, "BAY07: drive present"),
            check("bay.BAY07.critical_warning", Severity::Critical, "BAY07: NVMe critical warning: x"),
            check("pool.tank.state", Severity::Ok, "pool tank: ONLINE"),
        ] {
            before.insert(c.id.clone(), c);
        }
        let now = vec![
            check("bay.BAY07.present", Severity::Critical, "BAY07: drive missing (a member of pool tank)"),
            check("pool.tank.state", Severity::Ok, "pool tank: ONLINE"),
            check("pool.tank.capacity", Severity::Warning, "pool tank: 85% full"),
        ];
        let a = transitions(&before, &now, 7);
        let lines: Vec<String> = a.iter().map(Alert::line).collect();
        assert_eq!(
            lines,
            vec![
                "CRITICAL BAY07: drive missing (a member of pool tank)",
                "WARNING pool tank: 85% full",
                "ok again (was critical): BAY07: NVMe critical warning: x (no longer measured)",
            ]
        );
        assert!(a.iter().all(|x| x.at == 7));
        let same: BTreeMap<String, Check> = now.iter().map(|c| (c.id.clone(), c.clone())).collect();
        assert!(transitions(&same, &now, 8).is_empty(), "nothing changed");
    }
}
