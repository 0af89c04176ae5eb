//! The health agent's loop: a check round every interval, and at once when ZFS posts an event
//! (`zpool events -f`, one long-running child) or udev reports a device added or removed (a
//! netlink socket). A drive's event is also judged at once from the bays alone, while the slow
//! part of a round (pool and service queries, on a thread of its own) may still be running, so a
//! pulled drive is named within a second even on a busy pool. Each round
//! reads ([`super::observe`]), decides ([`super::checks`], [`super::alerts`]) and publishes:
//! alerts to the console, the history on the state partition and syslog; the report for
//! `nasctl health`; the metrics. The hardware watchdog is not here: PID 1 owns it.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nasos_layout::paths;
use nasos_layout::state::{self, State};

use super::alerts::{self, Alert, Report};
use super::checks::{self, Check, Limits};
use super::observe::{self, Observation, ServiceObs};
use super::{metrics, syslog};
use crate::signals::{Sig, Signals};
use crate::{notify_ready, plan, say};

pub fn run() -> anyhow::Result<()> {
    let plan = plan()?;
    let signals = Signals::take(&[Sig::SIGTERM])?;
    let every = Duration::from_secs(u64::from(plan.health.check_interval_seconds.max(1)));
    let wake = Arc::new(AtomicBool::new(false));
    let drives = Arc::new(AtomicBool::new(false));
    if !plan.pools.is_empty() {
        follow_zfs_events(wake.clone());
    }
    if let Err(e) = follow_udev(drives.clone()) {
        say(format!("not watching hot-plug events ({e}); drives are checked every {}s", every.as_secs()));
    }
    let latest = Arc::new(Mutex::new(String::new()));
    if let Some(addr) = plan.health.metrics {
        match metrics::serve(addr, latest.clone()) {
            Ok(()) => say(format!("metrics on http://{addr}/metrics")),
            Err(e) => say(format!("no metrics endpoint: {e}")),
        }
    }
    let syslog = if plan.health.syslog.is_empty() {
        None
    } else {
        let to: Vec<String> = plan.health.syslog.iter().map(ToString::to_string).collect();
        match syslog::Sender::start(plan.health.syslog.clone(), plan.image.hostname.clone()) {
            Ok(s) => {
                say(format!("alerts go to syslog {}", to.join(", ")));
                Some(s)
            }
            Err(e) => {
                say(format!("cannot start the syslog sender: {e}"));
                None
            }
        }
    };
    let mut round = Round {
        limits: Limits::from(&plan.health),
        members: checks::pool_members(&plan),
        checks: BTreeMap::new(),
        before: None,
        syslog,
        latest,
        history_failed: false,
        dropped: 0,
        unchecked: Vec::new(),
        fatal_since: BTreeMap::new(),
        grace: u64::from(plan.health.fatal_grace_seconds),
    };
    let observer = Observer::start(plan.clone())?;
    let first = observer.observe()?;
    round.run(&plan, first, true);
    notify_ready(&format!("checking every {}s", every.as_secs()))?;
    let mut last = Instant::now();
    let (mut asked, mut due) = (false, false);
    loop {
        // Short: the flags are looked at between waits, and a pulled drive is named within
        // this much of udev's announcement.
        if signals.wait(Duration::from_millis(200))? == Some(Sig::SIGTERM) {
            return Ok(());
        }
        // A drive came or went: its bay is named from the bays alone (a few ioctls), even while
        // a round's pool and service queries take seconds on a busy box; a full round follows.
        if drives.swap(false, Ordering::SeqCst) {
            round.bays_only(&plan);
            due = true;
        }
        due |= wake.swap(false, Ordering::SeqCst) || last.elapsed() >= every;
        if asked && let Some(obs) = observer.result()? {
            asked = false;
            round.run(&plan, obs, false);
        }
        if due && !asked {
            observer.ask()?;
            (asked, due, last) = (true, false, Instant::now());
        }
    }
}

/// The slow part of a round on a thread of its own: `zpool` and `zfs` queries that wait on a
/// busy pool for seconds, and nasinit's list of services. The bays are read by the loop itself.
struct Observer {
    ask: std::sync::mpsc::Sender<()>,
    got: std::sync::mpsc::Receiver<Observation>,
}

