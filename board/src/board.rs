//! The board: the hardware an image runs on. Board files live in `board/boards/NAME.toml`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A board file.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Board {
    /// Name and description.
    pub board: BoardInfo,
    /// The processor.
    pub cpu: Cpu,
    /// Main memory.
    pub memory: Memory,
    /// The device the appliance boots from.
    pub boot: BootDevice,
    /// The serial console.
    pub console: SerialConsole,
    /// The hardware watchdog.
    pub watchdog: Watchdog,
    /// Kernel modules and command-line additions this board needs.
    #[serde(default)]
    pub kernel: Kernel,
    /// Firmware and other Debian packages this board needs.
    #[serde(default)]
    pub packages: Vec<String>,
    /// Drive bays.
    pub bays: Vec<Bay>,
    /// Network ports.
    pub ports: Vec<Port>,
}

/// Board identity.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BoardInfo {
    /// Board name, as recipes name it.
    pub name: String,
    /// What this board is, for humans.
    pub description: String,
    /// Whether this board is an emulated twin (QEMU) rather than real hardware.
    #[serde(default)]
    pub emulated: bool,
}

/// The processor.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Cpu {
    /// Marketing name, e.g. `AMD EPYC 7302P`.
    pub model: String,
    /// Physical cores.
    #[schemars(range(min = 1, max = 1024))]
    pub cores: u32,
    /// Hardware threads.
    #[schemars(range(min = 1, max = 2048))]
    pub threads: u32,
    /// NUMA nodes.
    #[schemars(range(min = 1, max = 64))]
    pub numa_nodes: u32,
}

/// Main memory.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Memory {
    /// The most memory the board takes, in GiB.
    #[schemars(range(min = 1, max = 65536))]
    pub max_gib: u32,
    /// Whether the memory is ECC.
    pub ecc: bool,
}

/// The boot device.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BootDevice {
    /// What it is, for humans.
    pub description: String,
    /// How to find it.
    #[serde(rename = "match")]
    pub matcher: DeviceMatch,
}

/// How a device is found on the running system. Exactly one field is set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceMatch {
    /// PCI address of the controller or port, `DDDD:BB:DD.F` (real hardware: the slot path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<String>,
    /// Serial number of an NVMe controller (the emulated twin sets it per bay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// MAC address of a network port (the emulated twin sets it per NIC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// A virtio block device's serial (emulated boot disks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtio_serial: Option<String>,
}

/// The serial console.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SerialConsole {
    /// Kernel device name, e.g. `ttyS0`.
    pub device: String,
    /// Baud rate.
    #[schemars(range(min = 1200, max = 4000000))]
    pub baud: u32,
}

/// The hardware watchdog.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Watchdog {
    /// Kernel driver module.
    pub driver: String,
    /// `/sys/class/watchdog/*/identity` of the right device, to pick it among several.
    pub identity: String,
}

/// Kernel needs of the board.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Kernel {
    /// Modules to load at boot, in order.
    #[serde(default)]
    pub modules: Vec<String>,
    /// Kernel command-line additions, e.g. `iommu=pt`.
    #[serde(default)]
    pub cmdline: Vec<String>,
}

/// A drive bay.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Bay {
    /// Bay name as printed on the chassis, `BAY01`…
    pub name: String,
    /// How to find the drive in this bay.
    #[serde(rename = "match")]
    pub matcher: DeviceMatch,
}

/// A network port.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Port {
    /// Port name, as recipes name it.
    pub name: String,
    /// The card or on-board controller it belongs to, for humans.
    pub card: String,
    /// How to find the port.
    #[serde(rename = "match")]
    pub matcher: DeviceMatch,
    /// Link speed in Mb/s.
    #[schemars(range(min = 10, max = 800000))]
    pub speed_mbps: u32,
    /// Largest MTU the port takes.
    #[schemars(range(min = 576, max = 16128))]
    pub max_mtu: u32,
    /// Kernel driver of the Ethernet function.
    pub driver: String,
    /// RDMA capability.
    pub rdma: RdmaKind,
    /// Whether the NIC implements DCB (PFC/ETS/APP) through dcbnl.
    pub dcb: bool,
}

/// RDMA capability of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RdmaKind {
    /// No RDMA.
    None,
    /// Soft-RoCE (`rdma_rxe`) on top of the Ethernet port: the emulated twin.
    SoftRoce,
    /// Intel E810 RoCE v2 (`irdma`).
    Irdma,
    /// NVIDIA ConnectX RoCE v2 (`mlx5_ib`).
    Mlx5,
}

impl RdmaKind {
    /// Kernel modules that provide RDMA on this port.
    pub fn modules(self) -> &'static [&'static str] {
        match self {
            RdmaKind::None => &[],
            RdmaKind::SoftRoce => &["rdma_rxe"],
            RdmaKind::Irdma => &["irdma"],
            RdmaKind::Mlx5 => &["mlx5_ib"],
        }
    }

    pub fn is_rdma(self) -> bool {
        self != RdmaKind::None
    }
}
