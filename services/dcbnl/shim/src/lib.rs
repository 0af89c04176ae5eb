//! A test double of the kernel's dcbnl, loaded with LD_PRELOAD.
//!
//! No virtual NIC implements dcbnl, and `dcb pfc set`/`dcb ets set`/`dcb app
//! replace` give up when the GET they start with is refused, so on a
//! NIC-less build host the kernel can never show us what `dcb` would send.
//! This library interposes `sendto(2)` and `recvmsg(2)`: dcbnl requests
//! (RTM_GETDCB/RTM_SETDCB sent to the kernel on a NETLINK_ROUTE socket) are
//! recorded and answered from an in-memory "NIC"; everything else goes to the
//! real libc functions found with `dlsym(RTLD_NEXT, …)`.
//!
//! The double knows nothing about struct layouts — ETS, PFC and APP entries
//! are opaque byte strings — so it cannot share a layout bug with the code
//! under test.
//!
//! Environment:
//! * `NASOS_DCBNL_SHIM_STATE`: the NIC's initial state,
//!   `ets=HEX;pfc=HEX;app=HEX,HEX,…` (raw C structs in hex; each part
//!   optional; a missing `ets`/`pfc` is not reported, like a driver
//!   without that getter).
//! * `NASOS_DCBNL_SHIM_LOG`: file to which every intercepted request is
//!   appended as one line of hex.
//! * `NASOS_DCBNL_SHIM_SPLIT=1`: send the answer and the ack as two
//!   datagrams, as the kernel does. By default both go in one datagram:
//!   `dcb` stops reading at the answer, so with split datagrams the ack is
//!   left queued and read as the answer to dcb's *next* request, which then
//!   fails whenever time(NULL) (its seq) ticked in between.
//! * `NASOS_DCBNL_SHIM_ERRNO=N`: refuse every dcbnl request with -N, as the
//!   kernel does for virtual NICs (95, EOPNOTSUPP) or unknown names (19).
//! * `NASOS_DCBNL_SHIM_SET_STATUS=N`: the "driver" fails SET/DEL with -N in
//!   the dcbnl status byte.
//! * `NASOS_DCBNL_SHIM_FROZEN=1`: SET/DEL are acknowledged but not applied
//!   (a driver that silently ignores settings).
//!
//! Answers are kernel-like: type RTM_GETDCB for the GET, RTM_SETDCB with a
//! u8 DCB_ATTR_IEEE status for IEEE_SET and IEEE_DEL, nests without
//! NLA_F_NESTED, new APP entries prepended, EEXIST/ENOENT for duplicate adds
//! and deletes of absent entries. It is stricter than the kernel in one way:
//! a SET or DEL not sent as RTM_SETDCB (or a GET not sent as RTM_GETDCB) is
//! refused with EINVAL, to catch encoder mistakes.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::io::Write;
use std::mem::size_of;
use std::sync::{Mutex, MutexGuard, OnceLock};

use libc::{msghdr, size_t, sockaddr, sockaddr_nl, socklen_t, ssize_t};

const RTM_GETDCB: u16 = 78;
const RTM_SETDCB: u16 = 79;
const NLMSG_ERROR: u16 = 2;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CAPPED: u16 = 0x100;
const NLA_TYPE_MASK: u16 = 0x3fff;
const DCB_CMD_IEEE_SET: u8 = 20;
const DCB_CMD_IEEE_GET: u8 = 21;
const DCB_CMD_IEEE_DEL: u8 = 27;
const DCB_ATTR_IFNAME: u16 = 1;
const DCB_ATTR_IEEE: u16 = 13;
const DCB_ATTR_IEEE_ETS: u16 = 1;
const DCB_ATTR_IEEE_PFC: u16 = 2;
const DCB_ATTR_IEEE_APP_TABLE: u16 = 3;
const DCB_ATTR_IEEE_APP: u16 = 1;
/// The kernel's policy sizes (`dcbnl_ieee_policy`): sizeof(struct ieee_ets),
/// sizeof(struct ieee_pfc), sizeof(struct dcb_app).
const ETS_LEN: usize = 59;
const PFC_LEN: usize = 136;
const APP_LEN: usize = 4;