impl Observer {
    fn start(plan: nasos_board::Plan) -> anyhow::Result<Observer> {
        let (ask, asked) = std::sync::mpsc::channel::<()>();
        let (give, got) = std::sync::mpsc::channel();
        std::thread::Builder::new().name("observe".into()).spawn(move || {
            // One runtime for the thread's life, for the calls to nasinit each round.
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("no runtime to ask nasinit with: {e}"));
            for () in asked {
                let services = match &rt {
                    Ok(rt) => services(rt),
                    Err(e) => Err(e.clone()),
                };
                if give.send(observe::without_bays(&plan, services)).is_err() {
                    return;
                }
            }
        })?;
        Ok(Observer { ask, got })
    }

    fn ask(&self) -> anyhow::Result<()> {
        self.ask.send(()).map_err(|_| anyhow::anyhow!("the observing thread ended"))
    }

    /// The observation asked for, if it is there yet.
    fn result(&self) -> anyhow::Result<Option<Observation>> {
        match self.got.try_recv() {
            Ok(o) => Ok(Some(o)),
            Err(std::sync::mpsc::TryRecvError::Empty) => Ok(None),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => anyhow::bail!("the observing thread ended"),
        }
    }

    /// One observation, waited for.
    fn observe(&self) -> anyhow::Result<Observation> {
        self.ask()?;
        self.got.recv().map_err(|_| anyhow::anyhow!("the observing thread ended"))
    }
}

struct Round {
    limits: Limits,
    members: Vec<(String, String)>,
    checks: BTreeMap<String, Check>,
    before: Option<Observation>,
    syslog: Option<syslog::Sender>,
    latest: Arc<Mutex<String>>,
    history_failed: bool,
    dropped: u64,
    unchecked: Vec<String>,
    /// Each fatal condition seen, since when (seconds since the epoch), and whether the reset it
    /// leads to was announced.
    fatal_since: BTreeMap<String, (u64, bool)>,
    grace: u64,
}

impl Round {
    /// Judges and publishes a round from the observer's `slow` part and the bays read now (so a
    /// bay named in a pass of its own while the round was observed is not undone).
    fn run(&mut self, plan: &nasos_board::Plan, slow: Observation, first: bool) {
        let obs = Observation { bays: observe::bays(Path::new(paths::BAY_DIR), plan), ..slow };
        if first {
            self.unchecked = unchecked(&obs);
            for u in &self.unchecked {
                say(format!("not checked: {u}"));
            }
        }
        let now_checks = checks::evaluate(&self.limits, &self.members, &obs, self.before.as_ref());
        let at = crate::unix_now();
        let mut alerts = alerts::transitions(&self.checks, &now_checks, at);
        alerts.extend(self.verdict(&obs, at));
        if first {
            let not = now_checks.iter().filter(|c| c.severity != checks::Severity::Ok).count();
            say(format!("{} checks: {} ok, {not} not", now_checks.len(), now_checks.len() - not));
        }
        self.publish(obs, now_checks, &alerts, at);
    }

    /// The history first, then the report and metrics, then the console and syslog: whoever
    /// sees an alert and asks `nasctl health` or scrapes finds it already there.
    fn publish(&mut self, obs: Observation, now_checks: Vec<Check>, alerts: &[Alert], at: u64) {
        self.record(alerts);
        let report = Report::new(at, &now_checks, self.unchecked.clone(), obs.clone());
        let text = metrics::render(&report, &now_checks);
        if let Ok(mut l) = self.latest.lock() {
            *l = text;
        }
        if let Err(e) = write_json(Path::new(paths::HEALTH_REPORT), &report) {
            say(format!("cannot write {}: {e}", paths::HEALTH_REPORT));
        }
        self.announce(alerts);
        self.checks = now_checks.into_iter().map(|c| (c.id.clone(), c)).collect();
        self.before = Some(obs);
    }

