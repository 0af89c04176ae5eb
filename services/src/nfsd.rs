//! What the kernel NFS server is doing now, read from its own files: the listeners in
//! /proc/fs/nfsd/portlist, the thread count, and the export table mountd gave the kernel
//! (/var/lib/nfs/etab) — not what the plan wished for.

use serde::{Deserialize, Serialize};

pub const NFSD_FS: &str = "/proc/fs/nfsd";
pub const ETAB: &str = "/var/lib/nfs/etab";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listener {
    pub transport: String,
    pub port: u16,
}

/// One client line of the export table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExportEntry {
    pub path: String,
    pub client: String,
    pub options: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NfsState {
    pub threads: u32,
    pub listeners: Vec<Listener>,
    pub exports: Vec<ExportEntry>,
}

/// Parses portlist lines such as `rdma 20049` and `tcp 2049`.
pub fn parse_portlist(text: &str) -> Vec<Listener> {
    text.lines()
        .filter_map(|l| {
            let (t, p) = l.trim().split_once(' ')?;
            Some(Listener { transport: t.to_string(), port: p.trim().parse().ok()? })
        })
        .collect()
}

/// Parses etab lines: `PATH<TAB>CLIENT(opt,opt,...)`.
pub fn parse_etab(text: &str) -> Vec<ExportEntry> {
    text.lines()
        .filter_map(|l| {
            let (path, rest) = l.split_once(char::is_whitespace)?;
            let rest = rest.trim();
            let (client, opts) = match rest.split_once('(') {
                Some((c, o)) => (c, o.trim_end_matches(')')),
                None => (rest, ""),
            };
            Some(ExportEntry {
                path: path.to_string(),
                client: client.to_string(),
                options: {
                    // mountd writes some options twice; each is kept once, in first order.
                    let mut seen = std::collections::HashSet::new();
                    opts.split(',').filter(|o| !o.is_empty() && seen.insert(*o)).map(str::to_string).collect()
                },
            })
        })
        .collect()
}

/// The listeners, each once: portlist has a line per address family (IPv4 and IPv6).
pub fn listeners() -> Vec<Listener> {
    let mut l = parse_portlist(&std::fs::read_to_string(format!("{NFSD_FS}/portlist")).unwrap_or_default());
    let mut seen = std::collections::HashSet::new();
    l.retain(|x| seen.insert((x.transport.clone(), x.port)));
    l
}

pub fn threads() -> u32 {
    std::fs::read_to_string(format!("{NFSD_FS}/threads")).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0)
}

pub fn state() -> NfsState {
    NfsState {
        threads: threads(),
        listeners: listeners(),
        exports: parse_etab(&std::fs::read_to_string(ETAB).unwrap_or_default()),
    }
}

/// Makes nfsd listen on `transport port` (e.g. rdma 20049) unless it does; returns whether it
/// had to add it. An error means the listener is still missing afterwards.
pub fn ensure_listener(transport: &str, port: u16) -> Result<bool, String> {
    if has_listener(&listeners(), transport, port) {
        return Ok(false);
    }
    std::fs::write(format!("{NFSD_FS}/portlist"), format!("{transport} {port}\n"))
        .map_err(|e| format!("adding the {transport} {port} listener: {e}"))?;
    if has_listener(&listeners(), transport, port) {
        Ok(true)
    } else {
        Err(format!("nfsd accepted {transport} {port} but does not list it"))
    }
}

pub fn has_listener(list: &[Listener], transport: &str, port: u16) -> bool {
    list.iter().any(|l| l.transport == transport && l.port == port)
}

/// The listeners nfsd should have when bound to `addresses`, as `nfsdctl listener` writes them:
/// `tcp:10.77.0.1:2049`, `rdma:[fd00::1]:20049`.
pub fn bound_listeners(addresses: &[String], tcp: u16, rdma: Option<u16>) -> Vec<String> {
    let host = |a: &str| if a.contains(':') { format!("[{a}]") } else { a.to_string() };
    let mut out: Vec<String> = addresses.iter().map(|a| format!("tcp:{}:{tcp}", host(a))).collect();
    if let Some(p) = rdma {
        out.extend(addresses.iter().map(|a| format!("rdma:{}:{p}", host(a))));
    }
    out
}

