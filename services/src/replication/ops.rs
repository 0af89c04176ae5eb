//! What `nasctl replication` shows and does: each job's last result and lag, each replica this
//! box holds for a peer, the box's key, and promotion of a replica for a failover.

use anyhow::{Context, bail};
use nasos_layout::state::State;
use serde::Serialize;

use super::state::{self, JobState};
use crate::{plan, probe, run, unix_now};

/// One job this box sends.
#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    pub dataset: String,
    pub peer: String,
    pub target: String,
    pub every_minutes: u32,
    /// Seconds since the newest common snapshot was taken; none before the first send.
    pub lag_seconds: Option<u64>,
    pub lag_alert_seconds: u64,
    pub state: JobState,
}

/// One replica a peer sends here.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaView {
    pub dataset: String,
    pub from: String,
    pub exists: bool,
    pub promoted: bool,
    /// The newest snapshot received, and its age in seconds.
    pub newest: Option<String>,
    pub age_seconds: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct View {
    pub jobs: Vec<JobView>,
    pub replicas: Vec<ReplicaView>,
}

pub fn view() -> anyhow::Result<View> {
    let plan = plan()?;
    let st = State::mounted();
    let now = unix_now();
    let jobs = plan
        .replication
        .jobs
        .iter()
        .map(|j| {
            let s = state::read(&st, &j.dataset, &j.peer).unwrap_or_default();
            JobView {
                dataset: j.dataset.clone(),
                peer: j.peer.clone(),
                target: j.target.clone(),
                every_minutes: j.every_minutes,
                lag_seconds: s.lag(now),
                lag_alert_seconds: j.lag_alert_seconds,
                state: s,
            }
        })
        .collect();
    let mut replicas = Vec::new();
    for p in &plan.replication.peers {
        for ds in &p.receive {
            let exists = probe("zfs", &["list", "-H", "-o", "name", ds]);
            let newest = if exists { nasos_zfs::snapshot::list(&[ds.as_str()], false)?.pop() } else { None };
            replicas.push(ReplicaView {
                dataset: ds.clone(),
                from: p.name.clone(),
                exists,
                promoted: state::is_promoted(&st, ds),
                age_seconds: newest.as_ref().map(|s| now.saturating_sub(s.creation)),
                newest: newest.map(|s| s.short),
            });
        }
    }
    Ok(View { jobs, replicas })
}

/// `nasctl replication promote DATASET`: the replica becomes writable and takes no more sends
/// (a send would otherwise undo what clients write after the failover).
pub fn promote(dataset: &str) -> anyhow::Result<String> {
    let plan = plan()?;
    let Some(peer) = plan.replication.peers.iter().find(|p| p.receive.iter().any(|r| r == dataset)) else {
        let all: Vec<&str> = plan.replication.peers.iter().flat_map(|p| p.receive.iter().map(String::as_str)).collect();
        bail!(
            "{dataset} is not a replica on this box (replicas: {})",
            if all.is_empty() { "none".to_string() } else { all.join(", ") }
        );
    };
    if !probe("zfs", &["list", "-H", "-o", "name", dataset]) {
        bail!("{dataset} has not arrived from {} yet: there is nothing to promote", peer.name);
    }
    let st = State::mounted();
    let mark = state::promoted_path(&st, dataset);
    if let Some(dir) = mark.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    }
    // Marked first: from here on the forced command refuses sends into it.
    std::fs::write(&mark, format!("promoted at {}\n", unix_now()))
        .with_context(|| format!("writing {}", mark.display()))?;
    // A receive in flight keeps the dataset busy (and would finish a send the failover must not
    // take): it is ended; the mark above refuses the next.
    end_receive_in_flight(dataset)?;
    // A send cut off halfway leaves partial state that would keep the dataset busy.
    let token = run("zfs", &["get", "-H", "-o", "value", "receive_resume_token", dataset])?;
    if !matches!(token.trim(), "" | "-") {
        // The kernel may still be tearing down a receive that just ended.
        let mut tries = 0;
        loop {
            match run("zfs", &["receive", "-A", dataset]) {
                Ok(_) => break,
                Err(e) if tries < 20 && format!("{e:#}").contains("busy") => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(500));
                }
                Err(e) => return Err(e).context("discarding the interrupted receive"),
            }
        }
    }
    run("zfs", &["set", "readonly=off", dataset])?;
    Ok(format!("{dataset} is writable now and takes no more replicas from {}; clients may write to it", peer.name))
}

/// Ends the `zfs receive` the forced command runs into `dataset`, if one runs, and waits for it
/// to go. The pid is the forced command's record; it is signalled only while its command line
/// is still a receive into this dataset (a pid may be reused).
fn end_receive_in_flight(dataset: &str) -> anyhow::Result<()> {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let pidfile = state::receiving_path(dataset);
    let Some(pid) = std::fs::read_to_string(&pidfile).ok().and_then(|t| t.trim().parse::<i32>().ok()) else {
        return Ok(());
    };
    let receiving = || {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
            let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
            args.first().is_some_and(|a| a.ends_with(b"zfs"))
                && args.contains(&b"receive".as_slice())
                && args.contains(&dataset.as_bytes())
        })
    };
    if !receiving() {
        return Ok(());
    }
    crate::say(format!("promote: ending the receive into {dataset} in flight (pid {pid})"));
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while receiving() {
        if std::time::Instant::now() > deadline {
            bail!("the receive into {dataset} in flight (pid {pid}) did not end within 30 s; try the promote again");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    Ok(())
}