    /// Reads the bays again and publishes what changed about them, the rest of the last round
    /// kept as it was (see [`checks::with_fresh_bays`]). Nothing before the first round.
    fn bays_only(&mut self, plan: &nasos_board::Plan) {
        let Some(last) = &self.before else { return };
        let obs = Observation { bays: observe::bays(Path::new(paths::BAY_DIR), plan), ..last.clone() };
        let fresh = checks::evaluate(&self.limits, &self.members, &obs, Some(last));
        let now_checks = checks::with_fresh_bays(&self.checks, fresh);
        let at = crate::unix_now();
        let alerts = alerts::transitions(&self.checks, &now_checks, at);
        if alerts.is_empty() {
            return;
        }
        self.publish(obs, now_checks, &alerts, at);
    }

    /// Tells nasinit what is fatal and since when ([`paths::HEALTH_VERDICT`]); returns the alert
    /// that says a reset is coming, once, when a condition outlasts its grace (nasinit decides and
    /// acts on the same rule; this is what the next boot's history shows).
    fn verdict(&mut self, obs: &Observation, at: u64) -> Vec<Alert> {
        let now = checks::fatal(obs);
        self.fatal_since.retain(|id, _| now.iter().any(|(i, _)| i == id));
        let mut out = Vec::new();
        let mut verdict = nasos_api::HealthVerdict { at, ..Default::default() };
        for (id, message) in now {
            let (since, announced) = self.fatal_since.entry(id.clone()).or_insert((at, false));
            if at.saturating_sub(*since) >= self.grace && !*announced {
                *announced = true;
                out.push(Alert {
                    at,
                    id: "watchdog".into(),
                    from: checks::Severity::Ok,
                    to: checks::Severity::Critical,
                    message: format!(
                        "{message}, for {}s (grace {}s): nasinit stops feeding the watchdog and the box resets",
                        at - *since,
                        self.grace
                    ),
                });
            }
            verdict.fatal.push(nasos_api::Fatal { id, message, since: *since });
        }
        if let Err(e) = write_json(Path::new(paths::HEALTH_VERDICT), &verdict) {
            say(format!("cannot write {}: {e}", paths::HEALTH_VERDICT));
        }
        out
    }

    /// Alerts to the console, the service log and syslog.
    fn announce(&mut self, alerts: &[Alert]) {
        for a in alerts {
            let line = a.line();
            say(&line);
            console(&format!("health: {line}"));
            if let Some(s) = &self.syslog
                && !s.send(a)
            {
                self.dropped += 1;
                say(format!("syslog queue full: {} alerts not sent to syslog", self.dropped));
            }
        }
    }

    /// Alerts to the history on the state partition.
    fn record(&mut self, alerts: &[Alert]) {
        if alerts.is_empty() {
            return;
        }
        let st = State::mounted();
        match crate::jsonl::append(&st.path(state::HEALTH_ALERTS), alerts, state::HEALTH_ALERTS_KEPT) {
            Ok(()) => self.history_failed = false,
            Err(e) if !self.history_failed => {
                self.history_failed = true;
                say(format!("alerts are not kept across reboots: {e}"));
            }
            Err(_) => {}
        }
    }
}

/// What this machine cannot tell health, said once at start.
fn unchecked(o: &Observation) -> Vec<String> {
    let mut out = Vec::new();
    if o.cpu_celsius.is_none() {
        out.push("CPU temperature: no k10temp sensor on this machine".to_string());
    }
    if o.ecc.is_none() {
        out.push("memory ECC: no EDAC memory controller on this machine".to_string());
    }
    let no_spare: Vec<&str> = o
        .bays
        .iter()
        .filter(|b| matches!(&b.smart, Some(Ok(s)) if !s.reports_spare()))
        .map(|b| b.bay.as_str())
        .collect();
    if !no_spare.is_empty() {
        out.push(format!("NVMe available spare: not reported by the drives in {}", no_spare.join(" ")));
    }
    for l in o.links.iter().filter(|l| l.speed_mbps.is_none()) {
        out.push(format!("link {} speed: the NIC reports none", l.name));
    }
    out
}

