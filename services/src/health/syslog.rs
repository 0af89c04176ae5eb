//! Alerts to remote syslog receivers (RFC 5424, via the `syslog` crate), from a thread of its
//! own behind a bounded queue: a receiver that is slow or unreachable (a TCP connect can hang
//! for minutes) delays only itself, and when the queue is full alerts for syslog are dropped
//! and counted — the health loop never waits for the network.

use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};

use nasos_board::plan::{SyslogTarget, SyslogTransport};
use syslog::{Facility, Formatter5424, Severity as SyslogSeverity};

use super::alerts::Alert;
use super::checks::Severity;

/// RFC 5424 message id for health alerts and the structured data id (`nasos@32473`: the
/// enterprise number is the documentation one, RFC 5612).
/// syslog's structured data (the crate does not export its alias).
type StructuredData = std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>;

const SD_ID: &str = "nasos@32473";

pub struct Sender {
    queue: SyncSender<Alert>,
}

impl Sender {
    /// Starts the sending thread for `targets`; `hostname` goes in each message.
    pub fn start(targets: Vec<SyslogTarget>, hostname: String) -> std::io::Result<Sender> {
        let (queue, rx) = sync_channel::<Alert>(256);
        std::thread::Builder::new().name("syslog".into()).spawn(move || {
            let formatter = Formatter5424 {
                facility: Facility::LOG_DAEMON,
                hostname: Some(hostname),
                process: "nasos-health".into(),
                pid: std::process::id(),
            };
            for alert in rx {
                for t in &targets {
                    if let Err(e) = send(t, formatter.clone(), &alert) {
                        println!("syslog {t}: {e}");
                    }
                }
            }
        })?;
        Ok(Sender { queue })
    }

    /// Queues an alert; false when the queue is full (the alert still went everywhere else).
    pub fn send(&self, alert: &Alert) -> bool {
        !matches!(self.queue.try_send(alert.clone()), Err(TrySendError::Full(_)))
    }
}

fn send(t: &SyslogTarget, f: Formatter5424, a: &Alert) -> Result<(), String> {
    let data = structured(a);
    let msg = (1u32, data, a.line());
    let severity = match a.to {
        Severity::Critical => SyslogSeverity::LOG_CRIT,
        Severity::Warning => SyslogSeverity::LOG_WARNING,
        Severity::Ok => SyslogSeverity::LOG_NOTICE,
    };
    let mut logger = match t.transport {
        SyslogTransport::Udp => {
            let local = if t.address.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
            syslog::udp(f, local, t.address).map_err(|e| e.to_string())?
        }
        SyslogTransport::Tcp => syslog::tcp(f, t.address).map_err(|e| e.to_string())?,
    };
    let r = match severity {
        SyslogSeverity::LOG_CRIT => logger.crit(msg),
        SyslogSeverity::LOG_WARNING => logger.warning(msg),
        _ => logger.notice(msg),
    };
    r.map_err(|e| e.to_string())
}

/// The alert's fields as RFC 5424 structured data: `[nasos@32473 check="…" from="…" to="…"]`.
pub fn structured(a: &Alert) -> StructuredData {
    let mut params = std::collections::BTreeMap::new();
    params.insert("check".to_string(), a.id.clone());
    params.insert("from".to_string(), a.from.to_string());
    params.insert("to".to_string(), a.to.to_string());
    let mut sd = StructuredData::new();
    sd.insert(SD_ID.to_string(), params);
    sd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alert_reaches_a_udp_receiver_as_rfc5424() {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5))).expect("timeout");
        let target = SyslogTarget { transport: SyslogTransport::Udp, address: rx.local_addr().expect("addr") };
        let sender = Sender::start(vec![target], "nasos-test".into()).expect("start");
        let alert = Alert {
            at: 1,
            id: "bay.BAY07.present".into(),
            from: Severity::Ok,
            to: Severity::Critical,
            message: "BAY07: drive missing (a member of pool tank)".into(),
        };
        assert!(sender.send(&alert));
        let mut buf = [0u8; 2048];
        let n = rx.recv(&mut buf).expect("a datagram");
        let text = String::from_utf8_lossy(&buf[..n]);
        // PRI = daemon (3) × 8 + crit (2) = 26; version 1; then time, host, app, procid, msgid.
        assert!(text.starts_with("<26>1 "), "{text}");
        let fields: Vec<&str> = text.splitn(8, ' ').collect();
        assert_eq!(fields[2], "nasos-test");
        assert_eq!(fields[3], "nasos-health");
        assert_eq!(fields[5], "1");
        assert!(
            text.ends_with(" 1 [nasos@32473 check=\"bay.BAY07.present\" from=\"ok\" to=\"critical\"] CRITICAL BAY07: drive missing (a member of pool tank)"),
            "{text}"
        );
    }
}
