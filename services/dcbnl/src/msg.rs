//! Netlink message encoding and decoding for dcbnl.
//!
//! The encoders reproduce what iproute2's `dcb` (through libmnl) puts on the
//! wire, byte for byte, so that a trace of the appliance can be compared with
//! a trace of the documented `dcb` command: header flags
//! `NLM_F_REQUEST|NLM_F_ACK`, `nlmsg_pid` 0, `struct dcbmsg` with family
//! AF_UNSPEC, `DCB_ATTR_IFNAME` as a NUL-terminated string, nests flagged
//! `NLA_F_NESTED`, and zeroed alignment padding.

use crate::Error;
use crate::consts::*;
use crate::types::{App, Ieee, IeeeEts, IeeePfc};

const NLMSG_HDRLEN: usize = 16;
const DCBMSG_LEN: usize = 4;
const NLA_HDRLEN: usize = 4;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Checks the name the way iproute2's `check_ifname` does, and additionally
/// that it fits IFNAMSIZ, because the kernel would otherwise just answer
/// ENODEV for a name that can never exist.
fn check_ifname(ifname: &str) -> Result<(), Error> {
    let bad = ifname.is_empty()
        || ifname.len() >= IFNAMSIZ
        || ifname.bytes().any(|c| c == 0 || c == b'/' || c == b':' || c.is_ascii_whitespace());
    if bad { Err(Error::InvalidIfname(ifname.to_owned())) } else { Ok(()) }
}

/// Builds one netlink message; mirrors libmnl's incremental API so the
/// resulting layout is the same as `dcb`'s.
struct MsgBuilder {
    buf: Vec<u8>,
}

impl MsgBuilder {
    fn new(msg_type: u16, cmd: u8, seq: u32) -> MsgBuilder {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_len, patched in finish()
        buf.extend_from_slice(&msg_type.to_ne_bytes());
        buf.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid: 0, let the kernel route it
        // struct dcbmsg { dcb_family = AF_UNSPEC, cmd, dcb_pad = 0 }
        buf.extend_from_slice(&[libc::AF_UNSPEC as u8, cmd, 0, 0]);
        MsgBuilder { buf }
    }

    fn put(&mut self, attr_type: u16, payload: &[u8]) {
        let len = NLA_HDRLEN + payload.len();
        // Attribute lengths are u16 on the wire; our payloads are at most a
        // few hundred bytes, so saturating is only a guard.
        self.buf.extend_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_ne_bytes());
        self.buf.extend_from_slice(&attr_type.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.buf.resize(align4(self.buf.len()), 0);
    }

    fn put_strz(&mut self, attr_type: u16, s: &str) {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        self.put(attr_type, &v);
    }

    /// Opens a nest (as libmnl's `mnl_attr_nest_start`, which sets
    /// NLA_F_NESTED) and returns its offset for `nest_end`.
    fn nest_start(&mut self, attr_type: u16) -> usize {
        let at = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&(attr_type | NLA_F_NESTED).to_ne_bytes());
        at
    }

    fn nest_end(&mut self, at: usize) {
        let len = u16::try_from(self.buf.len() - at).unwrap_or(u16::MAX);
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn finish(mut self) -> Vec<u8> {
        let len = u32::try_from(self.buf.len()).unwrap_or(u32::MAX);
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf
    }
}

/// Common prefix of every request `dcb` sends (`dcb_prepare` in dcb.c).
fn prepare(ifname: &str, msg_type: u16, cmd: u8, seq: u32) -> Result<MsgBuilder, Error> {
    check_ifname(ifname)?;
    let mut m = MsgBuilder::new(msg_type, cmd, seq);
    m.put_strz(DCB_ATTR_IFNAME, ifname);
    Ok(m)
}

/// `RTM_GETDCB` / `DCB_CMD_IEEE_GET`: what every `dcb … show` and the
/// read half of `dcb pfc set`, `dcb ets set`, `dcb app replace` send.
pub fn encode_get_request(ifname: &str, seq: u32) -> Result<Vec<u8>, Error> {
    Ok(prepare(ifname, RTM_GETDCB, DCB_CMD_IEEE_GET, seq)?.finish())
}

