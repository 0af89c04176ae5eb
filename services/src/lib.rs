//! What the appliance's agents share: the plan, running tools with typed arguments, and
//! telling nasinit they are ready.

use std::os::unix::net::UnixDatagram;

use anyhow::Context;
use nasos_board::Plan;
use nasos_layout::paths;

pub mod fabric;
pub mod health;
pub mod inspect;
pub mod jsonl;
pub mod kerberos;
pub mod mounts;
pub mod nfs;
pub mod nfsd;
pub mod rdma;
pub mod replication;
pub mod signals;
pub mod snapshots;
pub mod storage;
pub mod upgrade;

/// Reads the plan the image carries (or `$NASOS_PLAN`, for tests).
pub fn plan() -> anyhow::Result<Plan> {
    let path = std::env::var("NASOS_PLAN").unwrap_or_else(|_| paths::PLAN.to_string());
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading the plan {path}"))?;
    Plan::from_json(&text).with_context(|| format!("reading the plan {path}"))
}

/// Tools run one way everywhere: with a deadline, and an error naming the command with the end
/// of its stderr.
pub use nasos_exec::{Tool, probe, run};

/// Sends `READY=1` (and a status) to nasinit's notify socket, as sd_notify does.
pub fn notify_ready(status: &str) -> anyhow::Result<()> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return Ok(()) };
    let sock = UnixDatagram::unbound()?;
    sock.send_to(format!("READY=1\nSTATUS={status}").as_bytes(), path).context("notifying nasinit")?;
    Ok(())
}

/// The `main` of every agent: checks the verb, runs it, reports an error on its log and in the
/// exit status (nasinit's restart policy acts on that).
pub fn main(name: &str, verbs: &[&str], run: impl FnOnce(&str) -> anyhow::Result<()>) -> std::process::ExitCode {
    let verb = std::env::args().nth(1).unwrap_or_default();
    if !verbs.contains(&verb.as_str()) {
        eprintln!("usage: nasos-{name} {}", verbs.join("|"));
        return std::process::ExitCode::from(2);
    }
    match run(&verb) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            say(format!("{name}: {e:#}"));
            std::process::ExitCode::FAILURE
        }
    }
}

/// Seconds since the epoch (history entries, alerts, health's verdict).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Prints a line for the service log (nasinit captures stdout).
pub fn say(line: impl AsRef<str>) {
    println!("{}", line.as_ref());
}
