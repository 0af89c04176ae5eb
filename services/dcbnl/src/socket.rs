//! Real dcbnl I/O over a `NETLINK_ROUTE` socket.
//!
//! Requests go out with `sendto(2)` and answers come in with `recvmsg(2)` —
//! the same calls libmnl (and thus `dcb`) uses — so the LD_PRELOAD test
//! double in `nasos-dcbnl-shim` can stand in for the kernel for this code
//! too, on machines whose NICs have no dcbnl support.

use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::Error;
use crate::msg::{Reply, Request, decode_reply, split_messages};
use crate::plan::{Desired, plan, unmet};
use crate::types::Ieee;

/// Large enough for any dcbnl answer (the kernel builds them in
/// NLMSG_DEFAULT_SIZE buffers, about a page).
const RECV_BUF: usize = 64 * 1024;
/// A dcbnl request is answered synchronously by the driver; waiting longer
/// than this means something is wrong and boot should not hang on it.
const RECV_TIMEOUT_S: libc::time_t = 5;

/// What [`Socket::apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// State read before changing anything.
    pub before: Ieee,
    /// Requests sent, in order (empty: the NIC was already configured).
    pub sent: Vec<Request>,
    /// State read back afterwards (equal to `before` when nothing was sent).
    pub after: Ieee,
}

impl Report {
    pub fn changed(&self) -> bool {
        !self.sent.is_empty()
    }

    /// The equivalent `dcb` command lines, for the boot log.
    pub fn dcb_commands(&self, ifname: &str) -> Vec<String> {
        self.sent.iter().map(|r| format!("dcb {}", r.dcb_args(ifname).join(" "))).collect()
    }
}

/// A netlink socket bound to the kernel's rtnetlink.
#[derive(Debug)]
pub struct Socket {
    fd: OwnedFd,
    /// Our netlink port id; kernel answers carry it in nlmsg_pid.
    portid: u32,
    seq: u32,
}

fn last_os_error() -> Error {
    Error::Io(std::io::Error::last_os_error())
}

fn sockaddr_kernel() -> libc::sockaddr_nl {
    // SAFETY: sockaddr_nl is plain data for which all-zero is valid.
    let mut sa: libc::sockaddr_nl = unsafe { zeroed() };
    sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    sa
}

