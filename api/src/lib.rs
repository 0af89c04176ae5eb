//! nasinit's control API: D-Bus, peer to peer on a root-only unix socket, no bus daemon. These
//! types are the wire format, shared by the server (nasinit), `nasctl` and the agents.

use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use zbus::Type;

pub const OBJECT_PATH: &str = "/org/nasos/Init1";
pub const INTERFACE: &str = "org.nasos.Init1";
/// Where PID 1 listens. Tests and the benchmark pass their own path.
pub const DEFAULT_SOCKET: &str = nasos_layout::paths::CONTROL_SOCKET;

/// How the appliance is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownKind {
    Poweroff,
    Reboot,
    Halt,
}

impl ShutdownKind {
    pub const ALL: [ShutdownKind; 3] = [ShutdownKind::Poweroff, ShutdownKind::Reboot, ShutdownKind::Halt];

    /// The word on the wire and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            ShutdownKind::Poweroff => "poweroff",
            ShutdownKind::Reboot => "reboot",
            ShutdownKind::Halt => "halt",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// What health tells nasinit after each round ([`nasos_layout::paths::HEALTH_VERDICT`]): the
/// conditions only a reset can fix — both NFS listeners gone with the nfs service failed, a
/// pool suspended — each with the time it was first seen. Health reports; PID 1 decides.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthVerdict {
    /// Seconds since the epoch of the round that wrote it (0 when not known): a verdict that
    /// stops being renewed says nothing about the box now.
    #[serde(default)]
    pub at: u64,
    pub fatal: Vec<Fatal>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fatal {
    /// The check's id (`nfs.listeners`, `pool.tank.state`).
    pub id: String,
    pub message: String,
    /// Seconds since the epoch when it was first seen (in a row).
    pub since: u64,
}

impl HealthVerdict {
    /// Reads the verdict; an absent or unreadable one says nothing is fatal (a health agent that
    /// is not running must not reset the box).
    pub fn read(path: &Path) -> HealthVerdict {
        std::fs::read_to_string(path).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default()
    }

    /// Whether this verdict shows a healthy box at `now`: renewed within `fresh_s` and with
    /// nothing fatal. Else the reason it does not.
    pub fn healthy(&self, now: u64, fresh_s: u64) -> Result<(), String> {
        if self.at == 0 {
            return Err("the health agent has not reported yet".into());
        }
        if now.saturating_sub(self.at) > fresh_s {
            return Err(format!("the health agent's last report is {}s old", now.saturating_sub(self.at)));
        }
        match self.fatal.first() {
            Some(f) => Err(f.message.clone()),
            None => Ok(()),
        }
    }

    /// The condition held longest, if it has been held for at least `grace_s` at `now`.
    pub fn outlasting(&self, now: u64, grace_s: u64) -> Option<&Fatal> {
        self.fatal.iter().filter(|f| now.saturating_sub(f.since) >= grace_s).min_by_key(|f| f.since)
    }
}

/// One service, as `nasctl services` shows it. Times are milliseconds since nasinit started;
/// -1 means "not yet".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Type)]
pub struct ServiceInfo {
    pub name: String,
    /// waiting, starting, running, done, backoff, stopping, stopped, failed.
    pub state: String,
    /// Main process id, 0 when none runs.
    pub pid: u32,
    /// Restarts after the first start that nobody asked for (exits, failed starts); an
    /// operator's `nasctl start` or `restart` is not one.
    pub restarts: u32,
    /// When the service entered its current state.
    pub since_ms: i64,
    /// First start.
    pub started_ms: i64,
    /// First time ready.
    pub ready_ms: i64,
    /// How the last process ended ("exit 0", "signal 9"), empty if none has.
    pub last_exit: String,
    /// Why it is in its state (what it waits for, why it failed).
    pub detail: String,
}

/// The appliance as a whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Type)]
pub struct Status {
    /// starting, ready, degraded, stopping.
    pub state: String,
    pub hostname: String,
    pub image: String,
    pub version: String,
    pub pid1: bool,
    pub uptime_ms: i64,
    /// When every service became ready, -1 if not (yet).
    pub ready_ms: i64,
    /// Kernel boot → nasinit start, from CLOCK_BOOTTIME; -1 when unknown.
    pub kernel_ms: i64,
    /// This boot's number on the state partition (0: no state partition).
    pub boot: u64,
    /// How the previous boot ended ("clean reboot", "unclean (power loss, …)"); empty on a first boot.
    pub last_boot: String,
    /// The state partition: its device, or why nothing persists.
    pub state_partition: String,
    /// Why the appliance stays up without being ready (boots in a row missed their deadline);
    /// empty otherwise.
    pub why_not_ready: String,
    pub services: u32,
    pub services_ready: u32,
    pub services_failed: u32,
    /// Processes that were not nasinit's own children and were reaped after being re-parented.
    pub orphans_reaped: u64,
}

/// One line of the boot timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Type)]
pub struct TimelineEntry {
    pub name: String,
    pub started_ms: i64,
    pub ready_ms: i64,
}

/// A page of a service's log: lines with their sequence numbers, and the cursor to continue from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Type)]
pub struct LogPage {
    pub lines: Vec<LogLine>,
    pub next: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Type)]
