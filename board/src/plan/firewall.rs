//! The box's network surface as an nftables ruleset, derived from the plan alone: every port a
//! link answers on is one the plan serves there, and nothing else answers anywhere. Loaded by
//! the `firewall` service before any link comes up or any service listens.
//!
//! What each link accepts:
//! - NFS (its TCP port) from the client networks of the exports, on every link whose subnets
//!   hold one of those networks and on the fabric links (clients routed to the fabric);
//! - RoCE v2 (UDP 4791) from the clients of RDMA exports on the fabric links — soft-RoCE's
//!   packets pass through the kernel's input path, a RoCE NIC's never do; the RDMA port (20049)
//!   is an RDMA-CM port carried inside RoCE, not an IP port, so it needs no rule of its own;
//! - rpcbind (111) only when the plan runs it (NFSv3);
//! - the metrics port, on the one address the recipe puts it;
//! - SSH (22) from each peer that may replicate here, only from its address, to the address
//!   facing it;
//! - on every link: replies to what the box started (syslog over TCP, DNS-free as it is),
//!   ICMP errors and echo, and IPv6 neighbour discovery.
//!
//! Everything else is dropped and counted (`nasctl firewall` shows the counter).

use std::fmt::Write as _;

use ipnet::IpNet;

use super::Plan;
use crate::board::RdmaKind;

/// RoCE v2's UDP port (IANA).
pub const ROCE_V2_UDP: u16 = 4791;
/// The table nasos owns; nothing else is loaded.
pub const TABLE: &str = "nasos";

/// One accepted flow, for the ruleset and for what `nasctl firewall` and the tests expect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allow {
    pub link: String,
    pub proto: &'static str,
    pub port: u16,
    /// Source networks (empty: any).
    pub from: Vec<String>,
    /// Destination address (empty: any of the link's).
    pub to: Option<String>,
    pub why: String,
}

/// Every accepted flow, link by link in the plan's order.
pub fn allowed(plan: &Plan) -> Vec<Allow> {
    let mut out = Vec::new();
    let fabric: Vec<&str> =
        plan.fabric.as_ref().map(|f| f.links.iter().map(|l| l.link.as_str()).collect()).unwrap_or_default();
    for link in &plan.links {
        let names = interfaces(link);
        let subnets: Vec<IpNet> = names.iter().flat_map(|(_, a)| a.iter().filter_map(|s| s.parse().ok())).collect();
        for (ifname, _) in &names {
            // A tenant's VLAN answers that tenant's clients only, and a tenant with VLANs is
            // answered on them only: a VLAN is what isolates it.
            let vlan_tenant = link.vlans.iter().find(|v| &v.name == ifname).and_then(|v| v.tenant.as_deref());
            let serves = |e: &&super::ExportPlan| match (vlan_tenant, e.tenant.as_deref()) {
                (Some(vt), et) => et == Some(vt),
                (None, Some(et)) => !plan.tenants.iter().any(|t| t.name == et && !t.vlans.is_empty()),
                (None, None) => true,
            };
            if let Some(nfs) = &plan.nfs {
                let on_fabric = fabric.contains(&link.name.as_str());
                let clients = |rdma_only: bool| -> Vec<String> {
                    let mut nets: Vec<String> = nfs
                        .exports
                        .iter()
                        .filter(serves)
                        .filter(|e| !rdma_only || e.rdma)
                        .flat_map(|e| e.clients.iter().map(|c| c.network.clone()))
                        .filter(|n| {
                            on_fabric || n.parse::<IpNet>().is_ok_and(|n| subnets.iter().any(|s| overlaps(s, &n)))
                        })
                        .collect();
                    nets.sort();
                    nets.dedup();
                    nets
                };
                let tcp = clients(false);
                if !tcp.is_empty() {
                    out.push(Allow {
                        link: ifname.clone(),
                        proto: "tcp",
                        port: nfs.tcp_port,
                        from: tcp.clone(),
                        to: None,
                        why: "NFS".into(),
                    });
                    if nfs.rpcbind {
                        for proto in ["tcp", "udp"] {
                            out.push(Allow {
                                link: ifname.clone(),
                                proto,
                                port: 111,
                                from: tcp.clone(),
                                to: None,
                                why: "rpcbind (NFSv3)".into(),
                            });
                        }
                    }
                }
            }
            // RoCE v2 on a fabric link: from its own subnets (RDMA peers on the fabric, the
            // client side of NFS over RDMA too) and from the clients of RDMA exports.
            let roce = plan
                .fabric
                .as_ref()
                .and_then(|f| f.links.iter().find(|l| l.link == link.name))
                .is_some_and(|l| l.rdma != RdmaKind::None);
            if roce {
                let mut from: Vec<String> = subnets.iter().map(|n| n.trunc().to_string()).collect();
                if let Some(nfs) = &plan.nfs {
                    from.extend(
                        nfs.exports
                            .iter()
                            .filter(serves)
                            .filter(|e| e.rdma)
                            .flat_map(|e| e.clients.iter().map(|c| c.network.clone())),
                    );
                }
                from.sort();
                from.dedup();
                out.push(Allow {
                    link: ifname.clone(),
                    proto: "udp",
                    port: ROCE_V2_UDP,
                    from,
                    to: None,
                    why: "RoCE v2 (NFS over RDMA)".into(),
                });
            }
        }
        if let Some(m) = plan.health.metrics {
            let ip = m.ip().to_string();
            if let Some((ifname, _)) =
                names.iter().find(|(_, a)| a.iter().any(|s| s.split('/').next() == Some(ip.as_str())))
            {
                out.push(Allow {
                    link: ifname.clone(),
                    proto: "tcp",
                    port: m.port(),
                    from: Vec::new(),
                    to: Some(ip),
                    why: "Prometheus metrics".into(),
                });
            }
        }
        // SSH, from each peer that may replicate here and only from it, to the address that
        // faces it: its key can do nothing but receive (a forced command).
        for peer in plan.replication.peers.iter().filter(|p| !p.receive.is_empty()) {
            if let Some((ifname, _)) =
                names.iter().find(|(_, a)| a.iter().any(|s| s.split('/').next() == Some(peer.local_address.as_str())))
            {
                out.push(Allow {
                    link: ifname.clone(),
                    proto: "tcp",
                    port: 22,
                    from: vec![format!("{}/{}", peer.address, if peer.address.contains(':') { 128 } else { 32 })],
                    to: Some(peer.local_address.clone()),
                    why: format!("replication from {}", peer.name),
                });
            }
        }
    }
    out.extend(plan.firewall.extra.iter().map(|e| Allow {
        link: e.link.clone(),
        proto: if e.proto == "udp" { "udp" } else { "tcp" },
        port: e.port,
        from: e.from.clone(),
        to: None,
        why: e.why.clone(),
    }));
    out
}

