//! nasos-fabric up: brings the plan's links up (found by MAC or PCI address, renamed to their
//! link name) with MTU, addresses and VLANs, makes RoCE v2 available on the fabric links
//! (a soft-RoCE device on the twin board) and checks its port is active with a RoCE v2 GID for
//! the link's address, then applies PFC, ETS and the DSCP APP table through dcbnl, reading them
//! back. Where the NIC has no dcbnl it says so plainly, and fails only if the recipe requires PFC.
//! Idempotent: running it twice changes nothing.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};
use nasos_board::plan::{FabricPlan, LinkPlan};
use nasos_services::{plan, rdma, run, say};

fn main() -> ExitCode {
    nasos_services::main("fabric", &["up"], |_| up())
}

fn up() -> anyhow::Result<()> {
    let plan = plan()?;
    run("ip", &["link", "set", "lo", "up"])?;
    for link in &plan.links {
        bring_up(link)?;
    }
    let Some(fabric) = &plan.fabric else { return Ok(()) };
    // Every link is brought as far as it goes: one port without RoCE must not keep the others
    // (or NFS over TCP, which starts after fabric) down. Only a PFC the recipe requires is fatal.
    let mut fatal = Vec::new();
    for fl in &fabric.links {
        if let Some(rxe) = fl.rxe_device.as_ref().filter(|r| !Path::new(rdma::SYSFS).join(r).exists())
            && let Err(e) = run("rdma", &["link", "add", rxe, "type", "rxe", "netdev", &fl.link])
        {
            say(format!("{}: creating the soft-RoCE device {rxe} failed: {e:#}", fl.link));
        }
        let link = plan.links.iter().find(|l| l.name == fl.link);
        if let Err(e) = check_roce(&fl.link, link.map(|l| l.addresses.as_slice()).unwrap_or_default()) {
            say(format!("{e:#}; RDMA clients cannot use this link until it is fixed (TCP still serves)"));
        }
        if let Err(e) = apply_dcb(&fl.link, fabric) {
            say(format!("{e:#}"));
            fatal.push(fl.link.clone());
        }
    }
    if !fatal.is_empty() {
        bail!("PFC is required by the recipe and could not be applied on {}", fatal.join(", "));
    }
    Ok(())
}

/// Waits for the link's RDMA port to be ACTIVE with a RoCE v2 GID for each IPv4 address: what
/// a client's RDMA CM resolves to. The GID table fills in shortly after addresses are set.
fn check_roce(link: &str, addresses: &[String]) -> anyhow::Result<()> {
    let want: Vec<std::net::Ipv4Addr> =
        addresses.iter().filter_map(|a| a.split('/').next().and_then(|ip| ip.parse().ok())).collect();
    let mut last = None;
    for _ in 0..100 {
        let ports = rdma::ports_on(link);
        if let Some(p) = ports.iter().find(|p| p.active() && want.iter().all(|a| p.roce_v2_gid_for(*a).is_some())) {
            let gids: Vec<String> =
                want.iter().filter_map(|a| p.roce_v2_gid_for(*a).map(|g| format!("{a} at GID {}", g.index))).collect();
            say(format!(
                "{link}: RoCE v2 on {}/{} ({}), port active, {}",
                p.device,
                p.port,
                p.link_layer,
                if gids.is_empty() { "no IPv4 address".to_string() } else { gids.join(", ") }
            ));
            return Ok(());
        }
        last = ports.into_iter().next();
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    match last {
        None => bail!("{link}: no RDMA device is bound to this link (is its RDMA driver loaded?)"),
        Some(p) if !p.active() => bail!("{link}: RDMA port {}/{} is {}, not ACTIVE", p.device, p.port, p.state),
        Some(p) => bail!(
            "{link}: RDMA port {}/{} has no RoCE v2 GID for {}; GIDs: {}",
            p.device,
            p.port,
            want.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", "),
            p.gids.iter().map(|g| format!("{} {} ({})", g.index, g.gid, g.kind)).collect::<Vec<_>>().join("; ")
        ),
    }
}

