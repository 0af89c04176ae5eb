//! Byte-for-byte comparison with iproute2's `dcb`.
//!
//! Each test puts the host's real `/usr/sbin/dcb` in front of a simulated
//! NIC (the LD_PRELOAD shim), captures every netlink request it sends, and
//! asserts that our encoder produces identical bytes for the same settings
//! (using dcb's own sequence numbers). The plan computed by the library for
//! the same current state must also name that very `dcb` command line.

mod common;

use common::*;
use nasos_dcbnl::{App, Desired, Ieee, IeeeEts, IeeePfc, Request, plan};

const PFC_3: &str = "pfc set dev eth9 prio-pfc all:off 3:on";
const ETS_SHARES: &str = "ets set dev eth9 tc-tsa all:ets tc-bw 0:20 1:0 2:0 3:50 4:0 5:0 6:10 7:20 \
                          prio-tc 0:0 1:1 2:2 3:3 4:4 5:5 6:6 7:7";
const APP_ADD: &str = "app add dev eth9 dscp-prio 26:3 48:6";
const APP_REPLACE: &str = "app replace dev eth9 dscp-prio 26:3 48:6";

fn args(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

fn dcb_line(req: &Request) -> String {
    req.dcb_args(IFNAME).join(" ")
}

fn only_pfc() -> Desired {
    Desired { lossless_priority: 3, ets_bandwidth: None, dscp: vec![] }
}

#[test]
fn get_request_equals_dcbs() {
    let sent = run_dcb(&blank_nic(), &args("pfc show dev eth9"));
    assert_same_messages("dcb pfc show", &sent, &[Request::Get]);
}

#[test]
fn pfc_on_priority_3_from_blank() {
    let cur = blank_nic();
    let steps = plan(&cur, &only_pfc()).expect("plan");
    assert_eq!(steps.len(), 1);
    assert_eq!(dcb_line(&steps[0]), PFC_3);
    let sent = run_dcb(&cur, &args(PFC_3));
    assert_same_messages(PFC_3, &sent, &[Request::Get, steps[0].clone()]);
}

#[test]
fn pfc_on_priority_3_from_other_priorities_keeps_cap_mbc_delay_and_counters() {
    let cur = used_nic();
    let steps = plan(&cur, &only_pfc()).expect("plan");
    assert_eq!(steps.iter().map(dcb_line).collect::<Vec<_>>(), vec![PFC_3]);
    let Request::PfcSet(p) = &steps[0] else { panic!("{steps:?}") };
    assert_eq!(*p, IeeePfc { pfc_en: 0b1000, ..cur.pfc.expect("pfc") });
    let sent = run_dcb(&cur, &args(PFC_3));
    assert_same_messages(PFC_3, &sent, &[Request::Get, steps[0].clone()]);
}

#[test]
fn pfc_already_on_priority_3_sends_nothing() {
    let mut cur = blank_nic();
    cur.pfc = Some(IeeePfc { pfc_cap: 8, pfc_en: 0b1000, ..IeeePfc::default() });
    assert_eq!(plan(&cur, &only_pfc()).expect("plan"), vec![]);
}

#[test]
fn ets_shares_20_0_0_50_0_0_10_20() {
    for cur in [blank_nic(), used_nic()] {
        let mut cur = cur;
        // PFC already as desired, so the plan is ETS only.
        cur.pfc = cur.pfc.map(|p| IeeePfc { pfc_en: 0b1000, ..p });
        let d = Desired { ets_bandwidth: Some([20, 0, 0, 50, 0, 0, 10, 20]), ..only_pfc() };
        let steps = plan(&cur, &d).expect("plan");
        assert_eq!(steps.iter().map(dcb_line).collect::<Vec<_>>(), vec![ETS_SHARES]);
        let Request::EtsSet(e) = &steps[0] else { panic!("{steps:?}") };
        let old: IeeeEts = cur.ets.expect("ets");
        assert_eq!(
            (e.willing, e.ets_cap, e.cbs, e.tc_rx_bw, e.tc_reco_bw, e.tc_reco_tsa, e.reco_prio_tc),
            (old.willing, old.ets_cap, old.cbs, old.tc_rx_bw, old.tc_reco_bw, old.tc_reco_tsa, old.reco_prio_tc),
            "fields dcb keeps must be kept"
        );
        let sent = run_dcb(&cur, &args(ETS_SHARES));
        assert_same_messages(ETS_SHARES, &sent, &[Request::Get, steps[0].clone()]);
    }
}

#[test]
fn app_add_26_3_and_48_6_from_empty() {
    let mut cur = blank_nic();
    cur.pfc = cur.pfc.map(|p| IeeePfc { pfc_en: 0b1000, ..p });
    let d = Desired { dscp: vec![(26, 3), (48, 6)], ..only_pfc() };
    let steps = plan(&cur, &d).expect("plan");
    assert_eq!(steps, vec![Request::AppAdd(vec![App::dscp(26, 3), App::dscp(48, 6)])]);
    assert_eq!(dcb_line(&steps[0]), APP_ADD);
    // dcb 6.1's `app add` does not read the table first: one message only.
    let sent = run_dcb(&cur, &args(APP_ADD));
    assert_same_messages(APP_ADD, &sent, &steps);
}

#[test]
fn app_conflicting_26_5_is_deleted() {
    let mut cur = blank_nic();
    cur.pfc = cur.pfc.map(|p| IeeePfc { pfc_en: 0b1000, ..p });
    cur.apps = vec![App::dscp(26, 5)];
    let d = Desired { dscp: vec![(26, 3), (48, 6)], ..only_pfc() };
    let steps = plan(&cur, &d).expect("plan");
    assert_eq!(steps.iter().map(dcb_line).collect::<Vec<_>>(), vec![APP_ADD, "app del dev eth9 dscp-prio 26:5"]);
    // The delete on its own, as `dcb app del` sends it.
    let sent = run_dcb(&cur, &args("app del dev eth9 dscp-prio 26:5"));
    assert_same_messages("dcb app del", &sent, &steps[1..]);
    // Add + delete together are exactly `dcb app replace`.
    let sent = run_dcb(&cur, &args(APP_REPLACE));
    assert_same_messages(APP_REPLACE, &sent, &[Request::Get, steps[0].clone(), steps[1].clone()]);
}

#[test]
fn app_existing_entry_is_not_added_again() {
    let mut cur = blank_nic();
    cur.pfc = cur.pfc.map(|p| IeeePfc { pfc_en: 0b1000, ..p });
    cur.apps = vec![App::dscp(48, 5), App::dscp(10, 1), App::dscp(26, 3)];
    let d = Desired { dscp: vec![(26, 3), (48, 6)], ..only_pfc() };
    let steps = plan(&cur, &d).expect("plan");
    assert_eq!(
        steps.iter().map(dcb_line).collect::<Vec<_>>(),
        vec!["app add dev eth9 dscp-prio 48:6", "app del dev eth9 dscp-prio 48:5"]
    );
    let sent = run_dcb(&cur, &args(APP_REPLACE));
    assert_same_messages(APP_REPLACE, &sent, &[Request::Get, steps[0].clone(), steps[1].clone()]);
}

/// The whole recipe against a previously configured NIC, with all dcb
/// commands run in one `dcb -b` process so the simulated NIC's state
/// carries over from one command to the next, as on hardware.
#[test]
fn desired_configuration_overall_equals_dcb_batch() {
    let cur = used_nic();
    let steps = plan(&cur, &roce_desired()).expect("plan");
    let lines: Vec<String> = steps.iter().map(dcb_line).collect();
    assert_eq!(lines, vec![PFC_3, ETS_SHARES, APP_ADD, "app del dev eth9 dscp-prio 26:5"]);
    let sent = run_dcb_batch(&cur, &lines);
    // pfc set and ets set each read first; app add/del do not.
    let expected = [Request::Get, steps[0].clone(), Request::Get, steps[1].clone(), steps[2].clone(), steps[3].clone()];
    assert_same_messages("dcb -b (whole recipe)", &sent, &expected);
}

/// Parses `dcb … show` text into (key, values) pairs: `key i:v i:v …`
/// lines give the values after the colons, `k v k v` lines give pairs.
fn parse_show(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() >= 2 && t[1].contains(':') {
            out.push((t[0].to_owned(), t[1..].iter().map(|m| m.split(':').nth(1).unwrap_or("").to_owned()).collect()));
        } else {
            for kv in t.chunks(2) {
                out.push((kv[0].to_owned(), kv[1..].iter().map(|s| s.to_string()).collect()));
            }
        }
    }
    out
}

