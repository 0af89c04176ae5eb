//! Alerts to remote syslog receivers: RFC 5424 messages (formatted by the `syslog` crate) over
//! UDP, one datagram each, or over TCP with RFC 6587 octet-counting framing on a connection
//! kept open and made again after an error. Each receiver has a thread and a bounded queue of
//! its own: one that is slow or unreachable (a TCP connect can hang) delays only itself, and
//! when its queue is full alerts for it are dropped — the health loop never waits for the
//! network.

use std::io::Write;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::Duration;

use nasos_board::plan::{SyslogTarget, SyslogTransport};
use syslog::{Facility, Formatter5424, LogFormat, Severity as SyslogSeverity};

use super::alerts::Alert;
use super::checks::Severity;

/// syslog's structured data (the crate does not export its alias).
type StructuredData = std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>;

/// The structured data id (`nasos@32473`: the enterprise number is the documentation one,
/// RFC 5612).
const SD_ID: &str = "nasos@32473";
/// RFC 5424 message id of a health alert.
const MSG_ID: u32 = 1;
/// A receiver that does not take a connection or a message in this long is given up on for
/// that message.
const NET_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Sender {
    queues: Vec<SyncSender<Alert>>,
}

impl Sender {
    /// Starts one sending thread per target; `hostname` goes in each message.
    pub fn start(targets: Vec<SyslogTarget>, hostname: String) -> std::io::Result<Sender> {
        let formatter = Formatter5424 {
            facility: Facility::LOG_DAEMON,
            hostname: Some(hostname),
            process: "nasos-health".into(),
            pid: std::process::id(),
        };
        let mut queues = Vec::new();
        for t in targets {
            let (queue, rx) = sync_channel::<Alert>(256);
            let f = formatter.clone();
            std::thread::Builder::new().name(format!("syslog {t}")).spawn(move || deliver(t, f, rx))?;
            queues.push(queue);
        }
        Ok(Sender { queues })
    }

    /// Queues an alert for every receiver; false when a queue was full (the alert still went
    /// everywhere else).
    pub fn send(&self, alert: &Alert) -> bool {
        let mut all = true;
        for q in &self.queues {
            if matches!(q.try_send(alert.clone()), Err(TrySendError::Full(_))) {
                all = false;
            }
        }
        all
    }
}

/// One receiver's thread: sends each queued alert, says on the console when one is lost.
fn deliver(t: SyslogTarget, f: Formatter5424, rx: Receiver<Alert>) {
    let mut tcp: Option<TcpStream> = None;
    for alert in rx {
        let msg = match message(&f, &alert) {
            Ok(m) => m,
            Err(e) => {
                println!("syslog {t}: {e}");
                continue;
            }
        };
        let sent = match t.transport {
            SyslogTransport::Udp => send_udp(t.address, &msg),
            // A kept connection may have been closed by the receiver since: one new try.
            SyslogTransport::Tcp => {
                send_tcp(&mut tcp, t.address, &msg).or_else(|_| send_tcp(&mut tcp, t.address, &msg))
            }
        };
        if let Err(e) = sent {
            println!("syslog {t}: alert {} not delivered: {e}", alert.id);
        }
    }
}

/// The alert as one RFC 5424 message.
pub fn message(f: &Formatter5424, a: &Alert) -> Result<Vec<u8>, String> {
    let severity = match a.to {
        Severity::Critical => SyslogSeverity::LOG_CRIT,
        Severity::Warning => SyslogSeverity::LOG_WARNING,
        Severity::Ok => SyslogSeverity::LOG_NOTICE,
    };
    let mut out = Vec::new();
    f.format(&mut out, severity, (MSG_ID, structured(a), a.line())).map_err(|e| e.to_string())?;
    Ok(out)
}

fn send_udp(to: SocketAddr, msg: &[u8]) -> std::io::Result<()> {
    let local = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    UdpSocket::bind(local)?.send_to(msg, to).map(|_| ())
}

