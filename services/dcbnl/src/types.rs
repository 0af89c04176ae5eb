//! The IEEE 802.1Qaz managed objects as plain Rust values.
//!
//! The kernel and `dcb` exchange these as raw C structs inside netlink
//! attributes, in host byte order, so `to_bytes`/`from_bytes` reproduce the C
//! layout exactly, padding included (written as zero, which is what the
//! kernel puts there: it memsets the structs before asking the driver).

use crate::Error;
use crate::consts::{IEEE_8021QAZ_APP_SEL_DSCP, IEEE_8021QAZ_MAX_TCS};

const TCS: usize = IEEE_8021QAZ_MAX_TCS;

/// `struct ieee_pfc`: priority flow control (the "lossless" part of RoCE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IeeePfc {
    /// Number of priorities the NIC can make lossless (read-only).
    pub pfc_cap: u8,
    /// Bit i set = PFC enabled on priority i.
    pub pfc_en: u8,
    /// MACsec bypass capability.
    pub mbc: u8,
    /// Round-trip allowance in bits.
    pub delay: u16,
    /// Counters of PFC frames sent, per priority (read-only, but `dcb` echoes
    /// them back in its SET, so we carry them too).
    pub requests: [u64; TCS],
    /// Counters of PFC frames received, per priority.
    pub indications: [u64; TCS],
}

impl IeeePfc {
    /// `sizeof(struct ieee_pfc)`: 3 u8, 1 pad byte, u16 delay at offset 4,
    /// 2 pad bytes so the u64 arrays start 8-aligned at offset 8.
    pub const SIZE: usize = 136;
    const DELAY: usize = 4;
    const REQUESTS: usize = 8;
    const INDICATIONS: usize = Self::REQUESTS + 8 * TCS;

    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0] = self.pfc_cap;
        b[1] = self.pfc_en;
        b[2] = self.mbc;
        b[Self::DELAY..Self::DELAY + 2].copy_from_slice(&self.delay.to_ne_bytes());
        for i in 0..TCS {
            let r = Self::REQUESTS + 8 * i;
            b[r..r + 8].copy_from_slice(&self.requests[i].to_ne_bytes());
            let n = Self::INDICATIONS + 8 * i;
            b[n..n + 8].copy_from_slice(&self.indications[i].to_ne_bytes());
        }
        b
    }

    /// Requires the exact size, as `dcb` does: a different size means a
    /// kernel/userspace layout mismatch we must not paper over.
    pub fn from_bytes(b: &[u8]) -> Result<IeeePfc, Error> {
        if b.len() != Self::SIZE {
            return Err(Error::BadLength { what: "struct ieee_pfc", expected: Self::SIZE, got: b.len() });
        }
        let mut pfc = IeeePfc {
            pfc_cap: b[0],
            pfc_en: b[1],
            mbc: b[2],
            delay: u16::from_ne_bytes([b[Self::DELAY], b[Self::DELAY + 1]]),
            ..IeeePfc::default()
        };
        for i in 0..TCS {
            pfc.requests[i] = read_u64(b, Self::REQUESTS + 8 * i);
            pfc.indications[i] = read_u64(b, Self::INDICATIONS + 8 * i);
        }
        Ok(pfc)
    }
}

fn read_u64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(w)
}

/// `struct ieee_ets`: enhanced transmission selection (bandwidth shares per
/// traffic class and the priority → traffic class map).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IeeeEts {
    pub willing: u8,
    /// Number of TCs the NIC supports (read-only).
    pub ets_cap: u8,
    pub cbs: u8,
    /// `tc-bw` in dcb: percentage of bandwidth per TC.
    pub tc_tx_bw: [u8; TCS],
    /// `pg-bw` in dcb (non-standard).
    pub tc_rx_bw: [u8; TCS],
    /// Transmission selection algorithm per TC (IEEE_8021QAZ_TSA_*).
    pub tc_tsa: [u8; TCS],
    /// Priority → TC.
    pub prio_tc: [u8; TCS],
    pub tc_reco_bw: [u8; TCS],
    pub tc_reco_tsa: [u8; TCS],
    pub reco_prio_tc: [u8; TCS],
}

impl IeeeEts {
    /// `sizeof(struct ieee_ets)`: only u8 members, so no padding at all.
    pub const SIZE: usize = 3 + 7 * TCS;

    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0] = self.willing;
        b[1] = self.ets_cap;
        b[2] = self.cbs;
        for (k, arr) in self.arrays().iter().enumerate() {
            b[3 + k * TCS..3 + (k + 1) * TCS].copy_from_slice(&arr[..]);
        }
        b
    }

    pub fn from_bytes(b: &[u8]) -> Result<IeeeEts, Error> {
        if b.len() != Self::SIZE {
            return Err(Error::BadLength { what: "struct ieee_ets", expected: Self::SIZE, got: b.len() });
        }
        let arr = |k: usize| {
            let mut a = [0u8; TCS];
            a.copy_from_slice(&b[3 + k * TCS..3 + (k + 1) * TCS]);
            a
        };
        Ok(IeeeEts {
            willing: b[0],
            ets_cap: b[1],
            cbs: b[2],
            tc_tx_bw: arr(0),
            tc_rx_bw: arr(1),
            tc_tsa: arr(2),
            prio_tc: arr(3),
            tc_reco_bw: arr(4),
            tc_reco_tsa: arr(5),
            reco_prio_tc: arr(6),
        })
    }

    /// The seven arrays in declaration order, which is their order in memory.
    fn arrays(&self) -> [&[u8; TCS]; 7] {
        [
            &self.tc_tx_bw,
            &self.tc_rx_bw,
            &self.tc_tsa,
            &self.prio_tc,
            &self.tc_reco_bw,
            &self.tc_reco_tsa,
            &self.reco_prio_tc,
        ]
    }
}