pub struct LogLine {
    pub seq: u64,
    pub text: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to nasinit at {path}: {source}")]
    Connect { path: String, source: std::io::Error },
    #[error("D-Bus handshake with nasinit failed: {0}")]
    Handshake(zbus::Error),
    #[error("{0}")]
    Call(zbus::Error),
}

/// A control connection to nasinit.
pub struct Client {
    conn: zbus::Connection,
}

impl Client {
    pub async fn connect(path: &Path) -> Result<Client, ClientError> {
        let stream = std::os::unix::net::UnixStream::connect(path)
            .map_err(|source| ClientError::Connect { path: path.display().to_string(), source })?;
        let conn = zbus::connection::Builder::unix_stream(stream)
            .p2p()
            .method_timeout(Duration::from_secs(30))
            .build()
            .await
            .map_err(ClientError::Handshake)?;
        Ok(Client { conn })
    }

    /// Calls a method of the interface by name. The typed methods below are what callers want;
    /// this is for tests that send what a typed client never would.
    pub async fn call<B, R>(&self, method: &str, body: &B) -> Result<R, ClientError>
    where
        B: Serialize + Type,
        R: DeserializeOwned + Type,
    {
        let reply = self
            .conn
            .call_method(None::<()>, OBJECT_PATH, Some(INTERFACE), method, body)
            .await
            .map_err(ClientError::Call)?;
        reply.body().deserialize::<R>().map_err(ClientError::Call)
    }

    pub async fn status(&self) -> Result<Status, ClientError> {
        self.call("Status", &()).await
    }

    pub async fn services(&self) -> Result<Vec<ServiceInfo>, ClientError> {
        self.call("Services", &()).await
    }

    pub async fn start(&self, name: &str) -> Result<(), ClientError> {
        self.call("Start", &(name,)).await
    }

    pub async fn stop(&self, name: &str) -> Result<(), ClientError> {
        self.call("Stop", &(name,)).await
    }

    pub async fn restart(&self, name: &str) -> Result<(), ClientError> {
        self.call("Restart", &(name,)).await
    }

    /// Lines after `cursor` (0: from the oldest kept), at most `max`.
    pub async fn logs(&self, name: &str, cursor: u64, max: u32) -> Result<LogPage, ClientError> {
        self.call("Logs", &(name, cursor, max)).await
    }

    pub async fn timeline(&self) -> Result<Vec<TimelineEntry>, ClientError> {
        self.call("Timeline", &()).await
    }

    /// Development images only: stops nasinit's event loop, as a hung PID 1 would, so the
    /// hardware watchdog resets the box. A reply may not come: the loop stops right after it.
    pub async fn debug_freeze(&self) -> Result<(), ClientError> {
        self.call("DebugFreeze", &()).await
    }

    /// Development images only: reboots, and hangs the shutdown before the filesystems are
    /// synced, so the hardware watchdog must end it.
    pub async fn debug_hang_shutdown(&self) -> Result<(), ClientError> {
        self.call("DebugHangShutdown", &()).await
    }

    /// Stops every service and powers off, reboots or halts. A connection that drops after the
    /// request was sent counts as success: the machine may well be gone before the reply.
    pub async fn shutdown(&self, kind: ShutdownKind) -> Result<(), ClientError> {
        match self.call::<_, ()>("Shutdown", &(kind.as_str(),)).await {
            Err(ClientError::Call(zbus::Error::InputOutput(_))) => Ok(()),
            other => other,
        }
    }
}

#[cfg(test)]
mod verdict_tests {
    use super::*;

    #[test]
    fn only_a_condition_held_past_its_grace_counts() {
        let v = HealthVerdict {
            at: 150,
            fatal: vec![
                Fatal { id: "nfs.listeners".into(), message: "NFS is not listening".into(), since: 100 },
                Fatal { id: "pool.tank.state".into(), message: "pool tank: SUSPENDED".into(), since: 150 },
            ],
        };
        assert_eq!(v.outlasting(119, 20), None);
        assert_eq!(v.outlasting(120, 20).map(|f| f.id.as_str()), Some("nfs.listeners"));
        assert_eq!(v.outlasting(500, 20).map(|f| f.id.as_str()), Some("nfs.listeners"), "the oldest first");
        assert_eq!(HealthVerdict::default().outlasting(u64::MAX, 0), None);
        let missing = HealthVerdict::read(Path::new("/nonexistent/verdict.json"));
        assert!(missing.fatal.is_empty(), "no verdict is no fatal condition");
    }

    #[test]
    fn healthy_means_a_fresh_verdict_with_nothing_fatal() {
        let mut v = HealthVerdict { at: 1000, fatal: vec![] };
        assert_eq!(v.healthy(1020, 30), Ok(()));
        assert_eq!(v.healthy(1031, 30), Err("the health agent's last report is 31s old".into()));
        assert!(HealthVerdict::default().healthy(1000, 30).is_err(), "no report is not healthy");
        v.fatal.push(Fatal { id: "nfs.listeners".into(), message: "NFS is not listening".into(), since: 990 });
        assert_eq!(v.healthy(1000, 30), Err("NFS is not listening".into()));
    }
}

#[cfg(test)]
mod tests {
    use super::ShutdownKind;

    #[test]
    fn shutdown_kinds_round_trip() {
        for k in ShutdownKind::ALL {
            assert_eq!(ShutdownKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(ShutdownKind::parse("explode"), None);
    }
}
