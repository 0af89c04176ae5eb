//! nasos-fabric up: brings the plan's links up (found by MAC or PCI address, renamed to their
//! link name) with MTU, addresses and VLANs, makes RoCE v2 available on the fabric links
//! (a soft-RoCE device on the twin board), and reports DCB where it cannot be applied.
//! Idempotent: running it twice changes nothing.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};
use nasos_board::plan::{DcbMethod, LinkPlan};
use nasos_services::{plan, run, say};

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
    for fl in &fabric.links {
        if let Some(rxe) = &fl.rxe_device {
            let existing = run("rdma", &["link", "show"])?;
            if !existing.lines().any(|l| l.contains(&format!("{rxe}/"))) {
                run("rdma", &["link", "add", rxe, "type", "rxe", "netdev", &fl.link])
                    .context("creating the soft-RoCE device")?;
            }
            wait_active(rxe)?;
            say(format!("{}: RoCE v2 on {rxe} (soft-RoCE), port active", fl.link));
        }
        match fl.dcb {
            DcbMethod::Dcbnl => {
                say(format!("{}: DCB (PFC on priority {}) is configured by dcbnl", fl.link, fabric.lossless_priority))
            }
            DcbMethod::Unsupported => {
                let msg = format!(
                    "{}: PFC/ETS/DSCP not applied: this NIC does not implement DCB (dcbnl); RoCE runs lossy on this link",
                    fl.link
                );
                if fabric.pfc_required {
                    bail!("{msg}, and the recipe requires PFC");
                }
                say(msg);
            }
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

fn wait_active(dev: &str) -> anyhow::Result<()> {
    let state = Path::new("/sys/class/infiniband").join(dev).join("ports/1/state");
    for _ in 0..100 {
        if std::fs::read_to_string(&state).is_ok_and(|s| s.contains("ACTIVE")) {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    bail!("RDMA port {dev}/1 did not become ACTIVE")
}
