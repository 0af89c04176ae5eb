//! From "what the NIC has" and "what the recipe wants" to dcbnl messages.
//!
//! Pure, so it is unit-testable and so the byte-for-byte tests can compare
//! its output with `dcb` run against the same current state.

use crate::Error;
use crate::consts::{IEEE_8021QAZ_APP_SEL_DSCP, IEEE_8021QAZ_MAX_TCS, IEEE_8021QAZ_TSA_ETS};
use crate::msg::Request;
use crate::types::{App, Ieee, IeeeEts, IeeePfc};

/// The DCB configuration the appliance's recipe asks for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Desired {
    /// PFC is enabled on exactly this priority (0..=7), off on all others:
    /// one lossless class for RoCE, everything else lossy.
    pub lossless_priority: u8,
    /// ETS bandwidth share per traffic class in percent (must sum to 100);
    /// applied with TSA = ETS on every TC and the identity priority → TC map.
    /// `None` leaves ETS alone.
    pub ets_bandwidth: Option<[u8; IEEE_8021QAZ_MAX_TCS]>,
    /// DSCP (0..=63) → priority (0..=7) entries for the APP table.
    pub dscp: Vec<(u8, u8)>,
}

impl Desired {
    /// Rejects what `dcb` would reject on its command line (and conflicting
    /// DSCP entries, which would make the result depend on message order).
    pub fn validate(&self) -> Result<(), Error> {
        let max_prio = (IEEE_8021QAZ_MAX_TCS - 1) as u8;
        if self.lossless_priority > max_prio {
            return Err(Error::InvalidConfig(format!("lossless priority {} > 7", self.lossless_priority)));
        }
        if let Some(bw) = &self.ets_bandwidth {
            if let Some(b) = bw.iter().find(|b| **b > 100) {
                return Err(Error::InvalidConfig(format!("ETS share {b}% > 100%")));
            }
            // All TCs are ETS, so 802.1Q requires exactly 100 (dcb checks it).
            let sum: u32 = bw.iter().map(|b| u32::from(*b)).sum();
            if sum != 100 {
                return Err(Error::InvalidConfig(format!("ETS shares sum to {sum}%, expected 100%")));
            }
        }
        for (i, (dscp, prio)) in self.dscp.iter().enumerate() {
            if *dscp > 63 || *prio > max_prio {
                return Err(Error::InvalidConfig(format!("DSCP mapping {dscp}:{prio} out of range")));
            }
            if self.dscp[..i].iter().any(|(d, _)| d == dscp) {
                return Err(Error::InvalidConfig(format!("DSCP {dscp} listed twice")));
            }
        }
        Ok(())
    }

    fn priority_for_dscp(&self, dscp: u16) -> Option<u8> {
        self.dscp.iter().find(|(d, _)| u16::from(*d) == dscp).map(|(_, p)| *p)
    }
}

/// The PFC object `dcb pfc set dev X prio-pfc all:off P:on` would send:
/// everything read from the NIC kept, only `pfc_en` replaced.
fn wanted_pfc(current: &IeeePfc, desired: &Desired) -> IeeePfc {
    IeeePfc { pfc_en: 1 << desired.lossless_priority, ..*current }
}

/// The ETS object `dcb ets set dev X tc-tsa all:ets tc-bw … prio-tc 0:0 … 7:7`
/// would send: willing, ets_cap, cbs, pg-bw and the reco_* fields kept.
fn wanted_ets(current: &IeeeEts, bw: &[u8; IEEE_8021QAZ_MAX_TCS]) -> IeeeEts {
    let mut identity = [0u8; IEEE_8021QAZ_MAX_TCS];
    for (i, tc) in identity.iter_mut().enumerate() {
        *tc = i as u8;
    }
    IeeeEts { tc_tx_bw: *bw, tc_tsa: [IEEE_8021QAZ_TSA_ETS; IEEE_8021QAZ_MAX_TCS], prio_tc: identity, ..*current }
}

/// Computes the messages that bring `current` to `desired`, in the order to
/// send them. Only what differs is sent:
///
/// 1. `PfcSet` ≙ `dcb pfc set dev X prio-pfc all:off 3:on`
/// 2. `EtsSet` ≙ `dcb ets set dev X tc-tsa all:ets tc-bw 0:20 1:0 … prio-tc 0:0 1:1 …`
/// 3. `AppAdd` ≙ `dcb app add dev X dscp-prio 26:3 48:6` — only entries not
///    already present (the kernel answers EEXIST for exact duplicates).
/// 4. `AppDel` ≙ `dcb app del dev X dscp-prio 26:5` — entries mapping one of
///    our DSCP values to another priority, in the NIC's table order.
///
/// Adding before deleting means a DSCP value is never without a mapping; 3+4
/// together are exactly what `dcb app replace dev X dscp-prio 26:3 48:6`
/// sends. APP entries for DSCP values the recipe does not mention, and other
/// selectors, are left alone.
pub fn plan(current: &Ieee, desired: &Desired) -> Result<Vec<Request>, Error> {
    desired.validate()?;
    let mut out = Vec::new();

    // Read-modify-write needs the current object, like dcb (which fails with
    // "Attribute not found" otherwise); inventing the unchanged fields could
    // clobber NIC settings.
    let pfc = current.pfc.as_ref().ok_or(Error::MissingAttribute("DCB_ATTR_IEEE_PFC"))?;
    let want = wanted_pfc(pfc, desired);
    if want.pfc_en != pfc.pfc_en {
        out.push(Request::PfcSet(want));
    }

    if let Some(bw) = &desired.ets_bandwidth {
        let ets = current.ets.as_ref().ok_or(Error::MissingAttribute("DCB_ATTR_IEEE_ETS"))?;
        let want = wanted_ets(ets, bw);
        if want != *ets {
            out.push(Request::EtsSet(want));
        }
    }

    let add: Vec<App> =
        desired.dscp.iter().map(|(d, p)| App::dscp(*d, *p)).filter(|a| !current.apps.contains(a)).collect();
    if !add.is_empty() {
        out.push(Request::AppAdd(add));
    }

    let del: Vec<App> = current
        .apps
        .iter()
        .filter(|a| a.selector == IEEE_8021QAZ_APP_SEL_DSCP)
        .filter(|a| desired.priority_for_dscp(a.protocol).is_some_and(|p| p != a.priority))
        .copied()
        .collect();
    if !del.is_empty() {
        out.push(Request::AppDel(del));
    }
    Ok(out)
}