/// `DCB_CMD_IEEE_SET` with one struct attribute inside `DCB_ATTR_IEEE`
/// (`dcb_set_attribute` in dcb.c).
fn encode_ieee_set_struct(ifname: &str, attr: u16, payload: &[u8], seq: u32) -> Result<Vec<u8>, Error> {
    let mut m = prepare(ifname, RTM_SETDCB, DCB_CMD_IEEE_SET, seq)?;
    let ieee = m.nest_start(DCB_ATTR_IEEE);
    m.put(attr, payload);
    m.nest_end(ieee);
    Ok(m.finish())
}

/// The whole `struct ieee_pfc` is sent, read-modify-write style, as
/// `dcb pfc set` does: fields not being changed (pfc_cap, mbc, delay and even
/// the frame counters) must be the ones just read from the NIC.
pub fn encode_pfc_set(ifname: &str, pfc: &IeeePfc, seq: u32) -> Result<Vec<u8>, Error> {
    encode_ieee_set_struct(ifname, DCB_ATTR_IEEE_PFC, &pfc.to_bytes(), seq)
}

/// Whole `struct ieee_ets`, as `dcb ets set` sends it.
pub fn encode_ets_set(ifname: &str, ets: &IeeeEts, seq: u32) -> Result<Vec<u8>, Error> {
    encode_ieee_set_struct(ifname, DCB_ATTR_IEEE_ETS, &ets.to_bytes(), seq)
}

fn encode_app_table(ifname: &str, cmd: u8, apps: &[App], seq: u32) -> Result<Vec<u8>, Error> {
    let mut m = prepare(ifname, RTM_SETDCB, cmd, seq)?;
    let ieee = m.nest_start(DCB_ATTR_IEEE);
    let table = m.nest_start(DCB_ATTR_IEEE_APP_TABLE);
    for app in apps {
        m.put(DCB_ATTR_IEEE_APP, &app.to_bytes());
    }
    m.nest_end(table);
    m.nest_end(ieee);
    Ok(m.finish())
}

/// `DCB_CMD_IEEE_SET` with an APP table: all entries in one message, in the
/// given order (= `dcb app add` command-line order).
pub fn encode_app_add(ifname: &str, apps: &[App], seq: u32) -> Result<Vec<u8>, Error> {
    encode_app_table(ifname, DCB_CMD_IEEE_SET, apps, seq)
}

/// `DCB_CMD_IEEE_DEL` (still message type RTM_SETDCB) with an APP table;
/// entries must match exactly (selector, protocol and priority).
pub fn encode_app_del(ifname: &str, apps: &[App], seq: u32) -> Result<Vec<u8>, Error> {
    encode_app_table(ifname, DCB_CMD_IEEE_DEL, apps, seq)
}

/// One dcbnl request, as produced by [`crate::plan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Get,
    PfcSet(IeeePfc),
    EtsSet(IeeeEts),
    AppAdd(Vec<App>),
    AppDel(Vec<App>),
}

impl Request {
    pub fn encode(&self, ifname: &str, seq: u32) -> Result<Vec<u8>, Error> {
        match self {
            Request::Get => encode_get_request(ifname, seq),
            Request::PfcSet(p) => encode_pfc_set(ifname, p, seq),
            Request::EtsSet(e) => encode_ets_set(ifname, e, seq),
            Request::AppAdd(a) => encode_app_add(ifname, a, seq),
            Request::AppDel(a) => encode_app_del(ifname, a, seq),
        }
    }

