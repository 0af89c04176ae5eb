//! Replication to a peer box: incremental `zfs send | ssh peer | zfs receive`, resumable, raw for
//! encrypted datasets, the newest common snapshot held on both sides. The decisions are pure code
//! here (what to send, what the target prunes, what the forced command accepts, sshd's
//! configuration); `agent` runs the sends on the schedule, `serve` is the forced command the
//! peer's key logs in to, `sshd` starts OpenSSH's server for peers.
//!
//! Each round takes a snapshot `repl-<peer>-<time>` of the dataset and sends everything from the
//! newest snapshot both boxes have up to it (`zfs send -I`, so the policy's snapshots in between
//! arrive too). The target then destroys the policy and replication snapshots the source no
//! longer has: it mirrors the source's retention, never its newest common snapshot.

mod agent;
pub mod ops;
pub mod serve;
mod sshd;
pub mod state;

pub use agent::run;
pub use sshd::{identity_public, sshd};

use serde::{Deserialize, Serialize};

/// The prefix of the snapshots a replication job takes.
pub const SNAP_PREFIX: &str = "repl-";

/// The hold tag on the newest common snapshot, on the source (`nasos-repl-to-PEER`) and on the
/// target (`nasos-repl-from-PEER`): neither side's pruning removes it while it is the base of the
/// next incremental send.
pub fn hold_tag_to(peer: &str) -> String {
    format!("nasos-repl-to-{peer}")
}

pub fn hold_tag_from(peer: &str) -> String {
    format!("nasos-repl-from-{peer}")
}

/// A snapshot as both sides compare them: by GUID, which `zfs send`/`receive` keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snap {
    /// The part after the `@`.
    pub name: String,
    pub guid: u64,
    /// Seconds since the epoch.
    pub created: u64,
}

/// What the target says about a dataset before a send (`serve`'s answer to `state`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetState {
    pub exists: bool,
    /// Made writable by `nasctl replication promote`: it takes no more sends.
    pub promoted: bool,
    /// A send that was cut off left this (`zfs send -t TOKEN` continues it).
    pub resume_token: Option<String>,
    /// Oldest first.
    pub snapshots: Vec<Snap>,
}

/// What a round sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Send {
    /// Continue a send that was cut off, from the target's token.
    Resume(String),
    /// The whole dataset as of this snapshot: the target does not have it yet.
    Full(String),
    /// From the common snapshot (first) to the newest (second), with everything between.
    Incremental(String, String),
    /// The target has the newest snapshot already.
    UpToDate,
}

/// Decides what to send, from the source's snapshots (oldest first, the round's new one last)
/// and the target's state; or why nothing may be.
pub fn plan_send(dataset: &str, peer: &str, source: &[Snap], target: &TargetState) -> Result<Send, String> {
    if target.promoted {
        return Err(format!(
            "{dataset} was promoted on {peer} (a failover): it takes no more replicas; to replicate again, destroy it there or send to another target"
        ));
    }
    if let Some(token) = &target.resume_token {
        return Ok(Send::Resume(token.clone()));
    }
    let newest = source.last().ok_or_else(|| format!("{dataset} has no snapshot to send"))?;
    if !target.exists {
        return Ok(Send::Full(newest.name.clone()));
    }
    let common = source.iter().rev().find(|s| target.snapshots.iter().any(|t| t.guid == s.guid));
    match common {
        None => Err(format!(
            "{dataset} exists on {peer} but shares no snapshot with this box; nasos never overwrites it: destroy it there, or name another target"
        )),
        Some(c) if c.guid == newest.guid => Ok(Send::UpToDate),
        Some(c) => Ok(Send::Incremental(c.name.clone(), newest.name.clone())),
    }
}

/// The newest snapshot both sides hold.
pub fn common<'a>(source: &'a [Snap], target: &[Snap]) -> Option<&'a Snap> {
    source.iter().rev().find(|s| target.iter().any(|t| t.guid == s.guid))
}

/// Which of the target's snapshots go after a send: the policy's and replication's snapshots
/// the source no longer has, never the newest common one (the base of the next send) and never
/// one the target's operator made.
pub fn target_prune(target: &[Snap], source_guids: &[u64]) -> Vec<String> {
    let Some(newest_common) = target.iter().rposition(|t| source_guids.contains(&t.guid)) else {
        return Vec::new();
    };
    target[..newest_common]
        .iter()
        .filter(|t| !source_guids.contains(&t.guid))
        .filter(|t| t.name.starts_with(crate::snapshots::AUTO_PREFIX) || t.name.starts_with(SNAP_PREFIX))
        .map(|t| t.name.clone())
        .collect()
}

/// The source's own replication snapshots for `peer` that go once `keep` is the common one.
pub fn source_prune(source: &[Snap], peer: &str, keep: &str) -> Vec<String> {
    let prefix = format!("{SNAP_PREFIX}{peer}-");
    source.iter().filter(|s| s.name.starts_with(&prefix) && s.name != keep).map(|s| s.name.clone()).collect()
}

/// A request the forced command accepts: one verb and one dataset, nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    State(String),
    Receive(String),
    /// Destroy what the source no longer has (its GUIDs on stdin, as JSON).
    Prune(String),
}

/// Parses `SSH_ORIGINAL_COMMAND` for a peer that may write `allowed`.
pub fn parse_request(command: &str, peer: &str, allowed: &[String]) -> Result<Request, String> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let [verb, dataset] = words.as_slice() else {
        return Err(format!("refused `{command}`: this key may only run `state|receive|prune DATASET`"));
    };
    if !allowed.iter().any(|a| a == dataset) {
        return Err(format!(
            "refused: peer {peer} may not write {dataset} on this box (it may write: {})",
            if allowed.is_empty() { "nothing".to_string() } else { allowed.join(", ") }
        ));
    }
    let dataset = dataset.to_string();
    match *verb {
        "state" => Ok(Request::State(dataset)),
        "receive" => Ok(Request::Receive(dataset)),
        "prune" => Ok(Request::Prune(dataset)),
        other => Err(format!("refused `{other}`: this key may only run state, receive or prune")),
    }
}

#[cfg(test)]
mod tests;
