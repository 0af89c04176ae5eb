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

#[cfg(test)]
mod tests {
    use super::*;

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
