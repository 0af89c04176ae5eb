//! The fixtures are what OpenZFS 2.3.9 printed in the qemu-dev appliance for its 2 × 6-wide
//! raidz2 pool, byte for byte.

use nasos_zfs::{Error, Value, parse_datasets, parse_pool_list, parse_status, summary};

const STATUS: &str = include_str!("fixtures/zpool-status.json");
const STATUS_FLAT: &str = include_str!("fixtures/zpool-status-flat.json");
const POOL_LIST: &str = include_str!("fixtures/zpool-list.json");
const POOL_GET: &str = include_str!("fixtures/zpool-get.json");
const ZFS_LIST: &str = include_str!("fixtures/zfs-list.json");
const ZFS_GET: &str = include_str!("fixtures/zfs-get.json");
/// qemu-dev's pool (2 × 5-wide raidz2, spares BAY11 BAY12) seconds after BAY07 was pulled: zed
/// has put BAY11 in for it (re-indented, else as zpool printed it).
const SPARE_INUSE: &str = include_str!("fixtures/zpool-status-spare-inuse.json");

#[test]
fn status_is_typed_down_to_each_bay() {
    let s = parse_status(STATUS).expect("parses");
    let tank = &s.pools["tank"];
    assert_eq!(tank.state, "ONLINE");
    // Above 2^53: a double would have rounded it.
    let root = &tank.vdevs["tank"];
    assert_eq!(root.vdev_type, "root");
    let raidz = &root.vdevs["raidz2-0"];
    assert_eq!(raidz.guid, 10940134659339597905);
    assert_eq!(raidz.vdev_type, "raidz");
    let m = summary::members(tank);
    assert_eq!(m.len(), 12);
    assert_eq!(m[0].disk, "BAY01");
    assert_eq!(m[0].group, "raidz2-0");
    assert_eq!(m[11].disk, "BAY12");
    assert_eq!(m[11].group, "raidz2-1");
    assert!(m.iter().all(|d| d.state == "ONLINE" && d.errors == 0));
    assert_eq!(summary::errors(tank), 0);
    assert_eq!(raidz.vdevs["disk/by-bay/BAY01"].path.as_deref(), Some("/dev/disk/by-bay/BAY01-part1"));
}

#[test]
fn flat_status_parses_too() {
    let s = parse_status(STATUS_FLAT).expect("parses");
    assert_eq!(s.pools["tank"].pool_guid, 644726112428041454);
}

#[test]
fn pool_properties_are_numbers_or_text() {
    for json in [POOL_LIST, POOL_GET] {
        let l = parse_pool_list(json).expect("parses");
        let tank = &l.pools["tank"];
        assert_eq!(tank.value("size"), Some(&Value::Int(50465865728)));
        assert!(tank.value("allocated").and_then(Value::as_u64).is_some());
    }
    let get = parse_pool_list(POOL_GET).expect("parses");
    assert_eq!(get.pools["tank"].value("health"), Some(&Value::Text("ONLINE".into())));
}

#[test]
fn datasets_carry_values_and_sources() {
    let l = parse_datasets(ZFS_LIST).expect("parses");
    assert!(l.datasets.contains_key("tank/train") && l.datasets.contains_key("tank/scratch"));
    let tank = &l.datasets["tank"];
    assert_eq!(tank.value("mountpoint"), Some(&Value::Text("/export/tank".into())));
    assert_eq!(tank.properties["mountpoint"].source.kind, "LOCAL");
    let g = parse_datasets(ZFS_GET).expect("parses");
    let train = &g.datasets["tank/train"];
    assert_eq!(train.value("recordsize"), Some(&Value::Int(1048576)));
    assert_eq!(train.properties["compression"].source.kind, "INHERITED");
    assert_eq!(train.properties["compression"].source.data, "tank");
}

#[test]
fn another_output_version_is_refused_by_name() {
    let newer = STATUS.replace("\"vers_major\":0", "\"vers_major\":1");
    match parse_status(&newer) {
        Err(Error::Version { major: 1, .. }) => {}
        other => panic!("expected a version error, got {other:?}"),
    }
}