/// `struct dcb_app`: one APP table entry (traffic of `protocol`, interpreted
/// per `selector`, goes to 802.1p `priority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct App {
    pub selector: u8,
    pub priority: u8,
    pub protocol: u16,
}

impl App {
    /// `sizeof(struct dcb_app)`: u8, u8, u16 — naturally aligned, no padding.
    pub const SIZE: usize = 4;

    /// A DSCP → priority entry (selector 5), the only kind the recipe uses.
    pub fn dscp(dscp: u8, priority: u8) -> App {
        App { selector: IEEE_8021QAZ_APP_SEL_DSCP, priority, protocol: u16::from(dscp) }
    }

    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let p = self.protocol.to_ne_bytes();
        [self.selector, self.priority, p[0], p[1]]
    }

    /// Accepts longer payloads and reads the first 4 bytes, like `dcb` does,
    /// so a future kernel growing the struct does not break us.
    pub fn from_bytes(b: &[u8]) -> Result<App, Error> {
        if b.len() < Self::SIZE {
            return Err(Error::BadLength { what: "struct dcb_app", expected: Self::SIZE, got: b.len() });
        }
        Ok(App { selector: b[0], priority: b[1], protocol: u16::from_ne_bytes([b[2], b[3]]) })
    }
}

/// What `DCB_CMD_IEEE_GET` reports for one interface. `None` means the driver
/// did not report that object (its getter is missing or failed).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ieee {
    pub ets: Option<IeeeEts>,
    pub pfc: Option<IeeePfc>,
    /// In the kernel's order (it prepends new entries).
    pub apps: Vec<App>,
}

impl Ieee {
    /// The DSCP → priority entries only.
    pub fn dscp_apps(&self) -> impl Iterator<Item = &App> {
        self.apps.iter().filter(|a| a.selector == IEEE_8021QAZ_APP_SEL_DSCP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_pfc() -> IeeePfc {
        IeeePfc {
            pfc_cap: 8,
            pfc_en: 0b1000_1001,
            mbc: 1,
            delay: 0x1234,
            requests: [1, 2, 3, 4, 5, 6, 7, u64::MAX],
            indications: [0x0102_0304_0506_0708, 0, 0, 0, 0, 0, 0, 9],
        }
    }

    #[test]
    fn pfc_layout_matches_c_offsets() {
        let b = sample_pfc().to_bytes();
        assert_eq!(b.len(), 136);
        assert_eq!(&b[0..4], &[8, 0b1000_1001, 1, 0], "pad byte at 3 is zero");
        assert_eq!(&b[4..6], &0x1234u16.to_ne_bytes());
        assert_eq!(&b[6..8], &[0, 0], "pad before the u64 arrays is zero");
        assert_eq!(&b[8..16], &1u64.to_ne_bytes());
        assert_eq!(&b[64..72], &u64::MAX.to_ne_bytes());
        assert_eq!(&b[72..80], &0x0102_0304_0506_0708u64.to_ne_bytes());
        assert_eq!(&b[128..136], &9u64.to_ne_bytes());
    }

    #[test]
    fn pfc_round_trip_and_length_check() {
        let p = sample_pfc();
        assert_eq!(IeeePfc::from_bytes(&p.to_bytes()).expect("decode"), p);
        assert!(matches!(IeeePfc::from_bytes(&[0u8; 135]), Err(Error::BadLength { expected: 136, got: 135, .. })));
    }

    #[test]
    fn ets_layout_and_round_trip() {
        let e = IeeeEts {
            willing: 1,
            ets_cap: 8,
            cbs: 0,
            tc_tx_bw: [20, 0, 0, 50, 0, 0, 10, 20],
            tc_rx_bw: [1, 2, 3, 4, 5, 6, 7, 8],
            tc_tsa: [2; 8],
            prio_tc: [0, 1, 2, 3, 4, 5, 6, 7],
            tc_reco_bw: [100, 0, 0, 0, 0, 0, 0, 0],
            tc_reco_tsa: [0, 1, 2, 255, 0, 0, 0, 0],
            reco_prio_tc: [7, 6, 5, 4, 3, 2, 1, 0],
        };
        let b = e.to_bytes();
        assert_eq!(b.len(), 59);
        assert_eq!(&b[0..3], &[1, 8, 0]);
        assert_eq!(&b[3..11], &[20, 0, 0, 50, 0, 0, 10, 20]);
        assert_eq!(&b[11..19], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[19..27], &[2; 8]);
        assert_eq!(&b[27..35], &[0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(&b[35..43], &[100, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[43..51], &[0, 1, 2, 255, 0, 0, 0, 0]);
        assert_eq!(&b[51..59], &[7, 6, 5, 4, 3, 2, 1, 0]);
        assert_eq!(IeeeEts::from_bytes(&b).expect("decode"), e);
        assert!(IeeeEts::from_bytes(&b[..58]).is_err());
    }

    #[test]
    fn app_layout_and_round_trip() {
        let a = App::dscp(26, 3);
        let b = a.to_bytes();
        assert_eq!(b[0], 5);
        assert_eq!(b[1], 3);
        assert_eq!(&b[2..4], &26u16.to_ne_bytes());
        assert_eq!(App::from_bytes(&b).expect("decode"), a);
        // Longer payloads are read like dcb reads them; shorter ones refused.
        let mut long = b.to_vec();
        long.push(99);
        assert_eq!(App::from_bytes(&long).expect("decode"), a);
        assert!(App::from_bytes(&b[..3]).is_err());
    }
}
