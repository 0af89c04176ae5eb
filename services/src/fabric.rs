//! Fabric bring-up: finds the plan's links (by MAC or PCI address, renamed to their link name)
//! with MTU, addresses and VLANs, checks the negotiated speed against the board's, makes RoCE v2
//! available on the fabric links (a soft-RoCE device on the twin board) and checks its port is
//! active with a RoCE v2 GID for the link's address, then applies PFC, ETS and the DSCP APP table
//! through dcbnl, reading them back. Where the NIC has no dcbnl it says so plainly, and fails only
//! if the recipe requires PFC. Idempotent: running it twice changes nothing.
//!
//! Reads of `/sys/class/net` go through a root directory, so host tests use a fixture tree.

use std::path::Path;

use anyhow::{Context, bail};
use nasos_board::Plan;
use nasos_board::plan::{DcbMethod, FabricPlan, LinkPlan};

use crate::{rdma, run, say};

/// Where the kernel lists network interfaces.
pub const SYS_CLASS_NET: &str = "/sys/class/net";

/// Brings up every link of the plan, then RoCE and DCB on the fabric links.
pub fn up(plan: &Plan) -> anyhow::Result<()> {
    let net = Path::new(SYS_CLASS_NET);
    run("ip", &["link", "set", "lo", "up"])?;
    for link in &plan.links {
        bring_up(net, link)?;
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
        if fl.dcb == DcbMethod::Unsupported {
            // Validation refuses pfc_required on such a port, so this is never fatal.
            say(format!(
                "{}: PFC/ETS/DSCP not applied: the board says this port has no DCB; RoCE runs lossy on this link",
                fl.link
            ));
            continue;
        }
        if let Err(e) = apply_dcb(net, &fl.link, fabric) {
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
fn apply_dcb(net: &Path, link: &str, fabric: &FabricPlan) -> anyhow::Result<()> {
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
            let hint = dcb_hint(link, driver(net, link).as_deref());
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
fn bring_up(net: &Path, link: &LinkPlan) -> anyhow::Result<()> {
    let found = || {
        find_interface(net, link)
            .with_context(|| format!("no interface matches link {} (port {})", link.name, link.port))
    };
    // nasos alone names the links: the image masks udev's naming rule (80-net-setup-link.rules,
    // see `paths::MASKED_UDEV_RULES`), so a NIC renamed here keeps its link name however late
    // udev handles its add event, and bring-up does not wait for udev.
    let current = found()?;
    if current != link.name {
        run("ip", &["link", "set", "dev", &current, "down"])?;
        run("ip", &["link", "set", "dev", &current, "name", &link.name])?;
    }
    run("ip", &["link", "set", "dev", &link.name, "mtu", &link.mtu.to_string(), "up"])?;
    for a in &link.addresses {
        run("ip", &["addr", "replace", a, "dev", &link.name])?;
    }
    for v in &link.vlans {
        if !net.join(&v.name).exists() {
            run("ip", &["link", "add", "link", &link.name, "name", &v.name, "type", "vlan", "id", &v.id.to_string()])?;
        }
        run("ip", &["link", "set", "dev", &v.name, "up"])?;
        for a in &v.addresses {
            run("ip", &["addr", "replace", a, "dev", &v.name])?;
        }
    }
    say(format!("{}: up, mtu {}, {}", link.name, link.mtu, link.addresses.join(" ")));
    // Negotiation takes a moment after the link comes up, and the speed is known once the carrier
    // is: wait for that (up to 2 s), not for a speed a virtual NIC never reports.
    for _ in 0..20 {
        if carrier(net, &link.name) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    say(speed_finding(link, read_speed(net, &link.name)));
    Ok(())
}

/// Whether the link has its carrier (the file reads "1"; a link that is down refuses the read).
fn carrier(net: &Path, name: &str) -> bool {
    std::fs::read_to_string(net.join(name).join("carrier")).is_ok_and(|c| c.trim() == "1")
}

/// The negotiated speed in Mb/s, `None` when the driver reports none (virtual NICs, link down).
pub fn read_speed(net: &Path, name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(net.join(name).join("speed")).ok()?;
    // -1 (or 4294967295 from older kernels) means unknown.
    text.trim().parse::<i64>().ok().filter(|s| *s > 0 && *s != i64::from(u32::MAX)).map(|s| s as u64)
}

/// What to say about a link's negotiated speed against the speed of its port on the board.
pub fn speed_finding(link: &LinkPlan, negotiated: Option<u64>) -> String {
    let want = link.speed_mbps;
    match negotiated {
        None => format!(
            "{}: the NIC reports no negotiated speed (expected {want} Mb/s); it cannot be checked on this NIC",
            link.name
        ),
        Some(s) if u64::from(want) > s => format!(
            "{}: negotiated {s} Mb/s, below the {want} Mb/s of port {}: check the cable, transceiver and switch port",
            link.name, link.port
        ),
        Some(s) => format!("{}: negotiated {s} Mb/s (port {} is {want} Mb/s)", link.name, link.port),
    }
}

/// The kernel driver bound to an interface (`ice`, `mlx5_core`, `virtio_net`).
pub fn driver(net: &Path, name: &str) -> Option<String> {
    std::fs::read_link(net.join(name).join("device/driver")).ok()?.file_name().map(|f| f.to_string_lossy().into_owned())
}

/// What to add to a DCB failure for a NIC whose firmware is known to get in the way.
pub fn dcb_hint(link: &str, driver: Option<&str>) -> String {
    // The E810's firmware runs its own DCBX agent and refuses host DCB while it does.
    if driver == Some("ice") {
        format!(
            " (Intel E810: host DCB needs the firmware LLDP agent off: ethtool --set-priv-flags {link} fw-lldp-agent off)"
        )
    } else {
        String::new()
    }
}

/// The interface a link of the plan is: by MAC address or by PCI address, never by kernel name.
pub fn find_interface(net: &Path, link: &LinkPlan) -> Option<String> {
    for e in std::fs::read_dir(net).ok()?.flatten() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use nasos_board::board::DeviceMatch;

    fn link(name: &str, mac: Option<&str>, pci: Option<&str>) -> LinkPlan {
        LinkPlan {
            name: name.into(),
            port: "roce0".into(),
            speed_mbps: 100_000,
            driver: "ice".into(),
            matcher: DeviceMatch { mac: mac.map(String::from), pci: pci.map(String::from), ..Default::default() },
            mtu: 9000,
            addresses: vec!["10.40.0.10/23".into()],
            vlans: Vec::new(),
        }
    }

    fn fixture() -> std::path::PathBuf {
        let t = std::env::temp_dir().join(format!("nasos-fabric-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        for (ifname, mac, pci, speed) in [
            ("eth0", "52:54:00:aa:00:01", "0000:00:03.0", "-1"),
            ("enp193s0f0", "b4:96:91:00:00:01", "0000:c1:00.0", "25000"),
        ] {
            let d = t.join(ifname);
            std::fs::create_dir_all(&d).expect("fixture");
            std::fs::write(d.join("address"), format!("{mac}\n")).expect("fixture");
            std::fs::write(d.join("speed"), format!("{speed}\n")).expect("fixture");
            let dev = t.join("devices").join(pci);
            std::fs::create_dir_all(&dev).expect("fixture");
            std::os::unix::fs::symlink(&dev, d.join("device")).expect("fixture");
        }
        t
    }

    #[test]
    fn links_are_found_by_mac_or_pci_and_their_speed_is_checked() {
        let net = fixture();
        assert_eq!(find_interface(&net, &link("data0", Some("52:54:00:AA:00:01"), None)).as_deref(), Some("eth0"));
        let e810 = link("data1", None, Some("0000:c1:00.0"));
        assert_eq!(find_interface(&net, &e810).as_deref(), Some("enp193s0f0"));
        assert_eq!(find_interface(&net, &link("x", Some("00:00:00:00:00:00"), None)), None);

        assert_eq!(read_speed(&net, "eth0"), None, "virtio says -1");
        assert_eq!(read_speed(&net, "enp193s0f0"), Some(25_000));
        let slow = speed_finding(&e810, read_speed(&net, "enp193s0f0"));
        assert!(slow.contains("negotiated 25000 Mb/s, below the 100000 Mb/s of port roce0"), "{slow}");
        assert!(speed_finding(&e810, Some(100_000)).ends_with("negotiated 100000 Mb/s (port roce0 is 100000 Mb/s)"));
        assert!(speed_finding(&e810, None).contains("reports no negotiated speed"));
        let _ = std::fs::remove_dir_all(&net);
    }

    #[test]
    fn an_e810_refusing_dcb_names_its_firmware_agent() {
        assert!(dcb_hint("data0", Some("ice")).contains("fw-lldp-agent off"));
        assert_eq!(dcb_hint("data0", Some("mlx5_core")), "");
    }
}