#[test]
fn text_where_a_number_belongs_is_an_error_that_names_the_command() {
    // Without --json-int, GUIDs are strings: parsing must fail, not guess.
    let strings = STATUS.replace("\"pool_guid\":644726112428041454", "\"pool_guid\":\"644726112428041454\"");
    let e = parse_status(&strings).expect_err("string guid refused");
    assert!(e.to_string().contains("zpool status"), "{e}");
}

#[test]
fn a_hot_spare_at_work_says_whom_it_stands_in_for() {
    let s = parse_status(SPARE_INUSE).expect("parses");
    let tank = &s.pools["tank"];
    assert_eq!(tank.state, "DEGRADED");
    let m = summary::members(tank);
    let line = |disk: &str, group: &str| {
        m.iter().find(|x| x.disk == disk && x.group == group).unwrap_or_else(|| panic!("{disk} in {group}: {m:?}"))
    };
    assert_eq!(line("BAY07", "raidz2-1").state, "REMOVED");
    assert_eq!(line("BAY07", "raidz2-1").spare_for, None);
    let working = line("BAY11", "raidz2-1");
    assert_eq!((working.state.as_str(), working.spare_for.as_deref()), ("ONLINE", Some("BAY07")));
    let listed = line("BAY11", "spare");
    assert_eq!((listed.state.as_str(), listed.spare_for.as_deref()), ("INUSE", Some("BAY07")));
    let waiting = line("BAY12", "spare");
    assert_eq!((waiting.state.as_str(), waiting.spare_for.as_deref()), ("AVAIL", None));
    // Data vdevs first, in ZFS's order, the spare where the pulled disk was; then the spares.
    let order: Vec<&str> = m.iter().map(|x| x.disk.as_str()).collect();
    assert_eq!(
        order,
        [
            "BAY01", "BAY02", "BAY03", "BAY04", "BAY05", "BAY06", "BAY07", "BAY11", "BAY08", "BAY09", "BAY10", "BAY11",
            "BAY12"
        ]
    );
}

/// zfs 2.3.9 in qemu-dev after `zfs snapshot tank/train@a; zfs snapshot -r tank@b; zfs hold keep
/// tank/train@a`, with the policy's first snapshots (`zfs list -t snapshot -j -p`, no
/// `--json-int`).
const SNAPSHOTS: &str = include_str!("fixtures/zfs-list-snapshots.json");

#[test]
fn snapshots_are_typed_with_their_dataset_exact_guid_time_and_holds() {
    use nasos_zfs::snapshot::{parse_holds, parse_list};
    let s = parse_list(SNAPSHOTS).expect("parses");
    let train: Vec<&str> = s.iter().filter(|x| x.dataset == "tank/train").map(|x| x.short.as_str()).collect();
    assert_eq!(
        train,
        ["auto-20261201T224604Z-frequently", "auto-20261201T224604Z-hourly", "auto-20261201T224604Z-daily", "a", "b"],
        "oldest first, by transaction group"
    );
    let a = s.iter().find(|x| x.name == "tank/train@a").expect("a");
    assert_eq!((a.creation, a.txg, a.userrefs), (1796165197, 42, 1));
    // Above 2^63: with --json-int zfs prints 9223372036854775807 for every such GUID.
    assert_eq!(a.guid, 13873869579172968543);
    let mut guids: Vec<u64> = s.iter().map(|x| x.guid).collect();
    guids.sort();
    guids.dedup();
    assert_eq!(guids.len(), s.len(), "every snapshot has its own GUID");
    assert_eq!(s[0].referenced, 174528);
    // As `zfs holds -H -p tank/train@a tank/train@b` printed it.
    let h = parse_holds("tank/train@a\tkeep\t1796161668\n");
    assert_eq!(h.len(), 1);
    assert_eq!((h[0].snapshot.as_str(), h[0].tag.as_str(), h[0].since), ("tank/train@a", "keep", 1796161668));
    assert!(parse_holds("garbage\n\n").is_empty());
}
