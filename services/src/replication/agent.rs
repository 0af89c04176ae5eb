//! The sender: each job on its schedule — snapshot, ask the peer what it has, send (resume,
//! full or incremental) through one pipe from `zfs send` to `ssh peer receive`, counting and
//! limiting the bytes; then move the holds to the new common snapshot on both sides and prune
//! what the source no longer has on the target. A failed round is recorded and retried; the loop
//! never ends.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nasos_board::plan::{PeerPlan, ReplicationJobPlan};
use nasos_layout::state::State;
use nasos_zfs::snapshot as zsnap;

use super::sshd::{RUN_DIR, identity};
use super::state::{self, JobState};
use super::{SNAP_PREFIX, Send, Snap, TargetState, hold_tag_to, plan_send, source_prune};
use crate::signals::{Sig, Signals};
use crate::{plan, run as tool, say, unix_now};

/// Rounds start this long after the minute: after the snapshot policies' rounds.
const AFTER_MINUTE: u64 = 8;

/// A failed round is tried again this long after it failed, doubling each time (a link that
/// blinked should not cost a whole interval of lag), never later than its next scheduled round.
const FIRST_RETRY_SECONDS: u64 = 10;

/// When a job's next round is due: its next interval, or sooner after failures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Schedule {
    /// The start of its last round, seconds since the epoch.
    last: Option<u64>,
    /// Failed rounds in a row.
    failures: u32,
}

impl Schedule {
    /// Whether a round is due at `now` for a job run every `period` seconds.
    fn due(&self, now: u64, period: u64) -> bool {
        match self.last {
            None => true,
            Some(t) => t / period != now / period || self.retry_at().is_some_and(|r| now >= r),
        }
    }

    /// When a failed round is tried again (none after a success).
    fn retry_at(&self) -> Option<u64> {
        let t = self.last?;
        (self.failures > 0).then(|| t + FIRST_RETRY_SECONDS.saturating_mul(1 << (self.failures - 1).min(10)))
    }

    fn ran(&mut self, at: u64, ok: bool) {
        self.last = Some(at);
        self.failures = if ok { 0 } else { self.failures.saturating_add(1) };
    }
}