/// The simulated NIC.
#[derive(Default)]
struct Nic {
    ets: Option<Vec<u8>>,
    pfc: Option<Vec<u8>>,
    apps: Vec<Vec<u8>>,
}

struct Config {
    log: Option<String>,
    split: bool,
    errno: Option<i32>,
    set_status: Option<i32>,
    frozen: bool,
}

struct Shim {
    config: Config,
    /// `None` when the state variable could not be parsed: every request is
    /// then refused with EINVAL (and the reason printed once).
    nic: Option<Nic>,
    /// Answers waiting to be read, per socket.
    queues: HashMap<c_int, VecDeque<Vec<u8>>>,
}

fn shim() -> MutexGuard<'static, Shim> {
    static SHIM: OnceLock<Mutex<Shim>> = OnceLock::new();
    let m = SHIM.get_or_init(|| {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let num = |k: &str| env(k).and_then(|v| v.parse::<i32>().ok());
        let nic = match parse_state(&env("NASOS_DCBNL_SHIM_STATE").unwrap_or_default()) {
            Ok(n) => Some(n),
            Err(e) => {
                eprintln!("nasos-dcbnl-shim: bad NASOS_DCBNL_SHIM_STATE: {e}");
                None
            }
        };
        Mutex::new(Shim {
            config: Config {
                log: env("NASOS_DCBNL_SHIM_LOG"),
                split: env("NASOS_DCBNL_SHIM_SPLIT").as_deref() == Some("1"),
                errno: num("NASOS_DCBNL_SHIM_ERRNO"),
                set_status: num("NASOS_DCBNL_SHIM_SET_STATUS"),
                frozen: env("NASOS_DCBNL_SHIM_FROZEN").as_deref() == Some("1"),
            },
            nic,
            queues: HashMap::new(),
        })
    });
    // A panic while holding the lock cannot leave the maps inconsistent in a
    // way that matters for a test double; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn unhex(s: &str) -> Result<Vec<u8>, String> {
    let s = s.trim();
    if !s.len().is_multiple_of(2) {
        return Err(format!("odd-length hex {s:?}"));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2).unwrap_or("?"), 16).map_err(|e| format!("{s:?}: {e}")))
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn parse_state(s: &str) -> Result<Nic, String> {
    let mut nic = Nic::default();
    for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, val) = part.split_once('=').ok_or_else(|| format!("{part:?} is not key=hex"))?;
        match key.trim() {
            "ets" => nic.ets = Some(unhex(val)?),
            "pfc" => nic.pfc = Some(unhex(val)?),
            "app" => {
                for a in val.split(',').filter(|a| !a.trim().is_empty()) {
                    nic.apps.push(unhex(a)?);
                }
            }
            other => return Err(format!("unknown key {other:?}")),
        }
    }
    Ok(nic)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// (type without flags, payload) of each attribute; `None` if malformed.
fn attrs(mut b: &[u8]) -> Option<Vec<(u16, &[u8])>> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let len = u16_at(b, 0) as usize;
        if len < 4 || len > b.len() {
            return None;
        }
        out.push((u16_at(b, 2) & NLA_TYPE_MASK, &b[4..len]));
        b = &b[((len + 3) & !3).min(b.len())..];
    }
    Some(out)
}

