//! `nasos-replication serve PEER`: the forced command a peer's key logs in to. It reads the
//! request from `SSH_ORIGINAL_COMMAND`, refuses anything but `state|receive|prune DATASET` for a
//! dataset the recipe lets that peer write, and answers on stdout (JSON) or receives stdin.

use std::io::Read;

use anyhow::{Context, bail};
use nasos_layout::state::State;
use nasos_zfs::snapshot as zsnap;

use super::{Request, Snap, TargetState, hold_tag_from, parse_request, state, target_prune};
use crate::{plan, probe, run};

pub fn serve() -> anyhow::Result<()> {
    let peer = std::env::args().nth(2).context("usage: nasos-replication serve PEER")?;
    let plan = plan()?;
    let allowed: Vec<String> =
        plan.replication.peers.iter().find(|p| p.name == peer).map(|p| p.receive.clone()).unwrap_or_default();
    let command = std::env::var("SSH_ORIGINAL_COMMAND").unwrap_or_default();
    let request = parse_request(&command, &peer, &allowed).map_err(anyhow::Error::msg)?;
    let st = State::mounted();
    match request {
        Request::State(ds) => {
            let s = target_state(&st, &ds)?;
            println!("{}", serde_json::to_string(&s)?);
        }
        Request::Receive(ds) => {
            if state::is_promoted(&st, &ds) {
                bail!("{ds} was promoted on this box: it takes no more replicas");
            }
            // `-s` keeps what arrived when the connection drops, for `zfs send -t` to continue.
            // A new replica is made read-only; it is mounted (and served, if exported) as soon as
            // it arrives.
            let exists = probe("zfs", &["list", "-H", "-o", "name", &ds]);
            let mut args = vec!["receive", "-s"];
            if !exists {
                args.extend(["-o", "readonly=on"]);
            }
            args.push(&ds);
            // The stream is stdin, the SSH channel; sshd's keepalive ends a dead connection, and
            // zfs receive then sees the stream end.
            let child = std::process::Command::new("zfs")
                .args(&args)
                .stdin(std::process::Stdio::inherit())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .with_context(|| format!("running zfs receive into {ds}"))?;
            // For a promote during the receive: it ends this one (see ops::promote).
            let pidfile = state::receiving_path(&ds);
            let _ = std::fs::create_dir_all(super::sshd::RUN_DIR);
            let _ = std::fs::write(&pidfile, format!("{}\n", child.id()));
            let out = child.wait_with_output().with_context(|| format!("waiting for zfs receive into {ds}"));
            let _ = std::fs::remove_file(&pidfile);
            let out = out?;
            if !out.status.success() {
                bail!(
                    "zfs receive into {ds}: {} ({})",
                    nasos_exec::last_lines(&String::from_utf8_lossy(&out.stderr), 3),
                    out.status
                );
            }
            // The newest snapshot is the base of the next send: held here, the older hold released.
            let snaps = zsnap::list(&[ds.as_str()], false)?;
            let tag = hold_tag_from(&peer);
            if let Some(newest) = snaps.last() {
                let _ = zsnap::hold(&tag, &newest.name, false);
                let held: Vec<&str> = snaps.iter().filter(|s| s.userrefs > 0).map(|s| s.name.as_str()).collect();
                for h in zsnap::holds(&held)? {
                    if h.tag == tag && h.snapshot != newest.name {
                        let _ = zsnap::release(&tag, &h.snapshot, false);
                    }
                }
            }
            println!("received {ds}");
        }
        Request::Prune(ds) => {
            let mut input = String::new();
            std::io::stdin().read_to_string(&mut input).context("reading the source's snapshots")?;
            let source: Vec<u64> = serde_json::from_str(&input).context("the source's snapshot list")?;
            let target = target_state(&st, &ds)?;
            let mut gone = Vec::new();
            for name in target_prune(&target.snapshots, &source) {
                let full = format!("{ds}@{name}");
                // Held ones (an operator's hold, the base of a send) stay: ZFS refuses them.
                if zsnap::destroy(&full, false).is_ok() {
                    gone.push(name);
                }
            }
            println!("{}", serde_json::to_string(&gone)?);
        }
    }
    Ok(())
}

/// The target dataset's state as the sender needs it.
fn target_state(st: &State, ds: &str) -> anyhow::Result<TargetState> {
    let exists = probe("zfs", &["list", "-H", "-o", "name", ds]);
    if !exists {
        return Ok(TargetState::default());
    }
    let token = run("zfs", &["get", "-H", "-o", "value", "receive_resume_token", ds])?;
    let token = token.trim();
    let snapshots = zsnap::list(&[ds], false)?
        .into_iter()
        .map(|s| Snap { name: s.short, guid: s.guid, created: s.creation })
        .collect();
    Ok(TargetState {
        exists,
        promoted: state::is_promoted(st, ds),
        resume_token: (!token.is_empty() && token != "-").then(|| token.to_string()),
        snapshots,
    })
}