/// PFC on the lossless priority, ETS shares and the DSCP APP table through dcbnl.
fn apply_dcb(link: &str, fabric: &FabricPlan) -> anyhow::Result<()> {
    let desired = nasos_dcbnl::Desired {
        lossless_priority: fabric.lossless_priority,
        ets_bandwidth: fabric.ets_bandwidth,
        dscp: fabric.dscp.iter().map(|d| (d.dscp, d.priority)).collect(),
    };
    let result = nasos_dcbnl::Socket::open().and_then(|mut s| s.apply(link, &desired));
    match result {
        Ok(report) if report.changed() => {
            say(format!("{link}: DCB applied and read back: {}", report.dcb_commands(link).join("; ")))
        }
        Ok(_) => say(format!("{link}: DCB already as planned (PFC on priority {})", fabric.lossless_priority)),
        Err(nasos_dcbnl::Error::NotSupported) => {
            let msg = format!(
                "{link}: PFC/ETS/DSCP not applied: this NIC does not implement DCB (dcbnl answered \
                 \"not supported\"); RoCE runs lossy on this link"
            );
            if fabric.pfc_required {
                bail!("{msg}, and the recipe requires PFC");
            }
            say(msg);
        }
        Err(e) => {
            let driver = std::fs::read_link(format!("/sys/class/net/{link}/device/driver"))
                .ok()
                .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
                .unwrap_or_default();
            // The E810's firmware runs its own DCBX agent and refuses host DCB while it does.
            let hint = if driver == "ice" {
                format!(
                    " (Intel E810: host DCB needs the firmware LLDP agent off: ethtool --set-priv-flags {link} fw-lldp-agent off)"
                )
            } else {
                String::new()
            };
            let msg = format!("{link}: applying DCB through dcbnl failed: {e}{hint}");
            if fabric.pfc_required {
                bail!(msg);
            }
            say(msg);
        }
    }
    Ok(())
}

/// Finds the interface for a link, renames it, and configures it.
fn bring_up(link: &LinkPlan) -> anyhow::Result<()> {
    let current = find_interface(link)
        .with_context(|| format!("no interface matches link {} (port {})", link.name, link.port))?;
    if current != link.name {
        run("ip", &["link", "set", "dev", &current, "down"])?;
        run("ip", &["link", "set", "dev", &current, "name", &link.name])?;
    }
    run("ip", &["link", "set", "dev", &link.name, "mtu", &link.mtu.to_string(), "up"])?;
    for a in &link.addresses {
        run("ip", &["addr", "replace", a, "dev", &link.name])?;
    }
    for v in &link.vlans {
        if !Path::new("/sys/class/net").join(&v.name).exists() {
            run("ip", &["link", "add", "link", &link.name, "name", &v.name, "type", "vlan", "id", &v.id.to_string()])?;
        }
        run("ip", &["link", "set", "dev", &v.name, "up"])?;
        for a in &v.addresses {
            run("ip", &["addr", "replace", a, "dev", &v.name])?;
        }
    }
    say(format!("{}: up, mtu {}, {}", link.name, link.mtu, link.addresses.join(" ")));
    Ok(())
}

fn find_interface(link: &LinkPlan) -> Option<String> {
    for e in std::fs::read_dir("/sys/class/net").ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let mac = std::fs::read_to_string(e.path().join("address")).unwrap_or_default();
        let pci = std::fs::read_link(e.path().join("device"))
            .ok()
            .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()));
        let by_mac = link.matcher.mac.as_ref().is_some_and(|m| m.eq_ignore_ascii_case(mac.trim()));
        let by_pci = link.matcher.pci.as_ref().is_some_and(|p| pci.as_deref() == Some(p.as_str()));
        if by_mac || by_pci {
            return Some(name);
        }
    }
    None
}