/// The addresses nfsd listens on (TCP and RDMA): those of the interfaces NFS is accepted on, in
/// plan order. Bound there, not to every address, so a link the recipe keeps NFS off (the
/// management port) has no NFS socket at all, firewall or not. Empty: the plan serves no NFS.
pub fn nfs_addresses(plan: &Plan) -> Vec<String> {
    let nfs_links: Vec<String> = allowed(plan).into_iter().filter(|a| a.why == "NFS").map(|a| a.link).collect();
    let mut out: Vec<String> = Vec::new();
    for link in &plan.links {
        for (ifname, addrs) in interfaces(link) {
            if nfs_links.contains(&ifname) {
                for a in addrs {
                    let ip = a.split('/').next().unwrap_or(&a).to_string();
                    if !out.contains(&ip) {
                        out.push(ip);
                    }
                }
            }
        }
    }
    out
}

/// A link's interfaces (itself and its VLANs) with their addresses.
fn interfaces(link: &super::LinkPlan) -> Vec<(String, Vec<String>)> {
    let mut v = vec![(link.name.clone(), link.addresses.clone())];
    v.extend(link.vlans.iter().map(|x| (x.name.clone(), x.addresses.clone())));
    v
}

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// The ruleset for `nft -f`: it replaces nasos's table as one transaction (a bad file changes
/// nothing), and leaves other tables alone.
pub fn ruleset(plan: &Plan) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Written by nasos from the plan: the ports this box answers on, and no others.");
    let _ = writeln!(s, "table inet {TABLE}");
    let _ = writeln!(s, "delete table inet {TABLE}");
    let _ = writeln!(s, "table inet {TABLE} {{");
    // RoCE is not connection-tracked: per-packet conntrack would cost the data path for nothing.
    for (chain, hook) in [("raw_in", "prerouting"), ("raw_out", "output")] {
        let _ = writeln!(s, "\tchain {chain} {{\n\t\ttype filter hook {hook} priority raw; policy accept;");
        let _ = writeln!(s, "\t\tudp dport {ROCE_V2_UDP} notrack\n\t}}");
    }
    let _ = writeln!(s, "\tchain input {{\n\t\ttype filter hook input priority filter; policy drop;");
    let _ = writeln!(s, "\t\tiif \"lo\" accept");
    let _ = writeln!(s, "\t\tct state established,related accept");
    let _ = writeln!(s, "\t\tct state invalid drop");
    let _ = writeln!(
        s,
        "\t\tmeta l4proto icmp icmp type {{ echo-request, destination-unreachable, time-exceeded, parameter-problem }} accept"
    );
    let _ = writeln!(
        s,
        "\t\tmeta l4proto ipv6-icmp icmpv6 type {{ echo-request, destination-unreachable, packet-too-big, time-exceeded, parameter-problem, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert }} accept"
    );
    for a in allowed(plan) {
        let mut rule = format!("\t\tiifname \"{}\"", a.link);
        let (v4, v6): (Vec<&String>, Vec<&String>) = a.from.iter().partition(|n| !n.contains(':'));
        let to =
            a.to.as_ref()
                .map(|ip| if ip.contains(':') { format!(" ip6 daddr {ip}") } else { format!(" ip daddr {ip}") });
        let why: String = a.why.chars().filter(|c| *c != '"' && *c != '\\' && !c.is_control()).collect();
        let tail = format!(" {} dport {} accept comment \"{why}\"", a.proto, a.port);
        if a.from.is_empty() {
            rule.push_str(&to.unwrap_or_default());
            let _ = writeln!(s, "{rule}{tail}");
            continue;
        }
        for (family, nets) in [("ip", v4), ("ip6", v6)] {
            if !nets.is_empty() {
                let set: Vec<&str> = nets.iter().map(|n| n.as_str()).collect();
                let _ = writeln!(
                    s,
                    "{rule} {family} saddr {{ {} }}{}{tail}",
                    set.join(", "),
                    to.clone().unwrap_or_default()
                );
            }
        }
    }
    let _ = writeln!(s, "\t\tcounter comment \"dropped\"\n\t}}");
    let _ = writeln!(s, "\tchain forward {{\n\t\ttype filter hook forward priority filter; policy drop;\n\t}}");
    let _ = writeln!(s, "}}");
    s
}