    /// The `dcb` command line (without the leading `dcb`) that, run against
    /// the same current NIC state, sends exactly this message. For PFC and
    /// ETS the fields not named on the command line are the ones read from
    /// the NIC, which is exactly what [`crate::plan`] keeps.
    ///
    /// * `PfcSet`: `pfc set dev X prio-pfc all:off 3:on`
    /// * `EtsSet`: `ets set dev X tc-tsa all:ets tc-bw 0:20 … prio-tc 0:0 …`
    /// * `AppAdd`: `app add dev X dscp-prio 26:3 48:6`
    /// * `AppDel`: `app del dev X dscp-prio 26:5`
    pub fn dcb_args(&self, ifname: &str) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        let mut push = |s: &str| v.push(s.to_owned());
        match self {
            Request::Get => ["app", "show", "dev", ifname].iter().for_each(|s| push(s)),
            Request::PfcSet(p) => {
                ["pfc", "set", "dev", ifname, "prio-pfc", "all:off"].iter().for_each(|s| push(s));
                for prio in 0..IEEE_8021QAZ_MAX_TCS {
                    if p.pfc_en & (1 << prio) != 0 {
                        push(&format!("{prio}:on"));
                    }
                }
            }
            Request::EtsSet(e) => {
                ["ets", "set", "dev", ifname, "tc-tsa"].iter().for_each(|s| push(s));
                if e.tc_tsa.iter().all(|t| *t == e.tc_tsa[0]) {
                    push(&format!("all:{}", tsa_name(e.tc_tsa[0])));
                } else {
                    for (tc, t) in e.tc_tsa.iter().enumerate() {
                        push(&format!("{tc}:{}", tsa_name(*t)));
                    }
                }
                push("tc-bw");
                for (tc, bw) in e.tc_tx_bw.iter().enumerate() {
                    push(&format!("{tc}:{bw}"));
                }
                push("prio-tc");
                for (prio, tc) in e.prio_tc.iter().enumerate() {
                    push(&format!("{prio}:{tc}"));
                }
            }
            Request::AppAdd(apps) | Request::AppDel(apps) => {
                let verb = if matches!(self, Request::AppAdd(_)) { "add" } else { "del" };
                ["app", verb, "dev", ifname].iter().for_each(|s| push(s));
                // dcb puts entries in the message in command-line order, so
                // keep the order and only group consecutive entries that share
                // a keyword.
                let mut last_kw = "";
                for app in apps {
                    let (kw, mapping) = app_mapping(app);
                    if kw != last_kw {
                        push(kw);
                        last_kw = kw;
                    }
                    push(&mapping);
                }
            }
        }
        v
    }
}

fn tsa_name(tsa: u8) -> String {
    match tsa {
        IEEE_8021QAZ_TSA_STRICT => "strict".into(),
        IEEE_8021QAZ_TSA_CB_SHAPER => "cbs".into(),
        IEEE_8021QAZ_TSA_ETS => "ets".into(),
        IEEE_8021QAZ_TSA_VENDOR => "vendor".into(),
        // dcb cannot express other values; show the number for the log.
        other => other.to_string(),
    }
}

/// The `dcb app` keyword and KEY:PRIO mapping for one entry.
fn app_mapping(app: &App) -> (&'static str, String) {
    let p = app.priority;
    match app.selector {
        IEEE_8021QAZ_APP_SEL_ETHERTYPE if app.protocol == 0 => ("default-prio", p.to_string()),
        IEEE_8021QAZ_APP_SEL_ETHERTYPE => ("ethtype-prio", format!("{:#x}:{p}", app.protocol)),
        IEEE_8021QAZ_APP_SEL_STREAM => ("stream-port-prio", format!("{}:{p}", app.protocol)),
        IEEE_8021QAZ_APP_SEL_DGRAM => ("dgram-port-prio", format!("{}:{p}", app.protocol)),
        IEEE_8021QAZ_APP_SEL_ANY => ("port-prio", format!("{}:{p}", app.protocol)),
        IEEE_8021QAZ_APP_SEL_DSCP => ("dscp-prio", format!("{}:{p}", app.protocol)),
        _ => ("unknown-selector", format!("{}/{}:{p}", app.selector, app.protocol)),
    }
}

/// One netlink message borrowed from a received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NlMessage<'a> {
    pub msg_type: u16,
    pub flags: u16,
    pub seq: u32,
    pub pid: u32,
    /// Everything after the 16-byte `struct nlmsghdr`.
    pub payload: &'a [u8],
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Splits a datagram into its netlink messages (the kernel may pack several
/// into one datagram, and our test double does).
pub fn split_messages(buf: &[u8]) -> Result<Vec<NlMessage<'_>>, Error> {
    let mut out = Vec::new();
    let mut rest = buf;
    while !rest.is_empty() {
        if rest.len() < NLMSG_HDRLEN {
            return Err(Error::Malformed(format!("{} trailing bytes, too short for nlmsghdr", rest.len())));
        }
        let len = u32_at(rest, 0) as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            return Err(Error::Malformed(format!("nlmsg_len {len} with {} bytes left", rest.len())));
        }
        out.push(NlMessage {
            msg_type: u16_at(rest, 4),
            flags: u16_at(rest, 6),
            seq: u32_at(rest, 8),
            pid: u32_at(rest, 12),
            payload: &rest[NLMSG_HDRLEN..len],
        });
        rest = &rest[align4(len).min(rest.len())..];
    }
    Ok(out)
}