pub fn run() -> anyhow::Result<()> {
    // SIGUSR1 (`nasctl replication send`) starts a round of every job at once; taken first,
    // before anything starts a thread.
    let signals = Signals::take(&[Sig::SIGUSR1])?;
    let plan = plan()?;
    let r = &plan.replication;
    let key = identity(r)?;
    std::fs::create_dir_all(RUN_DIR).with_context(|| format!("making {RUN_DIR}"))?;
    let known = Path::new(RUN_DIR).join("known_hosts");
    let hosts: String = r.peers.iter().map(|p| format!("{} {}\n", p.address, p.key.trim())).collect();
    std::fs::write(&known, hosts).context("writing known_hosts")?;
    for j in &r.jobs {
        say(format!(
            "{} → {} ({}) every {} min{}",
            j.dataset,
            j.peer,
            j.target,
            j.every_minutes,
            j.bandwidth_bytes.map(|b| format!(", at most {}/s", mib(b))).unwrap_or_default()
        ));
    }
    let st = State::mounted();
    let mut schedules = vec![Schedule::default(); r.jobs.len()];
    let mut asked = false;
    loop {
        let now = unix_now();
        for (i, job) in r.jobs.iter().enumerate() {
            let period = u64::from(job.every_minutes.max(1)) * 60;
            if !asked && !schedules[i].due(now, period) {
                continue;
            }
            let Some(peer) = r.peers.iter().find(|p| p.name == job.peer) else { continue };
            let ssh = Ssh { key: key.clone(), known: known.clone(), address: peer.address.clone() };
            let mut s = state::read(&st, &job.dataset, &job.peer).unwrap_or_else(|| JobState {
                dataset: job.dataset.clone(),
                peer: job.peer.clone(),
                target: job.target.clone(),
                ..JobState::default()
            });
            s.last_attempt = now;
            if s.first_attempt == 0 {
                s.first_attempt = now;
            }
            let result = round(job, peer, &ssh, &mut s);
            schedules[i].ran(now, result.is_ok());
            match result {
                Ok(()) => {
                    s.last_success = unix_now();
                    s.last_error = None;
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    let when = schedules[i].retry_at().map_or(0, |r| r.saturating_sub(now).min(period));
                    say(format!("{} → {}: {msg}; trying again in {when}s", job.dataset, job.peer));
                    s.last_error = Some(msg);
                }
            }
            if let Err(e) = state::write(&st, &s) {
                say(format!("recording {} → {}: {e}", job.dataset, job.peer));
            }
        }
        asked = false;
        let retry = schedules.iter().filter_map(Schedule::retry_at).min();
        let next = ((unix_now() / 60 + 1) * 60 + AFTER_MINUTE).min(retry.unwrap_or(u64::MAX));
        let wait = Duration::from_secs(next.saturating_sub(unix_now()).clamp(1, 62));
        if let Ok(Some(Sig::SIGUSR1)) = signals.wait(wait) {
            say("a round was asked for (nasctl replication send)");
            asked = true;
        }
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

/// How this box reaches a peer: its own key, only the peer's host key accepted, no prompts, and
/// a dead connection noticed within seconds.
struct Ssh {
    key: PathBuf,
    known: PathBuf,
    address: String,
}

impl Ssh {
    fn command(&self, request: &str) -> Command {
        let mut c = Command::new("ssh");
        c.arg("-i").arg(&self.key);
        c.arg("-o").arg(format!("UserKnownHostsFile={}", self.known.display()));
        for o in [
            "GlobalKnownHostsFile=/dev/null",
            "StrictHostKeyChecking=yes",
            "BatchMode=yes",
            "IdentitiesOnly=yes",
            "ConnectTimeout=10",
            "ServerAliveInterval=3",
            "ServerAliveCountMax=3",
            "LogLevel=ERROR",
        ] {
            c.args(["-o", o]);
        }
        c.arg(format!("root@{}", self.address)).arg(request);
        c
    }

    /// Runs a request that takes `input` and answers on stdout.
    fn call(&self, request: &str, input: &[u8]) -> anyhow::Result<String> {
        let mut child = self
            .command(request)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting ssh")?;
        if let Some(mut i) = child.stdin.take() {
            i.write_all(input).context("writing to ssh")?;
        }
        let out = child.wait_with_output().context("waiting for ssh")?;
        if !out.status.success() {
            bail!(
                "`{request}` on {}: {}",
                self.address,
                nasos_exec::last_lines(&String::from_utf8_lossy(&out.stderr), 3)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn state(&self, target: &str) -> anyhow::Result<TargetState> {
        let out = self.call(&format!("state {target}"), b"")?;
        serde_json::from_str(out.trim()).with_context(|| format!("the peer's answer to `state {target}`: {out}"))
    }
}

fn snaps(dataset: &str) -> anyhow::Result<Vec<Snap>> {
    Ok(zsnap::list(&[dataset], false)?
        .into_iter()
        .map(|s| Snap { name: s.short, guid: s.guid, created: s.creation })
        .collect())
}

fn round(job: &ReplicationJobPlan, peer: &PeerPlan, ssh: &Ssh, s: &mut JobState) -> anyhow::Result<()> {
    let ds = &job.dataset;
    let mut target = ssh.state(&job.target)?;
    if let Some(token) = target.resume_token.clone() {
        say(format!("{ds} → {}: resuming the interrupted send from its token", peer.name));
        let bytes = pipe(&["send", "-t", &token], ssh, &job.target, job.bandwidth_bytes)?;
        s.resumed += 1;
        s.last_bytes = bytes;
        s.total_bytes += bytes;
        target = ssh.state(&job.target)?;
    }
    // A target this box may not send to is refused before a snapshot is taken for it.
    let before = snaps(ds)?;
    if !before.is_empty() {
        plan_send(ds, &peer.name, &before, &target).map_err(anyhow::Error::msg)?;
    }
    let now = unix_now();
    let name = format!("{SNAP_PREFIX}{}-{}", peer.name, crate::snapshots::stamp(now));
    zsnap::create(&format!("{ds}@{name}"), false).with_context(|| format!("taking {ds}@{name}"))?;
    let source = snaps(ds)?;
    let raw = tool("zfs", &["get", "-H", "-o", "value", "encryption", ds]).map(|v| v.trim() != "off").unwrap_or(false);
    let what = plan_send(ds, &peer.name, &source, &target).map_err(anyhow::Error::msg)?;
    let mut args: Vec<String> = vec!["send".into()];
    if raw {
        // Encrypted: sent as it is on disk; the peer never sees the key.
        args.push("-w".into());
    }
    let describe = match &what {
        Send::Resume(_) => bail!("the peer still holds an interrupted send after it was resumed"),
        Send::UpToDate => {
            say(format!("{ds} → {}: up to date", peer.name));
            String::new()
        }
        Send::Full(snap) => {
            args.push(format!("{ds}@{snap}"));
            format!("all of {ds}@{snap}")
        }
        Send::Incremental(from, to) => {
            args.extend(["-I".into(), format!("{ds}@{from}"), format!("{ds}@{to}")]);
            format!("{from} → {to}")
        }
    };
    if !describe.is_empty() {
        say(format!("{ds} → {} ({}): sending {describe}", peer.name, job.target));
        let t = Instant::now();
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let bytes = pipe(&a, ssh, &job.target, job.bandwidth_bytes)?;
        let secs = t.elapsed().as_secs_f64().max(0.001);
        say(format!(
            "{ds} → {}: sent {} in {secs:.1}s ({}/s)",
            peer.name,
            mib(bytes),
            mib((bytes as f64 / secs) as u64)
        ));
        s.last_bytes = bytes;
        s.total_bytes += bytes;
    }
    // The new snapshot is common now: hold it here, release the old base, drop the old
    // replication snapshots, and let the target drop what this box no longer has.
    let newest = source.last().cloned().context("no snapshot after taking one")?;
    let tag = hold_tag_to(&peer.name);
    zsnap::hold(&tag, &format!("{ds}@{}", newest.name), false).ok();
    let full: Vec<String> = source.iter().map(|x| format!("{ds}@{}", x.name)).collect();
    let held: Vec<&str> = full.iter().map(String::as_str).collect();
    for h in zsnap::holds(&held)? {
        if h.tag == tag && h.snapshot != format!("{ds}@{}", newest.name) {
            zsnap::release(&tag, &h.snapshot, false).with_context(|| format!("releasing {}", h.snapshot))?;
        }
    }
    for old in source_prune(&source, &peer.name, &newest.name) {
        zsnap::destroy(&format!("{ds}@{old}"), false).with_context(|| format!("destroying {ds}@{old}"))?;
    }
    let remaining: Vec<u64> = snaps(ds)?.iter().map(|x| x.guid).collect();
    let gone = ssh.call(&format!("prune {}", job.target), serde_json::to_string(&remaining)?.as_bytes())?;
    if gone.trim() != "[]" {
        say(format!("{ds} → {}: pruned on the peer: {}", peer.name, gone.trim()));
    }
    s.common = Some(newest);
    Ok(())
}

/// `zfs ARGS | ssh peer receive TARGET`, copied through this process: counted, limited to
/// `limit` bytes per second. Returns the bytes moved.
fn pipe(args: &[&str], ssh: &Ssh, target: &str, limit: Option<u64>) -> anyhow::Result<u64> {
    let mut send = Command::new("zfs")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting zfs send")?;
    let mut recv = ssh
        .command(&format!("receive {target}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting ssh")?;
    let (Some(mut from), Some(mut to)) = (send.stdout.take(), recv.stdin.take()) else {
        bail!("no pipe between zfs send and ssh");
    };
    let start = Instant::now();
    let mut moved: u64 = 0;
    let mut buf = vec![0u8; 256 << 10];
    let copied: std::io::Result<()> = (|| {
        loop {
            let n = from.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            to.write_all(&buf[..n])?;
            moved += n as u64;
            if let Some(l) = limit.filter(|l| *l > 0) {
                let due = Duration::from_secs_f64(moved as f64 / l as f64);
                if let Some(ahead) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(ahead);
                }
            }
        }
    })();
    drop(to);
    drop(from);
    let r = recv.wait_with_output().context("waiting for ssh")?;
    let s = send.wait_with_output().context("waiting for zfs send")?;
    let tail = |b: &[u8]| nasos_exec::last_lines(&String::from_utf8_lossy(b), 3);
    // The peer's side first: when the connection breaks, zfs send fails too (a broken pipe),
    // and what ssh says is the cause.
    if !r.status.success() {
        bail!("receiving on the peer failed after {}: {}", mib(moved), tail(&r.stderr));
    }
    if !s.status.success() {
        bail!("zfs send failed after {}: {}", mib(moved), tail(&s.stderr));
    }
    copied.with_context(|| format!("the send stopped after {}", mib(moved)))?;
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_runs_once_per_interval_and_a_failed_round_is_retried_sooner_then_less_often() {
        let period = 300;
        let mut s = Schedule::default();
        assert!(s.due(1_000, period), "never ran");
        s.ran(1_208, true);
        assert!(!s.due(1_250, period) && !s.due(1_499, period), "ran in this interval");
        assert!(s.due(1_500, period), "the next interval");
        s.ran(1_508, false);
        assert_eq!(s.retry_at(), Some(1_518));
        assert!(!s.due(1_517, period) && s.due(1_518, period));
        s.ran(1_518, false);
        s.ran(1_538, false);
        assert_eq!(s.retry_at(), Some(1_538 + 40), "10 s, 20 s, 40 s…");
        for t in (1_600..2_000).step_by(10) {
            s.ran(t, false);
        }
        assert!(s.retry_at().is_some_and(|r| r > 2_000 + period), "backs off past the interval");
        assert!(s.due(2_100, period), "but the next interval still runs it");
        s.ran(2_108, true);
        assert_eq!(s.retry_at(), None);
    }
}