/// `nfsdctl listener`'s lines (`transport:address:port`), sorted.
pub fn parse_nfsdctl_listeners(text: &str) -> Vec<String> {
    let mut v: Vec<String> =
        text.lines().map(str::trim).filter(|l| l.matches(':').count() >= 2).map(str::to_string).collect();
    v.sort();
    v
}

/// The local addresses of the TCP sockets listening on `port`, from /proc/net/tcp and tcp6
/// (`0.0.0.0` or `::` when bound to every address).
pub fn tcp_listening_on(port: u16) -> Vec<std::net::IpAddr> {
    let mut out = Vec::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        out.extend(parse_proc_net_tcp(&std::fs::read_to_string(f).unwrap_or_default(), port));
    }
    out
}

/// Parses /proc/net/tcp{,6}: `sl local_address rem_address st …`, addresses as hex in the
/// kernel's byte order (each 32-bit word little-endian), the port big-endian hex, st 0A = LISTEN.
pub fn parse_proc_net_tcp(text: &str, port: u16) -> Vec<std::net::IpAddr> {
    let word = |h: &str| u32::from_str_radix(h, 16).ok().map(|w| w.to_le_bytes());
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let local = f.nth(1)?;
            let state = f.nth(1)?;
            if state != "0A" {
                return None;
            }
            let (addr, p) = local.split_once(':')?;
            if u16::from_str_radix(p, 16).ok()? != port {
                return None;
            }
            match addr.len() {
                8 => Some(std::net::IpAddr::from(word(addr)?)),
                32 => {
                    let mut b = [0u8; 16];
                    for i in 0..4 {
                        b[i * 4..i * 4 + 4].copy_from_slice(&word(&addr[i * 8..i * 8 + 8])?);
                    }
                    Some(std::net::IpAddr::from(b))
                }
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_are_bound_to_each_address() {
        let want = bound_listeners(&["10.77.0.1".into(), "fd00::1".into()], 2049, Some(20049));
        assert_eq!(want, ["tcp:10.77.0.1:2049", "tcp:[fd00::1]:2049", "rdma:10.77.0.1:20049", "rdma:[fd00::1]:20049"]);
        assert_eq!(bound_listeners(&["10.0.0.1".into()], 2049, None), ["tcp:10.0.0.1:2049"]);
        // As nfsdctl 2.8.3 prints them.
        let have = parse_nfsdctl_listeners("rdma:10.77.0.1:20049\ntcp:10.77.0.1:2049\n\nnfsdctl: noise\n");
        assert_eq!(have, ["rdma:10.77.0.1:20049", "tcp:10.77.0.1:2049"]);
    }

    #[test]
    fn listening_sockets_are_read_with_their_addresses() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 01004D0A:0801 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 00000000:2384 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0
   2: 01004D0A:0801 82004D0A:03FF 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 100 0 0 10 0
";
        assert_eq!(parse_proc_net_tcp(v4, 2049), vec![std::net::IpAddr::from([10, 77, 0, 1])]);
        assert_eq!(parse_proc_net_tcp(v4, 9092), vec![std::net::IpAddr::from([0, 0, 0, 0])]);
        let v6 = "  sl  local_address                         remote_address                        st
   0: 00000000000000000000000000000000:0801 00000000000000000000000000000000:0000 0A 0
";
        assert_eq!(parse_proc_net_tcp(v6, 2049), vec!["::".parse::<std::net::IpAddr>().expect("ip")]);
    }

    #[test]
    fn portlist_is_parsed() {
        let l = parse_portlist("rdma 20049\ntcp 2049\n\ngarbage\n");
        assert_eq!(
            l,
            vec![Listener { transport: "rdma".into(), port: 20049 }, Listener { transport: "tcp".into(), port: 2049 }]
        );
        assert!(has_listener(&l, "rdma", 20049));
        assert!(!has_listener(&l, "rdma", 2049));
    }

    #[test]
    fn etab_lines_are_parsed() {
        let e = parse_etab(
            "/export/tank/train\t10.77.0.0/24(rw,sync,wdelay,hide,nocrossmnt,secure,root_squash,no_all_squash,sec=sys,rw,secure,root_squash)\n",
        );
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].path, "/export/tank/train");
        assert_eq!(e[0].client, "10.77.0.0/24");
        assert!(e[0].options.contains(&"root_squash".to_string()) && e[0].options[0] == "rw");
        assert_eq!(e[0].options.iter().filter(|o| *o == "root_squash").count(), 1, "{:?}", e[0].options);
    }
}