/// Replaces `path` with `value` as JSON, whole (through a temporary file): readers never see
/// half of it. These files are on tmpfs and rewritten every round, so nothing is fsynced.
fn write_json(path: &Path, value: &impl serde::Serialize) -> std::io::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(value).map_err(std::io::Error::other)?)?;
    std::fs::rename(tmp, path)
}

/// A line on the console, where the operator looks. Non-blocking: a console that cannot take
/// it now (a slow serial line) loses the line rather than stalling the checks; the service log
/// and the history have it.
fn console(line: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open("/dev/console")
    {
        let _ = f.write_all(format!("{line}\r\n").as_bytes());
    }
}

/// Services as nasinit reports them, over its control socket.
fn services(rt: &tokio::runtime::Runtime) -> Result<Vec<ServiceObs>, String> {
    rt.block_on(async {
        let ask = async {
            let client = nasos_api::Client::connect(Path::new(nasos_api::DEFAULT_SOCKET)).await?;
            client.services().await
        };
        match tokio::time::timeout(Duration::from_secs(3), ask).await {
            Ok(Ok(list)) => Ok(list
                .into_iter()
                .map(|s| ServiceObs { name: s.name, state: s.state, restarts: s.restarts })
                .collect()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer within 3 s".to_string()),
        }
    })
}

/// Follows ZFS's event stream with one `zpool events -f` child; every event wakes a round. The
/// child is started again if it ends.
fn follow_zfs_events(wake: Arc<AtomicBool>) {
    let spawned = std::thread::Builder::new().name("zfs-events".into()).spawn(move || {
        loop {
            match std::process::Command::new("zpool")
                .args(["events", "-f", "-H"])
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
            {
                Ok(mut child) => {
                    if let Some(out) = child.stdout.take() {
                        for line in std::io::BufReader::new(out).lines() {
                            if line.is_err() {
                                break;
                            }
                            wake.store(true, Ordering::SeqCst);
                        }
                    }
                    let _ = child.wait();
                }
                Err(e) => say(format!("cannot follow ZFS events: {e}")),
            }
            std::thread::sleep(Duration::from_secs(5));
        }
    });
    if let Err(e) = spawned {
        say(format!("cannot follow ZFS events: {e}"));
    }
}

/// Wakes a round for every event udev announces (after its rules ran, so the bay links are
/// already made or gone): the netlink group libudev monitors listen on.
fn follow_udev(wake: Arc<AtomicBool>) -> anyhow::Result<()> {
    use nix::sys::socket::{
        AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, socket,
    };
    let fd =
        socket(AddressFamily::Netlink, SockType::Datagram, SockFlag::SOCK_CLOEXEC, SockProtocol::NetlinkKObjectUEvent)?;
    // Group 2: udev's own announcements; group 1 would be the kernel's, before udev acted.
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &NetlinkAddr::new(0, 2))?;
    std::thread::Builder::new().name("udev-events".into()).spawn(move || {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match recv(std::os::fd::AsRawFd::as_raw_fd(&fd), &mut buf, MsgFlags::empty()) {
                Ok(n) if is_drive_event(&buf[..n]) => wake.store(true, Ordering::SeqCst),
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR | nix::errno::Errno::ENOBUFS) => wake.store(true, Ordering::SeqCst),
                Err(e) => {
                    say(format!("hot-plug events stopped: {e}"));
                    return;
                }
            }
        }
    })?;
    Ok(())
}

/// Whether a udev announcement is about a block or NVMe device (the payload after libudev's
/// header holds `KEY=value` strings separated by NULs).
fn is_drive_event(msg: &[u8]) -> bool {
    msg.split(|b| *b == 0).any(|f| f == b"SUBSYSTEM=block" || f == b"SUBSYSTEM=nvme")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drive_events_are_told_from_others() {
        let block = b"libudev\0\xfe\xed\xca\xfe....\0ACTION=remove\0SUBSYSTEM=block\0DEVNAME=/dev/nvme6n1\0";
        let net = b"libudev\0....\0ACTION=add\0SUBSYSTEM=net\0INTERFACE=eth1\0";
        assert!(is_drive_event(block));
        assert!(!is_drive_event(net));
    }
}
