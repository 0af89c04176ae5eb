//! RDMA devices as the kernel publishes them under /sys/class/infiniband — the same files
//! libibverbs reads for `ibv_query_port` and `ibv_query_gid`: which device sits on a netdev,
//! its port state, and whether a RoCE v2 GID carries the link's IPv4 address.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub const SYSFS: &str = "/sys/class/infiniband";

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gid {
    pub index: u32,
    pub gid: String,
    /// "RoCE v2", "IB/RoCE v1".
    pub kind: String,
    pub netdev: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Port {
    pub device: String,
    pub port: u32,
    /// "4: ACTIVE".
    pub state: String,
    pub link_layer: String,
    pub active_mtu: String,
    pub gids: Vec<Gid>,
}

impl Port {
    pub fn active(&self) -> bool {
        self.state.contains("ACTIVE")
    }

    /// The RoCE v2 GID that carries `addr` (as an IPv4-mapped IPv6 address).
    pub fn roce_v2_gid_for(&self, addr: Ipv4Addr) -> Option<&Gid> {
        let want = mapped(addr);
        self.gids.iter().find(|g| g.kind == "RoCE v2" && g.gid == want)
    }
}

/// The GID form of an IPv4 address as sysfs prints it: `0000:0000:0000:0000:0000:ffff:0a4d:0001`.
pub fn mapped(addr: Ipv4Addr) -> String {
    let o = addr.octets();
    format!("0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}", o[0], o[1], o[2], o[3])
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Port 1 of every RDMA device whose GIDs (or parent device) belong to `netdev`.
pub fn ports_on(netdev: &str) -> Vec<Port> {
    ports_under(Path::new(SYSFS), netdev)
}

pub fn ports_under(root: &Path, netdev: &str) -> Vec<Port> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else { return out };
    let mut devices: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    devices.sort();
    for dev in devices {
        let name = dev.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let Ok(ports) = std::fs::read_dir(dev.join("ports")) else { continue };
        for p in ports.flatten() {
            let port_no: u32 = p.file_name().to_string_lossy().parse().unwrap_or(0);
            let port = read_port(&name, port_no, &p.path());
            let on_netdev = port.gids.iter().any(|g| g.netdev == netdev)
                || dev.join("device/net").join(netdev).exists()
                || read(&dev.join("parent")) == netdev;
            if on_netdev {
                out.push(port);
            }
        }
    }
    out
}

fn read_port(device: &str, port: u32, dir: &Path) -> Port {
    let mut gids = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir.join("gids")) {
        let mut idx: Vec<u32> =
            entries.flatten().filter_map(|e| e.file_name().to_string_lossy().parse().ok()).collect();
        idx.sort_unstable();
        for i in idx {
            let gid = read(&dir.join("gids").join(i.to_string()));
            // Unused table slots read as zeros (and their type file as an error).
            if gid.is_empty() || gid.chars().all(|c| c == '0' || c == ':') {
                continue;
            }
            gids.push(Gid {
                index: i,
                gid,
                kind: read(&dir.join("gid_attrs/types").join(i.to_string())),
                netdev: read(&dir.join("gid_attrs/ndevs").join(i.to_string())),
            });
        }
    }
    Port {
        device: device.to_string(),
        port,
        state: read(&dir.join("state")),
        link_layer: read(&dir.join("link_layer")),
        active_mtu: read(&dir.join("active_mtu")),
        gids,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(p: &Path, s: &str) {
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, s).expect("write");
    }

    #[test]
    fn the_roce_v2_gid_of_the_links_address_is_found() {
        let root = std::env::temp_dir().join(format!("nasos-rdma-{}", std::process::id()));
        let port = root.join("rxe_data0/ports/1");
        write(&port.join("state"), "4: ACTIVE\n");
        write(&port.join("link_layer"), "Ethernet\n");
        write(&port.join("gids/0"), "fe80:0000:0000:0000:5054:00ff:fe0a:0010\n");
        write(&port.join("gid_attrs/types/0"), "IB/RoCE v1\n");
        write(&port.join("gid_attrs/ndevs/0"), "data0\n");
        write(&port.join("gids/1"), "fe80:0000:0000:0000:5054:00ff:fe0a:0010\n");
        write(&port.join("gid_attrs/types/1"), "RoCE v2\n");
        write(&port.join("gid_attrs/ndevs/1"), "data0\n");
        write(&port.join("gids/2"), "0000:0000:0000:0000:0000:ffff:0a4d:0001\n");
        write(&port.join("gid_attrs/types/2"), "RoCE v2\n");
        write(&port.join("gid_attrs/ndevs/2"), "data0\n");
        write(&port.join("gids/3"), "0000:0000:0000:0000:0000:0000:0000:0000\n");
        let ports = ports_under(&root, "data0");
        assert_eq!(ports.len(), 1);
        let p = &ports[0];
        assert!(p.active());
        assert_eq!(p.gids.len(), 3, "the empty slot is skipped");
        assert_eq!(p.roce_v2_gid_for(Ipv4Addr::new(10, 77, 0, 1)).map(|g| g.index), Some(2));
        assert!(p.roce_v2_gid_for(Ipv4Addr::new(10, 77, 0, 2)).is_none());
        assert!(ports_under(&root, "data1").is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn mapped_addresses_are_printed_as_sysfs_does() {
        assert_eq!(mapped(Ipv4Addr::new(10, 77, 0, 1)), "0000:0000:0000:0000:0000:ffff:0a4d:0001");
    }
}