/// Iterates over (type without flags, payload) of a run of attributes.
fn attrs(mut rest: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), Error>> {
    std::iter::from_fn(move || {
        if rest.len() < NLA_HDRLEN {
            // Fewer than 4 bytes left can only be alignment slack.
            return None;
        }
        let len = u16_at(rest, 0) as usize;
        if len < NLA_HDRLEN || len > rest.len() {
            rest = &[];
            return Some(Err(Error::Malformed(format!("attribute length {len}"))));
        }
        let item = (u16_at(rest, 2) & NLA_TYPE_MASK, &rest[NLA_HDRLEN..len]);
        rest = &rest[align4(len).min(rest.len())..];
        Some(Ok(item))
    })
}

fn dcb_attrs(payload: &[u8]) -> Result<(u8, &[u8]), Error> {
    if payload.len() < DCBMSG_LEN {
        return Err(Error::Malformed("message too short for struct dcbmsg".into()));
    }
    Ok((payload[1], &payload[DCBMSG_LEN..]))
}

/// Decodes the attributes of a `DCB_CMD_IEEE_GET` answer. Attributes we do
/// not model (MAXRATE, QCN, buffers, peer objects, DCBX, PCP app entries of
/// newer kernels) are skipped rather than rejected, since drivers differ in
/// what they report.
fn decode_ieee(payload: &[u8]) -> Result<Ieee, Error> {
    let (_, top) = dcb_attrs(payload)?;
    let mut found = None;
    for a in attrs(top) {
        let (t, p) = a?;
        if t == DCB_ATTR_IEEE {
            found = Some(p);
        }
    }
    let nest = found.ok_or(Error::MissingAttribute("DCB_ATTR_IEEE"))?;
    let mut ieee = Ieee::default();
    for a in attrs(nest) {
        let (t, p) = a?;
        match t {
            DCB_ATTR_IEEE_ETS => ieee.ets = Some(IeeeEts::from_bytes(p)?),
            DCB_ATTR_IEEE_PFC => ieee.pfc = Some(IeeePfc::from_bytes(p)?),
            DCB_ATTR_IEEE_APP_TABLE => {
                for e in attrs(p) {
                    let (et, ep) = e?;
                    if et == DCB_ATTR_IEEE_APP {
                        ieee.apps.push(App::from_bytes(ep)?);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(ieee)
}

/// Converts the dcbnl status byte of a SET/DEL answer. The kernel stores a
/// negative errno into a u8 (`nla_put_u8(skb, DCB_ATTR_IEEE, err)`), so e.g.
/// -EINVAL arrives as 234; small positive values are taken as-is.
fn status_to_result(status: u8) -> Result<(), Error> {
    match status {
        0 => Ok(()),
        s if s >= 128 => Err(Error::from_errno(256 - i32::from(s))),
        s => Err(Error::from_errno(i32::from(s))),
    }
}

/// A decoded kernel answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The `RTM_GETDCB`/`DCB_CMD_IEEE_GET` answer (boxed: it is large and
    /// the other variants are empty).
    Ieee(Box<Ieee>),
    /// An `RTM_SETDCB` answer to IEEE_SET or IEEE_DEL whose status byte was 0.
    SetOk,
    /// NLMSG_ERROR with error 0 (the ack requested by NLM_F_ACK), or NLMSG_DONE.
    Ack,
    /// A message that is not for dcbnl (e.g. NLMSG_NOOP).
    Other,
}

/// Decodes one message. Kernel refusals (NLMSG_ERROR with an errno, non-zero
/// dcbnl status byte) become `Err`, with EOPNOTSUPP as [`Error::NotSupported`].
pub fn decode_reply(msg: &NlMessage<'_>) -> Result<Reply, Error> {
    match msg.msg_type {
        NLMSG_ERROR => {
            if msg.payload.len() < 4 {
                return Err(Error::Malformed("NLMSG_ERROR without error code".into()));
            }
            let err = i32::from_ne_bytes([msg.payload[0], msg.payload[1], msg.payload[2], msg.payload[3]]);
            // Netlink errors are negative errnos; accept either sign as
            // libmnl does.
            if err == 0 { Ok(Reply::Ack) } else { Err(Error::from_errno(err.saturating_abs())) }
        }
        NLMSG_DONE => Ok(Reply::Ack),
        RTM_GETDCB => Ok(Reply::Ieee(Box::new(decode_ieee(msg.payload)?))),
        RTM_SETDCB => {
            let (_, top) = dcb_attrs(msg.payload)?;
            for a in attrs(top) {
                let (t, p) = a?;
                if t == DCB_ATTR_IEEE {
                    if p.len() != 1 {
                        return Err(Error::BadLength { what: "DCB_ATTR_IEEE status", expected: 1, got: p.len() });
                    }
                    status_to_result(p[0])?;
                    return Ok(Reply::SetOk);
                }
            }
            Err(Error::MissingAttribute("DCB_ATTR_IEEE status"))
        }
        _ => Ok(Reply::Other),
    }
}

/// Decodes a complete answer to a GET (answer plus ack, in one buffer) for
/// request `seq`; messages with other sequence numbers are ignored.
pub fn decode_get_response(buf: &[u8], seq: u32) -> Result<Ieee, Error> {
    let mut ieee = None;
    for m in split_messages(buf)?.iter().filter(|m| m.seq == seq) {
        if let Reply::Ieee(i) = decode_reply(m)? {
            ieee = Some(*i);
        }
    }
    ieee.ok_or(Error::MissingAttribute("RTM_GETDCB answer"))
}

/// Decodes a complete answer to a SET/DEL for request `seq`.
pub fn decode_set_response(buf: &[u8], seq: u32) -> Result<(), Error> {
    let mut ok = false;
    for m in split_messages(buf)?.iter().filter(|m| m.seq == seq) {
        if decode_reply(m)? == Reply::SetOk {
            ok = true;
        }
    }
    if ok { Ok(()) } else { Err(Error::MissingAttribute("RTM_SETDCB answer")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
    }

    /// Little-endian byte strings as strace shows them for dcb 6.1 on x86-64.
    #[cfg(target_endian = "little")]
    #[test]
    fn get_request_matches_dcb_trace() {
        // dcb pfc show dev lo, seq 0x6b0d_05f6
        let want = hex("1c000000 4e00 0500 f6050d6b 00000000 00150000 07000100 6c6f0000");
        assert_eq!(encode_get_request("lo", 0x6b0d_05f6).expect("encode"), want);
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn app_messages_match_dcb_trace() {
        // dcb app add dev lo dscp-prio 26:3 48:6 (strace of the host's dcb)
        let add = hex("34000000 4f00 0500 01000000 00000000 00140000 07000100 6c6f0000
             18000d80 14000380 08000100 05031a00 08000100 05063000");
        assert_eq!(encode_app_add("lo", &[App::dscp(26, 3), App::dscp(48, 6)], 1).expect("encode"), add);
        // dcb app del dev lo dscp-prio 26:5
        let del =
            hex("2c000000 4f00 0500 01000000 00000000 001b0000 07000100 6c6f0000 10000d80 0c000380 08000100 05051a00");
        assert_eq!(encode_app_del("lo", &[App::dscp(26, 5)], 1).expect("encode"), del);
    }

    #[test]
    fn pfc_and_ets_set_lengths_and_nesting() {
        let m = encode_pfc_set("eth0", &IeeePfc::default(), 7).expect("encode");
        // 16 hdr + 4 dcbmsg + 12 ifname("eth0\0" padded) + 4 nest + 4 + 136
        assert_eq!(m.len(), 16 + 4 + 12 + 4 + 4 + 136);
        assert_eq!(u32_at(&m, 0) as usize, m.len());
        assert_eq!(u16_at(&m, 4), RTM_SETDCB);
        assert_eq!(m[17], DCB_CMD_IEEE_SET);
        assert_eq!(u16_at(&m, 34), DCB_ATTR_IEEE | NLA_F_NESTED);
        assert_eq!(u16_at(&m, 38), DCB_ATTR_IEEE_PFC);
        let e = encode_ets_set("eth0", &IeeeEts::default(), 7).expect("encode");
        // ETS payload is 59 bytes: attribute length 63, padded to 64.
        assert_eq!(e.len(), 16 + 4 + 12 + 4 + 64);
        assert_eq!(u16_at(&e, 36), 63);
        assert_eq!(e[e.len() - 1], 0);
    }

    #[test]
    fn ifname_is_checked() {
        for bad in ["", "0123456789abcdef", "a/b", "a b", "a:b", "a\0b"] {
            assert!(matches!(encode_get_request(bad, 1), Err(Error::InvalidIfname(_))), "{bad:?}");
        }
        assert!(encode_get_request("0123456789abcde", 1).is_ok());
    }

    /// Builds a kernel-style answer: nests without NLA_F_NESTED, plus
    /// attributes we do not model, which the decoder must skip.
    fn kernel_get_reply(seq: u32, ieee: &Ieee) -> Vec<u8> {
        let mut m = MsgBuilder::new(RTM_GETDCB, DCB_CMD_IEEE_GET, seq);
        m.put_strz(DCB_ATTR_IFNAME, "eth0");
        let n = m.nest_start(DCB_ATTR_IEEE);
        let nest_type_at = n + 2;
        if let Some(e) = &ieee.ets {
            m.put(DCB_ATTR_IEEE_ETS, &e.to_bytes());
        }
        m.put(7 /* DCB_ATTR_IEEE_MAXRATE */, &[0u8; 64]);
        if let Some(p) = &ieee.pfc {
            m.put(DCB_ATTR_IEEE_PFC, &p.to_bytes());
        }
        let t = m.nest_start(DCB_ATTR_IEEE_APP_TABLE);
        for a in &ieee.apps {
            m.put(DCB_ATTR_IEEE_APP, &a.to_bytes());
        }
        m.put(2 /* DCB_ATTR_DCB_APP (PCP), newer kernels */, &[24, 1, 0, 0]);
        m.nest_end(t);
        m.nest_end(n);
        m.put(14 /* DCB_ATTR_DCBX */, &[4]);
        let mut b = m.finish();
        // The kernel uses nla_nest_start_noflag: clear the flags again.
        b[nest_type_at..nest_type_at + 2].copy_from_slice(&DCB_ATTR_IEEE.to_ne_bytes());
        let mut ack = Vec::new();
        ack.extend_from_slice(&36u32.to_ne_bytes());
        ack.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        ack.extend_from_slice(&0x100u16.to_ne_bytes()); // NLM_F_CAPPED
        ack.extend_from_slice(&seq.to_ne_bytes());
        ack.extend_from_slice(&1234u32.to_ne_bytes());
        ack.extend_from_slice(&0i32.to_ne_bytes());
        ack.extend_from_slice(&[0u8; 16]);
        b.extend_from_slice(&ack);
        b
    }

    #[test]
    fn decodes_kernel_style_get_reply() {
        let ieee = Ieee {
            ets: Some(IeeeEts { ets_cap: 8, tc_tx_bw: [100, 0, 0, 0, 0, 0, 0, 0], ..Default::default() }),
            pfc: Some(IeeePfc { pfc_cap: 8, pfc_en: 0x08, delay: 7, ..Default::default() }),
            apps: vec![App::dscp(48, 6), App::dscp(26, 3), App { selector: 1, priority: 2, protocol: 0x8906 }],
        };
        let buf = kernel_get_reply(42, &ieee);
        assert_eq!(decode_get_response(&buf, 42).expect("decode"), ieee);
        let msgs = split_messages(&buf).expect("split");
        assert_eq!(msgs.len(), 2);
        assert_eq!(decode_reply(&msgs[1]).expect("ack"), Reply::Ack);
        // An answer for another request is not taken for ours.
        assert!(matches!(decode_get_response(&buf, 43), Err(Error::MissingAttribute(_))));
    }

    #[test]
    fn get_reply_without_ieee_nest_or_with_bad_struct_is_an_error() {
        let mut m = MsgBuilder::new(RTM_GETDCB, DCB_CMD_IEEE_GET, 1);
        m.put_strz(DCB_ATTR_IFNAME, "eth0");
        let buf = m.finish();
        assert!(matches!(decode_get_response(&buf, 1), Err(Error::MissingAttribute("DCB_ATTR_IEEE"))));

        let mut m = MsgBuilder::new(RTM_GETDCB, DCB_CMD_IEEE_GET, 1);
        let n = m.nest_start(DCB_ATTR_IEEE);
        m.put(DCB_ATTR_IEEE_PFC, &[0u8; 40]);
        m.nest_end(n);
        assert!(matches!(decode_get_response(&m.finish(), 1), Err(Error::BadLength { expected: 136, .. })));

        let mut truncated = encode_get_request("eth0", 1).expect("encode");
        truncated.truncate(20);
        assert!(matches!(split_messages(&truncated), Err(Error::Malformed(_))));
    }

    fn nlmsg_error(seq: u32, err: i32) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&20u32.to_ne_bytes());
        b.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        b.extend_from_slice(&0u16.to_ne_bytes());
        b.extend_from_slice(&seq.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&err.to_ne_bytes());
        b
    }

    fn set_reply(seq: u32, status: u8) -> Vec<u8> {
        let mut m = MsgBuilder::new(RTM_SETDCB, DCB_CMD_IEEE_SET, seq);
        m.put(DCB_ATTR_IEEE, &[status]);
        m.finish()
    }

    #[test]
    fn error_mapping() {
        type Check = fn(&Error) -> bool;
        let cases: [(i32, Check); 6] = [
            (-libc::EOPNOTSUPP, |e| matches!(e, Error::NotSupported)),
            (-ENOTSUPP, |e| matches!(e, Error::NotSupported)),
            (-libc::ENODEV, |e| matches!(e, Error::NoDevice)),
            (-libc::EPERM, |e| matches!(e, Error::PermissionDenied)),
            (-libc::EINVAL, |e| matches!(e, Error::Kernel { errno: libc::EINVAL })),
            (libc::EOPNOTSUPP, |e| matches!(e, Error::NotSupported)),
        ];
        for (err, check) in cases {
            let buf = nlmsg_error(5, err);
            let e = decode_get_response(&buf, 5).expect_err("refusal");
            assert!(check(&e), "{err} gave {e:?}");
            let e = decode_set_response(&buf, 5).expect_err("refusal");
            assert!(check(&e), "{err} gave {e:?}");
        }
        assert_eq!(decode_reply(&split_messages(&nlmsg_error(5, 0)).expect("split")[0]).expect("ack"), Reply::Ack);
    }

    #[test]
    fn set_status_byte_mapping() {
        let mut ok = set_reply(9, 0);
        ok.extend_from_slice(&nlmsg_error(9, 0));
        decode_set_response(&ok, 9).expect("status 0 is success");
        // Driver errors are negative errnos truncated to u8 by the kernel.
        let st = |e: i32| (256 - e) as u8;
        assert!(matches!(decode_set_response(&set_reply(9, st(libc::EOPNOTSUPP)), 9), Err(Error::NotSupported)));
        assert!(matches!(
            decode_set_response(&set_reply(9, st(libc::EEXIST)), 9),
            Err(Error::Kernel { errno: libc::EEXIST })
        ));
        assert!(matches!(
            decode_set_response(&set_reply(9, libc::EINVAL as u8), 9),
            Err(Error::Kernel { errno: libc::EINVAL })
        ));
        let mut m = MsgBuilder::new(RTM_SETDCB, DCB_CMD_IEEE_SET, 9);
        m.put(DCB_ATTR_IEEE, &[0, 0]);
        assert!(matches!(decode_set_response(&m.finish(), 9), Err(Error::BadLength { .. })));
    }

    #[test]
    fn dcb_args_rendering() {
        let pfc = Request::PfcSet(IeeePfc { pfc_en: 0b0000_1000, ..Default::default() });
        assert_eq!(pfc.dcb_args("eth0").join(" "), "pfc set dev eth0 prio-pfc all:off 3:on");
        let ets = Request::EtsSet(IeeeEts {
            tc_tx_bw: [20, 0, 0, 50, 0, 0, 10, 20],
            tc_tsa: [2; 8],
            prio_tc: [0, 1, 2, 3, 4, 5, 6, 7],
            ..Default::default()
        });
        assert_eq!(
            ets.dcb_args("eth0").join(" "),
            "ets set dev eth0 tc-tsa all:ets tc-bw 0:20 1:0 2:0 3:50 4:0 5:0 6:10 7:20 \
             prio-tc 0:0 1:1 2:2 3:3 4:4 5:5 6:6 7:7"
        );
        let add = Request::AppAdd(vec![
            App::dscp(26, 3),
            App::dscp(48, 6),
            App { selector: 1, priority: 5, protocol: 0x8906 },
            App { selector: 1, priority: 1, protocol: 0 },
        ]);
        assert_eq!(
            add.dcb_args("eth0").join(" "),
            "app add dev eth0 dscp-prio 26:3 48:6 ethtype-prio 0x8906:5 default-prio 1"
        );
        let del = Request::AppDel(vec![App::dscp(26, 5)]);
        assert_eq!(del.dcb_args("eth0").join(" "), "app del dev eth0 dscp-prio 26:5");
    }
}