/// Describes how `after` fails to satisfy `desired`, for read-back checks.
/// Only what we set is compared: counters and read-only capabilities change
/// on their own.
pub(crate) fn unmet(after: &Ieee, desired: &Desired) -> Option<String> {
    match plan(after, desired) {
        Ok(steps) if steps.is_empty() => None,
        Ok(steps) => Some(format!("still needed after apply: {steps:?}")),
        Err(e) => Some(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nic() -> Ieee {
        Ieee {
            ets: Some(IeeeEts {
                willing: 1,
                ets_cap: 8,
                tc_tx_bw: [100, 0, 0, 0, 0, 0, 0, 0],
                tc_rx_bw: [1, 0, 0, 0, 0, 0, 0, 0],
                tc_reco_bw: [50, 50, 0, 0, 0, 0, 0, 0],
                tc_reco_tsa: [2, 2, 0, 0, 0, 0, 0, 0],
                ..Default::default()
            }),
            pfc: Some(IeeePfc { pfc_cap: 8, pfc_en: 0b0101_0001, mbc: 1, delay: 32, ..Default::default() }),
            apps: vec![],
        }
    }

    fn desired() -> Desired {
        Desired {
            lossless_priority: 3,
            ets_bandwidth: Some([20, 0, 0, 50, 0, 0, 10, 20]),
            dscp: vec![(26, 3), (48, 6)],
        }
    }

    #[test]
    fn full_plan_keeps_what_dcb_keeps() {
        let cur = nic();
        let steps = plan(&cur, &desired()).expect("plan");
        assert_eq!(steps.len(), 3);
        let Request::PfcSet(p) = &steps[0] else { panic!("{steps:?}") };
        assert_eq!(*p, IeeePfc { pfc_en: 0b1000, ..cur.pfc.expect("pfc") });
        let Request::EtsSet(e) = &steps[1] else { panic!("{steps:?}") };
        let old = cur.ets.expect("ets");
        assert_eq!((e.willing, e.ets_cap, e.tc_rx_bw, e.tc_reco_bw), (1, 8, old.tc_rx_bw, old.tc_reco_bw));
        assert_eq!(e.tc_tsa, [2; 8]);
        assert_eq!(e.prio_tc, [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(steps[2], Request::AppAdd(vec![App::dscp(26, 3), App::dscp(48, 6)]));
    }

    #[test]
    fn nothing_to_do_when_satisfied() {
        let mut cur = nic();
        for s in plan(&cur.clone(), &desired()).expect("plan") {
            match s {
                Request::PfcSet(p) => cur.pfc = Some(p),
                Request::EtsSet(e) => cur.ets = Some(e),
                Request::AppAdd(a) => cur.apps.extend(a),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(plan(&cur, &desired()).expect("plan"), vec![]);
        assert_eq!(unmet(&cur, &desired()), None);
    }

    #[test]
    fn conflicting_dscp_entries_are_deleted_others_kept() {
        let mut cur = nic();
        cur.apps = vec![
            App::dscp(48, 5),
            App::dscp(10, 1),
            App::dscp(26, 3),
            App { selector: 1, priority: 5, protocol: 0x8906 },
            App { selector: 1, priority: 4, protocol: 26 },
        ];
        let d = Desired { ets_bandwidth: None, ..desired() };
        let steps = plan(&cur, &d).expect("plan");
        assert_eq!(
            steps,
            vec![
                Request::PfcSet(IeeePfc { pfc_en: 0b1000, ..cur.pfc.expect("pfc") }),
                Request::AppAdd(vec![App::dscp(48, 6)]),
                Request::AppDel(vec![App::dscp(48, 5)]),
            ]
        );
    }

    #[test]
    fn missing_objects_and_invalid_config_are_errors() {
        let mut cur = nic();
        cur.ets = None;
        assert!(matches!(plan(&cur, &desired()), Err(Error::MissingAttribute("DCB_ATTR_IEEE_ETS"))));
        let no_ets = Desired { ets_bandwidth: None, ..desired() };
        assert!(plan(&cur, &no_ets).is_ok(), "ETS not needed when not desired");
        cur.pfc = None;
        assert!(matches!(plan(&cur, &no_ets), Err(Error::MissingAttribute("DCB_ATTR_IEEE_PFC"))));

        let bad = [
            Desired { lossless_priority: 8, ..desired() },
            Desired { ets_bandwidth: Some([50, 0, 0, 0, 0, 0, 0, 0]), ..desired() },
            Desired { ets_bandwidth: Some([101, 0, 0, 0, 0, 0, 0, 0]), ..desired() },
            Desired { dscp: vec![(64, 1)], ..desired() },
            Desired { dscp: vec![(1, 8)], ..desired() },
            Desired { dscp: vec![(26, 3), (26, 4)], ..desired() },
        ];
        for d in bad {
            assert!(matches!(plan(&nic(), &d), Err(Error::InvalidConfig(_))), "{d:?}");
        }
    }
}
