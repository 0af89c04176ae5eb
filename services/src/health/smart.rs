//! An NVMe drive's SMART / Health Information log page (log id 02h), read with one admin
//! command through the kernel's passthrough ioctl — no tool is spawned, so checks and metrics
//! can read every bay cheaply. The layout is the NVMe base specification's (figure "SMART /
//! Health Information Log Page"); `fixtures/smart-log-bay03.*` hold a page as the kernel
//! returned it and what `nvme smart-log -o json` made of the same page.

use std::os::fd::AsRawFd;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The fields health checks and metrics use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmartLog {
    /// Critical warning bits: 0 spare under threshold, 1 temperature, 2 reliability degraded,
    /// 3 read-only, 4 volatile backup failed, 5 persistent memory read-only.
    pub critical_warning: u8,
    /// Composite temperature, kelvin.
    pub temperature_kelvin: u16,
    /// Available spare, percent of the factory spare.
    pub avail_spare: u8,
    /// The drive's own threshold for `avail_spare`.
    pub spare_thresh: u8,
    /// Percentage of rated endurance used (may exceed 100).
    pub percent_used: u8,
    pub data_units_read: u128,
    pub data_units_written: u128,
    pub power_on_hours: u128,
    pub unsafe_shutdowns: u128,
    pub media_errors: u128,
    pub num_err_log_entries: u128,
}

/// What each critical warning bit means, in bit order.
pub const CRITICAL_WARNING_BITS: [&str; 6] = [
    "available spare under its threshold",
    "temperature beyond a threshold",
    "reliability degraded (media or internal errors)",
    "media placed in read-only mode",
    "volatile memory backup failed",
    "persistent memory region read-only",
];

impl SmartLog {
    pub const LEN: usize = 512;

    /// Parses the 512-byte page (little-endian fields).
    pub fn parse(page: &[u8]) -> Option<SmartLog> {
        if page.len() < Self::LEN {
            return None;
        }
        let u128_at = |o: usize| {
            let mut b = [0u8; 16];
            b.copy_from_slice(&page[o..o + 16]);
            u128::from_le_bytes(b)
        };
        Some(SmartLog {
            critical_warning: page[0],
            temperature_kelvin: u16::from_le_bytes([page[1], page[2]]),
            avail_spare: page[3],
            spare_thresh: page[4],
            percent_used: page[5],
            data_units_read: u128_at(32),
            data_units_written: u128_at(48),
            power_on_hours: u128_at(128),
            unsafe_shutdowns: u128_at(144),
            media_errors: u128_at(160),
            num_err_log_entries: u128_at(176),
        })
    }

    /// Composite temperature in °C (`None` when the drive reports 0 K: no sensor).
    pub fn celsius(&self) -> Option<f64> {
        (self.temperature_kelvin > 0).then(|| f64::from(self.temperature_kelvin) - 273.15)
    }

    /// The meaning of each critical warning bit set.
    pub fn warnings(&self) -> Vec<&'static str> {
        CRITICAL_WARNING_BITS
            .iter()
            .enumerate()
            .filter(|(i, _)| self.critical_warning & (1 << i) != 0)
            .map(|(_, w)| *w)
            .collect()
    }

    /// Whether the drive reports its spare at all: emulated drives report 0 % spare with a 0 %
    /// threshold, which would read as an exhausted drive.
    pub fn reports_spare(&self) -> bool {
        self.avail_spare > 0 || self.spare_thresh > 0
    }
}

/// `struct nvme_passthru_cmd` of linux/nvme_ioctl.h (72 bytes).
#[repr(C)]
#[derive(Default)]
struct PassthruCmd {
    opcode: u8,
    flags: u8,
    rsvd1: u16,
    nsid: u32,
    cdw2: u32,
    cdw3: u32,
    metadata: u64,
    addr: u64,
    metadata_len: u32,
    data_len: u32,
    cdw10: u32,
    cdw11: u32,
    cdw12: u32,
    cdw13: u32,
    cdw14: u32,
    cdw15: u32,
    timeout_ms: u32,
    result: u32,
}

nix::ioctl_readwrite!(nvme_admin_cmd, b'N', 0x41, PassthruCmd);

/// Reads the SMART log of the drive behind `dev` (a namespace or controller node, e.g.
/// `/dev/disk/by-bay/BAY03`): Get Log Page, log id 02h, controller-wide (nsid FFFFFFFFh).
pub fn read(dev: &Path) -> Result<SmartLog, String> {
    let f = std::fs::File::open(dev).map_err(|e| format!("opening {}: {e}", dev.display()))?;
    let mut page = vec![0u8; SmartLog::LEN];
    let numd = (SmartLog::LEN / 4 - 1) as u32;
    let mut cmd = PassthruCmd {
        opcode: 0x02,
        nsid: 0xFFFF_FFFF,
        addr: page.as_mut_ptr() as u64,
        data_len: SmartLog::LEN as u32,
        cdw10: 0x02 | ((numd & 0xFFFF) << 16),
        cdw11: numd >> 16,
        timeout_ms: 5000,
        ..Default::default()
    };
    // SAFETY: `cmd` is a valid nvme_passthru_cmd whose data buffer `page` is 512 writable bytes
    // that outlive the call; the kernel writes at most data_len bytes there.
    let status = unsafe { nvme_admin_cmd(f.as_raw_fd(), &mut cmd) }
        .map_err(|e| format!("reading the SMART log of {}: {e}", dev.display()))?;
    if status != 0 {
        return Err(format!("the drive behind {} refused the SMART log (NVMe status {status:#x})", dev.display()));
    }
    SmartLog::parse(&page).ok_or_else(|| "short SMART log".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_has_the_kernel_s_layout() {
        assert_eq!(std::mem::size_of::<PassthruCmd>(), 72);
    }

    #[test]
    fn a_page_reads_as_nvme_cli_read_it() {
        let page = include_bytes!("fixtures/smart-log-bay03.bin");
        let cli: serde_json::Value =
            serde_json::from_str(include_str!("fixtures/smart-log-bay03.json")).expect("fixture");
        let log = SmartLog::parse(page).expect("parses");
        let n = |k: &str| cli[k].as_u64().expect(k) as u128;
        assert_eq!(u128::from(log.critical_warning), n("critical_warning"));
        assert_eq!(u128::from(log.temperature_kelvin), n("temperature"));
        assert_eq!(u128::from(log.avail_spare), n("avail_spare"));
        assert_eq!(u128::from(log.spare_thresh), n("spare_thresh"));
        assert_eq!(u128::from(log.percent_used), n("percent_used"));
        assert_eq!(log.data_units_read, n("data_units_read"));
        assert_eq!(log.data_units_written, n("data_units_written"));
        assert_eq!(log.power_on_hours, n("power_on_hours"));
        assert_eq!(log.unsafe_shutdowns, n("unsafe_shutdowns"));
        assert_eq!(log.media_errors, n("media_errors"));
        assert_eq!(log.num_err_log_entries, n("num_err_log_entries"));
        // That drive had QEMU's smart_critical_warning=2 set: the temperature bit.
        assert_eq!(log.warnings(), vec!["temperature beyond a threshold"]);
        assert!((log.celsius().expect("temp") - 49.85).abs() < 0.01);
        assert!(!log.reports_spare(), "QEMU reports no spare");
        assert!(SmartLog::parse(&page[..100]).is_none());
    }
}