fn put_attr(buf: &mut Vec<u8>, t: u16, payload: &[u8]) {
    buf.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    buf.extend_from_slice(&t.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize((buf.len() + 3) & !3, 0);
}

/// nlmsghdr (pid 0: libmnl accepts that, and it marks the kernel) + body.
fn message(msg_type: u16, flags: u16, seq: u32, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(16 + body.len());
    m.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    m.extend_from_slice(&msg_type.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(body);
    m
}

/// NLMSG_ERROR as sent with NETLINK_CAP_ACK: error + the request's header.
fn nlmsg_error(req: &[u8], seq: u32, errno: i32) -> Vec<u8> {
    let mut body = (-errno).to_ne_bytes().to_vec();
    body.extend_from_slice(&req[..16]);
    message(NLMSG_ERROR, NLM_F_CAPPED, seq, &body)
}

fn dcb_body(cmd: u8) -> Vec<u8> {
    vec![libc::AF_UNSPEC as u8, cmd, 0, 0]
}

enum Outcome {
    /// Answer message(s), then the ack if requested.
    Answer(Vec<u8>),
    /// NLMSG_ERROR with this errno, nothing else.
    Refuse(i32),
}

impl Shim {
    /// The kernel's `dcb_doit` for one request.
    fn handle(&mut self, req: &[u8]) -> Outcome {
        if let Some(e) = self.config.errno {
            return Outcome::Refuse(e);
        }
        let Some(nic) = self.nic.as_mut() else { return Outcome::Refuse(libc::EINVAL) };
        let msg_type = u16_at(req, 4);
        let seq = u32_at(req, 8);
        let cmd = req[17];
        let Some(top) = attrs(&req[20..]) else { return Outcome::Refuse(libc::EINVAL) };
        let Some(ifname) = top.iter().find(|(t, _)| *t == DCB_ATTR_IFNAME).map(|(_, p)| *p) else {
            return Outcome::Refuse(libc::EINVAL);
        };
        let ieee = top.iter().find(|(t, _)| *t == DCB_ATTR_IEEE).map(|(_, p)| *p);

        match (cmd, msg_type) {
            (DCB_CMD_IEEE_GET, RTM_GETDCB) => {
                let mut body = dcb_body(DCB_CMD_IEEE_GET);
                put_attr(&mut body, DCB_ATTR_IFNAME, ifname);
                let mut nest = Vec::new();
                if let Some(e) = &nic.ets {
                    put_attr(&mut nest, DCB_ATTR_IEEE_ETS, e);
                }
                if let Some(p) = &nic.pfc {
                    put_attr(&mut nest, DCB_ATTR_IEEE_PFC, p);
                }
                let mut table = Vec::new();
                for a in &nic.apps {
                    put_attr(&mut table, DCB_ATTR_IEEE_APP, a);
                }
                put_attr(&mut nest, DCB_ATTR_IEEE_APP_TABLE, &table);
                put_attr(&mut body, DCB_ATTR_IEEE, &nest);
                Outcome::Answer(message(RTM_GETDCB, 0, seq, &body))
            }
            (DCB_CMD_IEEE_SET | DCB_CMD_IEEE_DEL, RTM_SETDCB) => {
                let Some(ieee) = ieee.and_then(attrs) else { return Outcome::Refuse(libc::EINVAL) };
                let mut work = Nic { ets: nic.ets.clone(), pfc: nic.pfc.clone(), apps: nic.apps.clone() };
                let status = match apply(&mut work, cmd, &ieee) {
                    Ok(()) => self.config.set_status.unwrap_or(0),
                    Err(e) => e,
                };
                if status == 0 && !self.config.frozen {
                    *nic = work;
                }
                let mut body = dcb_body(cmd);
                // The kernel stores the negative errno in a u8.
                put_attr(&mut body, DCB_ATTR_IEEE, &[(-status) as u8]);
                Outcome::Answer(message(RTM_SETDCB, 0, seq, &body))
            }
            (DCB_CMD_IEEE_GET | DCB_CMD_IEEE_SET | DCB_CMD_IEEE_DEL, _) => Outcome::Refuse(libc::EINVAL),
            _ => Outcome::Refuse(libc::EOPNOTSUPP),
        }
    }
}

/// `dcbnl_ieee_set`/`dcbnl_ieee_del` on the opaque state; Err(errno).
fn apply(nic: &mut Nic, cmd: u8, ieee: &[(u16, &[u8])]) -> Result<(), i32> {
    for (t, p) in ieee {
        match (*t, cmd) {
            (DCB_ATTR_IEEE_ETS, DCB_CMD_IEEE_SET) if p.len() == ETS_LEN => nic.ets = Some(p.to_vec()),
            (DCB_ATTR_IEEE_PFC, DCB_CMD_IEEE_SET) if p.len() == PFC_LEN => nic.pfc = Some(p.to_vec()),
            (DCB_ATTR_IEEE_ETS | DCB_ATTR_IEEE_PFC, _) => return Err(libc::EINVAL),
            (DCB_ATTR_IEEE_APP_TABLE, _) => {
                for (at, ap) in attrs(p).ok_or(libc::EINVAL)? {
                    if at != DCB_ATTR_IEEE_APP {
                        continue;
                    }
                    if ap.len() != APP_LEN {
                        return Err(libc::EINVAL);
                    }
                    let pos = nic.apps.iter().position(|a| a.as_slice() == ap);
                    match (cmd, pos) {
                        (DCB_CMD_IEEE_SET, Some(_)) => return Err(libc::EEXIST),
                        // dcb_app_add() does list_add(): newest first.
                        (DCB_CMD_IEEE_SET, None) => nic.apps.insert(0, ap.to_vec()),
                        (_, Some(i)) => {
                            nic.apps.remove(i);
                        }
                        (_, None) => return Err(libc::ENOENT),
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

type SendtoFn = unsafe extern "C" fn(c_int, *const c_void, size_t, c_int, *const sockaddr, socklen_t) -> ssize_t;
type RecvmsgFn = unsafe extern "C" fn(c_int, *mut msghdr, c_int) -> ssize_t;

/// The next definition of `name` after this library (normally libc's).
fn next_symbol(name: &'static std::ffi::CStr, slot: &'static OnceLock<usize>) -> usize {
    *slot.get_or_init(|| {
        // SAFETY: RTLD_NEXT lookup of a NUL-terminated name; the result is
        // only checked for null here.
        unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) as usize }
    })
}

fn real_sendto() -> Option<SendtoFn> {
    static SLOT: OnceLock<usize> = OnceLock::new();
    let p = next_symbol(c"sendto", &SLOT);
    // SAFETY: a non-null result of dlsym("sendto") is libc's sendto, whose C
    // signature is SendtoFn.
    (p != 0).then(|| unsafe { std::mem::transmute::<usize, SendtoFn>(p) })
}

fn real_recvmsg() -> Option<RecvmsgFn> {
    static SLOT: OnceLock<usize> = OnceLock::new();
    let p = next_symbol(c"recvmsg", &SLOT);
    // SAFETY: as for real_sendto, with recvmsg's signature.
    (p != 0).then(|| unsafe { std::mem::transmute::<usize, RecvmsgFn>(p) })
}

/// Is this a request to the kernel on a NETLINK_ROUTE socket?
///
/// # Safety
/// `addr` must be null or point to `addrlen` readable bytes.
unsafe fn is_rtnetlink_to_kernel(fd: c_int, addr: *const sockaddr, addrlen: socklen_t) -> bool {
    if addr.is_null() || (addrlen as usize) < size_of::<sockaddr_nl>() {
        return false;
    }
    // SAFETY: the caller guarantees addrlen readable bytes, checked above to
    // cover a sockaddr_nl; read_unaligned as the pointer may be unaligned.
    let sa = unsafe { std::ptr::read_unaligned(addr.cast::<sockaddr_nl>()) };
    if c_int::from(sa.nl_family) != libc::AF_NETLINK || sa.nl_pid != 0 {
        return false;
    }
    let mut proto: c_int = -1;
    let mut len = size_of::<c_int>() as socklen_t;
    // SAFETY: proto/len are valid out-parameters of the right size.
    let rc = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL, (&mut proto as *mut c_int).cast(), &mut len)
    };
    rc == 0 && proto == libc::NETLINK_ROUTE
}

/// Interposed `sendto(2)`.
///
/// # Safety
/// Same contract as libc's `sendto`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    addr: *const sockaddr,
    addrlen: socklen_t,
) -> ssize_t {
    // SAFETY: forwarded from our caller, who upholds sendto's contract.
    let ours = unsafe { is_rtnetlink_to_kernel(fd, addr, addrlen) } && !buf.is_null() && len >= 20;
    let req: &[u8] = if ours {
        // SAFETY: sendto's contract: `buf` points to `len` readable bytes.
        unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }
    } else {
        &[]
    };
    let nlmsg_len = if ours { u32_at(req, 0) as usize } else { 0 };
    let msg_type = if ours { u16_at(req, 4) } else { 0 };
    if !ours || !(20..=len).contains(&nlmsg_len) || (msg_type != RTM_GETDCB && msg_type != RTM_SETDCB) {
        return match real_sendto() {
            // SAFETY: forwarding the caller's arguments unchanged.
            Some(f) => unsafe { f(fd, buf, len, flags, addr, addrlen) },
            None => {
                // SAFETY: errno location is thread-local and always valid.
                unsafe { *libc::__errno_location() = libc::ENOSYS };
                -1
            }
        };
    }
    let req = &req[..nlmsg_len];
    let mut s = shim();
    if let Some(path) = &s.config.log {
        // Recording is the point of the exercise: report failures loudly.
        let line = format!("{}\n", hex(req));
        let res = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = res {
            eprintln!("nasos-dcbnl-shim: cannot append to {path}: {e}");
        }
    }
    let seq = u32_at(req, 8);
    let wants_ack = u16_at(req, 6) & NLM_F_ACK != 0;
    let datagrams = match s.handle(req) {
        Outcome::Refuse(e) => vec![nlmsg_error(req, seq, e)],
        Outcome::Answer(answer) => {
            let ack = nlmsg_error(req, seq, 0);
            match (wants_ack, s.config.split) {
                (false, _) => vec![answer],
                (true, true) => vec![answer, ack],
                (true, false) => vec![[answer, ack].concat()],
            }
        }
    };
    s.queues.entry(fd).or_default().extend(datagrams);
    len as ssize_t
}

/// Interposed `recvmsg(2)`: serves queued answers, else the real call.
///
/// # Safety
/// Same contract as libc's `recvmsg`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    let datagram = {
        let mut s = shim();
        let q = s.queues.get_mut(&fd);
        match q {
            Some(q) if !q.is_empty() && !msg.is_null() => {
                if flags & libc::MSG_PEEK != 0 {
                    q.front().cloned()
                } else {
                    q.pop_front()
                }
            }
            _ => None,
        }
    };
    let Some(d) = datagram else {
        return match real_recvmsg() {
            // SAFETY: forwarding the caller's arguments unchanged.
            Some(f) => unsafe { f(fd, msg, flags) },
            None => {
                // SAFETY: errno location is thread-local and always valid.
                unsafe { *libc::__errno_location() = libc::ENOSYS };
                -1
            }
        };
    };
    // SAFETY: recvmsg's contract: `msg` (checked non-null above) points to a
    // valid msghdr whose iovecs describe writable buffers and whose
    // msg_name, if non-null, has msg_namelen writable bytes.
    unsafe {
        let m = &mut *msg;
        let mut copied = 0usize;
        for i in 0..m.msg_iovlen {
            let iov = &*m.msg_iov.add(i);
            let n = iov.iov_len.min(d.len() - copied);
            std::ptr::copy_nonoverlapping(d.as_ptr().add(copied), iov.iov_base.cast::<u8>(), n);
            copied += n;
            if copied == d.len() {
                break;
            }
        }
        if !m.msg_name.is_null() && (m.msg_namelen as usize) >= size_of::<sockaddr_nl>() {
            let mut from: sockaddr_nl = std::mem::zeroed();
            from.nl_family = libc::AF_NETLINK as libc::sa_family_t;
            std::ptr::write_unaligned(m.msg_name.cast::<sockaddr_nl>(), from);
        }
        // libmnl insists on this length.
        m.msg_namelen = size_of::<sockaddr_nl>() as socklen_t;
        m.msg_controllen = 0;
        m.msg_flags = if copied < d.len() { libc::MSG_TRUNC } else { 0 };
        if flags & libc::MSG_TRUNC != 0 { d.len() as ssize_t } else { copied as ssize_t }
    }
}