fn get<'a>(show: &'a [(String, Vec<String>)], key: &str) -> &'a [String] {
    show.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_slice()).unwrap_or_else(|| panic!("{key} not in {show:?}"))
}

fn strs<T: ToString>(v: &[T]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Independent check of our C layouts: dcb decodes the structs we encode
/// for the shim with the C compiler's idea of the layout, and must print
/// back the values we put in.
#[test]
fn struct_layouts_agree_with_dcbs_c_layout() {
    let nic: Ieee = used_nic();
    let pfc = nic.pfc.expect("pfc");
    let show = parse_show(&dcb_show(&nic, &args("-s pfc show dev eth9")));
    assert_eq!(get(&show, "pfc-cap"), ["8"]);
    assert_eq!(get(&show, "macsec-bypass"), ["on"]);
    assert_eq!(get(&show, "delay"), [pfc.delay.to_string()]);
    let onoff: Vec<String> = (0..8).map(|i| if pfc.pfc_en & (1 << i) != 0 { "on" } else { "off" }.into()).collect();
    assert_eq!(get(&show, "prio-pfc"), onoff);
    assert_eq!(get(&show, "requests"), strs(&pfc.requests));
    assert_eq!(get(&show, "indications"), strs(&pfc.indications));

    let ets = nic.ets.expect("ets");
    let show = parse_show(&dcb_show(&nic, &args("ets show dev eth9")));
    let tsa = |a: &[u8; 8]| -> Vec<String> {
        a.iter().map(|t| ["strict", "cbs", "ets"].get(*t as usize).unwrap_or(&"?").to_string()).collect()
    };
    assert_eq!(get(&show, "willing"), ["on"]);
    assert_eq!(get(&show, "ets-cap"), ["8"]);
    assert_eq!(get(&show, "cbs"), ["off"]);
    assert_eq!(get(&show, "tc-bw"), strs(&ets.tc_tx_bw));
    assert_eq!(get(&show, "pg-bw"), strs(&ets.tc_rx_bw));
    assert_eq!(get(&show, "tc-tsa"), tsa(&ets.tc_tsa));
    assert_eq!(get(&show, "prio-tc"), strs(&ets.prio_tc));
    assert_eq!(get(&show, "reco-tc-bw"), strs(&ets.tc_reco_bw));
    assert_eq!(get(&show, "reco-tc-tsa"), tsa(&ets.tc_reco_tsa));
    assert_eq!(get(&show, "reco-prio-tc"), strs(&ets.reco_prio_tc));

    let text = dcb_show(&nic, &args("-N app show dev eth9"));
    let line = |kw: &str| -> Vec<String> {
        let l = text.lines().find(|l| l.starts_with(kw)).unwrap_or_else(|| panic!("no {kw} in {text}"));
        l.split_whitespace().map(str::to_owned).collect()
    };
    // dcb sorts by protocol and prints EtherTypes in hex.
    assert_eq!(line("dscp-prio"), ["dscp-prio", "26:5", "46:5"]);
    assert_eq!(line("ethtype-prio"), ["ethtype-prio", "8915:4"]);
}