/// RFC 6587 octet counting: `LEN SP MSG`, so a message may hold any byte.
fn send_tcp(conn: &mut Option<TcpStream>, to: SocketAddr, msg: &[u8]) -> std::io::Result<()> {
    // A receiver that closed the connection since is only seen by reading: a write would still
    // succeed (into the socket's buffer) and the message be lost. Receivers never send, so
    // anything readable is the end of the connection (rsyslog's omfwd checks the same way).
    if conn.as_ref().is_some_and(|s| !open(s)) {
        *conn = None;
    }
    if conn.is_none() {
        let s = TcpStream::connect_timeout(&to, NET_TIMEOUT)?;
        s.set_write_timeout(Some(NET_TIMEOUT))?;
        *conn = Some(s);
    }
    let Some(s) = conn.as_mut() else { return Ok(()) };
    let mut frame = format!("{} ", msg.len()).into_bytes();
    frame.extend_from_slice(msg);
    let r = s.write_all(&frame).and_then(|()| s.flush());
    if r.is_err() {
        *conn = None;
    }
    r
}

/// Whether the peer has not closed the connection (nothing to read, not even its end).
fn open(s: &TcpStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return false;
    }
    let alive = matches!(s.peek(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    s.set_nonblocking(false).is_ok() && alive
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

    fn alert(id: &str) -> Alert {
        Alert {
            at: 1,
            id: id.into(),
            from: Severity::Ok,
            to: Severity::Critical,
            message: format!("{id}: drive missing"),
        }
    }

    /// Reads one octet-counted frame.
    fn frame(r: &mut impl std::io::BufRead) -> String {
        let mut len = Vec::new();
        r.read_until(b' ', &mut len).expect("length");
        let n: usize = String::from_utf8_lossy(&len).trim().parse().expect("a decimal length");
        let mut msg = vec![0u8; n];
        r.read_exact(&mut msg).expect("the message");
        String::from_utf8(msg).expect("utf-8")
    }

    fn accept(l: &std::net::TcpListener) -> TcpStream {
        l.set_nonblocking(true).expect("nonblocking");
        let end = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match l.accept() {
                Ok((c, _)) => {
                    c.set_nonblocking(false).expect("blocking");
                    c.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
                    return c;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && std::time::Instant::now() < end => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("no connection: {e}"),
            }
        }
    }

    #[test]
    fn tcp_alerts_are_octet_counted_on_one_connection_made_again_after_the_receiver_closed_it() {
        use std::io::BufReader;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let target = SyslogTarget { transport: SyslogTransport::Tcp, address: listener.local_addr().expect("addr") };
        let sender = Sender::start(vec![target], "nasos-test".into()).expect("start");
        assert!(sender.send(&alert("bay.BAY07.present")));
        assert!(sender.send(&alert("bay.BAY08.present")));
        let mut r = BufReader::new(accept(&listener));
        let first = frame(&mut r);
        assert!(first.starts_with("<26>1 ") && first.ends_with("CRITICAL bay.BAY07.present: drive missing"), "{first}");
        assert!(frame(&mut r).contains("check=\"bay.BAY08.present\""));
        // The receiver goes away; the next alerts come on a new connection.
        drop(r);
        std::thread::sleep(Duration::from_millis(200));
        assert!(sender.send(&alert("bay.BAY09.present")));
        let mut r = BufReader::new(accept(&listener));
        let again = frame(&mut r);
        assert!(again.contains("check=\"bay.BAY09.present\""), "{again}");
    }

    #[test]
    fn an_unreachable_receiver_delays_no_other() {
        // Nothing listens on the TCP port; the UDP receiver still gets the alert at once.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let tcp = SyslogTarget { transport: SyslogTransport::Tcp, address: closed.local_addr().expect("addr") };
        drop(closed);
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        rx.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let udp = SyslogTarget { transport: SyslogTransport::Udp, address: rx.local_addr().expect("addr") };
        let sender = Sender::start(vec![tcp, udp], "nasos-test".into()).expect("start");
        assert!(sender.send(&alert("bay.BAY07.present")));
        let mut buf = [0u8; 2048];
        let n = rx.recv(&mut buf).expect("a datagram");
        assert!(String::from_utf8_lossy(&buf[..n]).contains("bay.BAY07.present"));
    }

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