impl Socket {
    /// Opens and binds the socket. Unprivileged processes may read DCB
    /// state; setting it needs CAP_NET_ADMIN.
    pub fn open() -> Result<Socket, Error> {
        // SAFETY: plain syscall with constant arguments.
        let raw = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE) };
        if raw < 0 {
            return Err(last_os_error());
        }
        // SAFETY: `raw` is a freshly created descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        let tv = libc::timeval { tv_sec: RECV_TIMEOUT_S, tv_usec: 0 };
        // SAFETY: valid fd; option value points to a live timeval of the
        // size passed.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(last_os_error());
        }
        // Error acks then carry only the header of our request, not all of
        // it (dcb sets the same option). Failure is harmless: older kernels.
        let one: libc::c_int = 1;
        // SAFETY: as above, with a c_int option value.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_NETLINK,
                libc::NETLINK_CAP_ACK,
                (&one as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            );
        }

        let sa = sockaddr_kernel();
        // SAFETY: `sa` is a valid sockaddr_nl and the length matches; nl_pid
        // 0 asks the kernel to assign a port id.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_nl).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(last_os_error());
        }
        let mut bound = sockaddr_kernel();
        let mut len = size_of::<libc::sockaddr_nl>() as libc::socklen_t;
        // SAFETY: `bound` and `len` are writable and describe a sockaddr_nl.
        let rc = unsafe { libc::getsockname(fd.as_raw_fd(), (&mut bound as *mut libc::sockaddr_nl).cast(), &mut len) };
        if rc < 0 {
            return Err(last_os_error());
        }
        // Start from the clock like dcb (seq = time(NULL)), so traces of
        // consecutive runs do not reuse sequence numbers.
        let seq = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as u32).unwrap_or(1);
        Ok(Socket { fd, portid: bound.nl_pid, seq })
    }

    /// Reads the NIC's IEEE DCB state (`dcb ets show`, `dcb pfc show`, `dcb
    /// app show` in one request).
    pub fn get(&mut self, ifname: &str) -> Result<Ieee, Error> {
        self.transact(ifname, &Request::Get)?.ok_or(Error::MissingAttribute("RTM_GETDCB answer"))
    }

    /// Sends one request and waits for its ack; returns the IEEE state for
    /// a GET.
    pub fn transact(&mut self, ifname: &str, req: &Request) -> Result<Option<Ieee>, Error> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let msg = req.encode(ifname, seq)?;
        self.send(&msg)?;

        let mut buf = vec![0u8; RECV_BUF];
        let mut ieee = None;
        let mut set_ok = false;
        loop {
            let n = self.recv(&mut buf)?;
            for m in split_messages(&buf[..n])? {
                // Skip anything that is not the answer to this request: a
                // stale ack of an earlier one (dcb leaves those behind, as it
                // stops reading at the answer) or a message from another port.
                if m.seq != seq || (m.pid != 0 && m.pid != self.portid) {
                    continue;
                }
                match decode_reply(&m)? {
                    Reply::Ieee(i) => ieee = Some(*i),
                    Reply::SetOk => set_ok = true,
                    Reply::Ack => {
                        // The ack ends the exchange; an answer must precede it.
                        return match req {
                            Request::Get if ieee.is_none() => Err(Error::MissingAttribute("RTM_GETDCB answer")),
                            Request::Get => Ok(ieee),
                            _ if !set_ok => Err(Error::MissingAttribute("RTM_SETDCB answer")),
                            _ => Ok(None),
                        };
                    }
                    Reply::Other => {}
                }
            }
        }
    }

    fn send(&self, msg: &[u8]) -> Result<(), Error> {
        let sa = sockaddr_kernel();
        loop {
            // SAFETY: `msg` is a live buffer of the given length and `sa` a
            // valid sockaddr_nl of the given size.
            let rc = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    msg.as_ptr().cast(),
                    msg.len(),
                    0,
                    (&sa as *const libc::sockaddr_nl).cast(),
                    size_of::<libc::sockaddr_nl>() as libc::socklen_t,
                )
            };
            if rc >= 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::Io(e));
            }
        }
    }

    /// Receives one datagram from the kernel (nl_pid 0); datagrams from
    /// other netlink ports are dropped.
    fn recv(&self, buf: &mut [u8]) -> Result<usize, Error> {
        loop {
            let mut from = sockaddr_kernel();
            let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
            // SAFETY: msghdr is plain data; all-zero is a valid empty header.
            let mut mh: libc::msghdr = unsafe { zeroed() };
            mh.msg_name = (&mut from as *mut libc::sockaddr_nl).cast();
            mh.msg_namelen = size_of::<libc::sockaddr_nl>() as libc::socklen_t;
            mh.msg_iov = &mut iov;
            mh.msg_iovlen = 1;
            // SAFETY: `mh` points at `from` and `iov`, which point at live
            // buffers of the sizes given; all outlive the call.
            let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut mh, 0) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::Interrupted => continue,
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => return Err(Error::Timeout),
                    _ => return Err(Error::Io(e)),
                }
            }
            if mh.msg_flags & libc::MSG_TRUNC != 0 {
                return Err(Error::Malformed("netlink answer larger than the receive buffer".into()));
            }
            if from.nl_pid != 0 {
                continue;
            }
            return Ok(n as usize);
        }
    }

    /// Brings `ifname` to `desired`: reads the current state, sends only
    /// what differs (see [`plan`]), reads back and checks that the NIC now
    /// reports what was asked for.
    pub fn apply(&mut self, ifname: &str, desired: &Desired) -> Result<Report, Error> {
        let before = self.get(ifname)?;
        let sent = plan(&before, desired)?;
        if sent.is_empty() {
            return Ok(Report { after: before.clone(), before, sent });
        }
        for req in &sent {
            self.transact(ifname, req)?;
        }
        let after = self.get(ifname)?;
        if let Some(why) = unmet(&after, desired) {
            return Err(Error::ReadBackMismatch(why));
        }
        Ok(Report { before, sent, after })
    }
}
