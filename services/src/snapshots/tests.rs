use super::*;

/// 2026-12-01 21:45:00 UTC, a Tuesday.
const T0: u64 = 1_796_161_500;

fn policy(frequently: u32, hold_seconds: u64) -> SnapshotPlan {
    SnapshotPlan {
        dataset: "tank/train".into(),
        recursive: false,
        frequent_minutes: 1,
        keep: Retention { frequently, ..Retention::default() },
        hold_seconds,
    }
}

/// A pool as ZFS would keep it: what the rounds take, hold, release and destroy, with ZFS's own
/// refusal to destroy a held snapshot.
#[derive(Default)]
struct Pool {
    snapshots: Vec<Snapshot>,
    holds: Vec<Hold>,
    guid: u64,
}

impl Pool {
    fn add(&mut self, dataset: &str, short: &str, at: u64) {
        self.guid += 1;
        self.snapshots.push(Snapshot {
            name: format!("{dataset}@{short}"),
            dataset: dataset.into(),
            short: short.into(),
            guid: self.guid,
            creation: at,
            txg: self.guid,
            used: 0,
            referenced: 0,
            userrefs: 0,
        });
    }

    fn hold(&mut self, name: &str, tag: &str, at: u64) {
        self.holds.push(Hold { snapshot: name.into(), tag: tag.into(), since: at });
        self.refs();
    }

    fn refs(&mut self) {
        for s in &mut self.snapshots {
            s.userrefs = self.holds.iter().filter(|h| h.snapshot == s.name).count() as u64;
        }
    }

    /// One round at `now`, applied as the agent applies it: what is due is taken (and held),
    /// then a fresh decision holds, releases and prunes. Returns the second decision, with the first's takes.
    fn round(&mut self, p: &SnapshotPlan, now: u64) -> Round {
        let first = decide(p, now, &self.snapshots, &self.holds);
        for k in &first.take {
            self.add(&p.dataset, &auto_name(now, *k), now);
            if p.hold_seconds > 0 {
                let name = format!("{}@{}", p.dataset, auto_name(now, *k));
                self.hold(&name, &hold_tag(now + p.hold_seconds), now);
            }
        }
        if first.take.is_empty() {
            self.apply(&first);
            return first;
        }
        let mut second = decide(p, now, &self.snapshots, &self.holds);
        assert!(second.take.is_empty(), "what was taken is not due again");
        self.apply(&second);
        second.take = first.take;
        second
    }

    fn apply(&mut self, r: &Round) {
        for (name, until) in &r.hold {
            self.hold(name, &hold_tag(*until), 0);
        }
        for (name, tag) in &r.release {
            self.holds.retain(|h| !(h.snapshot == *name && h.tag == *tag));
        }
        self.refs();
        for name in &r.destroy {
            let s = self.snapshots.iter().find(|s| s.name == *name).expect("destroys what exists");
            assert_eq!(s.userrefs, 0, "ZFS would refuse to destroy held {name}");
            self.snapshots.retain(|s| s.name != *name);
        }
    }

    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.snapshots.iter().map(|s| s.short.clone()).collect();
        v.sort();
        v
    }
}

#[test]
fn stamps_sort_as_time_and_read_back() {
    assert_eq!(stamp(T0), "20261201T214500Z");
    assert_eq!(parse_stamp("20261201T214500Z"), Some(T0));
    assert_eq!(human_time(T0), "2026-12-01 21:45:00 UTC");
    assert!(stamp(T0 + 59) < stamp(T0 + 60) && stamp(T0 + 86_400 * 40) > stamp(T0));
    for bad in ["20261301T214500Z", "20261201T254500Z", "2026120T214500Z", "20261201T214500", "2026-201T214500Z"] {
        assert_eq!(parse_stamp(bad), None, "{bad}");
    }
    assert_eq!(auto_name(T0, Kind::Hourly), "auto-20261201T214500Z-hourly");
    assert_eq!(parse_auto("auto-20261201T214500Z-hourly"), Some((T0, Kind::Hourly)));
    assert_eq!(parse_auto("auto-20261201T214500Z-yearly"), None);
    assert_eq!(parse_auto("manual-20261201T214500Z"), None);
    assert_eq!(parse_auto("auto-someday-hourly"), None);
    assert_eq!(hold_until(&hold_tag(T0 + 120)), Some(T0 + 120));
    assert_eq!(hold_until("nasos-repl"), None);
    assert_eq!(human_span(13 * 86_400 + 23 * 3600 + 5), "13d 23h");
    assert_eq!(human_span(250), "4m 10s");
    assert_eq!(human_span(0), "0s");
}

#[test]
fn periods_start_on_utc_boundaries() {
    let now = T0 + 37; // 21:45:37
    assert_eq!(stamp(Kind::Frequently.period_start(now, 1)), "20261201T214500Z");
    assert_eq!(stamp(Kind::Frequently.period_start(now, 15)), "20261201T214500Z");
    assert_eq!(stamp(Kind::Frequently.period_start(now, 20)), "20261201T214000Z");
    assert_eq!(stamp(Kind::Hourly.period_start(now, 15)), "20261201T210000Z");
    assert_eq!(stamp(Kind::Daily.period_start(now, 15)), "20261201T000000Z");
    assert_eq!(stamp(Kind::Weekly.period_start(now, 15)), "20261130T000000Z", "the Monday before");
    assert_eq!(stamp(Kind::Monthly.period_start(now, 15)), "20261201T000000Z");
    assert_eq!(stamp(Kind::Monthly.period_start(now - 86_400, 15)), "20261101T000000Z");
    let monday = parse_stamp("20261130T000000Z").expect("stamp");
    assert_eq!(Kind::Weekly.period_start(monday, 15), monday, "a period starts at its own start");
}

#[test]
fn a_minutely_policy_keeping_3_has_exactly_3_after_5_minutes_in_time_order() {
    let p = policy(3, 0);
    let mut pool = Pool::default();
    pool.add("tank/train", "manual-20261201T000000Z", T0 - 9000);
    pool.add("tank/scratch", "auto-20261201T000000Z-frequently", T0 - 9000);
    // A round every 20 s for five minutes: one snapshot per minute, never two.
    let mut taken = 0;
    for i in 0..16 {
        taken += pool.round(&p, T0 + 5 + i * 20).take.len();
    }
    assert_eq!(taken, 6, "21:45 … 21:50");
    let autos: Vec<String> =
        pool.names().into_iter().filter(|n| n.starts_with("auto-2026") && n.contains("T21")).collect();
    assert_eq!(
        autos,
        ["auto-20261201T214805Z-frequently", "auto-20261201T214905Z-frequently", "auto-20261201T215005Z-frequently"]
    );
    assert!(pool.names().contains(&"manual-20261201T000000Z".to_string()), "an operator's snapshot is never pruned");
    assert_eq!(
        pool.snapshots.iter().filter(|s| s.dataset == "tank/scratch").count(),
        1,
        "another dataset's is not touched"
    );
}

#[test]
fn held_snapshots_outlive_their_count_and_go_once_the_hold_passes() {
    // Keep 2, hold each for 4 minutes: a snapshot stays until both its count and its hold let go.
    let p = policy(2, 240);
    let mut pool = Pool::default();
    for i in 0..5 {
        pool.round(&p, T0 + 5 + i * 60);
    }
    // 21:45 … 21:49: the 21:45 snapshot's hold ran out at 21:49:05, the rest are held.
    let r = pool.round(&p, T0 + 5 + 4 * 60 + 30);
    assert!(r.take.is_empty() && r.destroy.is_empty());
    assert_eq!(pool.snapshots.len(), 4, "{:?}", pool.names());
    assert_eq!(r.kept.len(), 2, "beyond the count of 2 but held: {:?}", r.kept);
    assert_eq!(r.kept[0].0, "tank/train@auto-20261201T214705Z-frequently");
    assert!(r.kept[0].1.contains("held until 2026-12-01 21:51:05 UTC (in 1m 30s)"), "{}", r.kept[0].1);
    assert!(r.kept[1].1.contains("held until 2026-12-01 21:50:05 UTC"), "{}", r.kept[1].1);
    // Long after: only the count remains, and every hold that ran out was released.
    for i in 5..15 {
        pool.round(&p, T0 + 5 + i * 60);
    }
    let r = pool.round(&p, T0 + 5 + 20 * 60);
    assert!(r.kept.is_empty(), "{:?}", r.kept);
    assert_eq!(pool.snapshots.len(), 2, "{:?}", pool.names());
    assert!(pool.holds.iter().all(|h| hold_until(&h.tag).is_some_and(|u| u > T0 + 5 + 20 * 60)));
}

#[test]
fn another_hold_keeps_a_snapshot_and_the_newest_of_a_kind_always_stays() {
    let mut pool = Pool::default();
    let p = policy(1, 0);
    pool.round(&p, T0 + 5);
    let first = pool.snapshots[0].name.clone();
    // Replication needs it: its own tag, which nasos never releases.
    pool.hold(&first, "nasos-repl", T0 + 6);
    let r = pool.round(&p, T0 + 65);
    assert_eq!(r.take, [Kind::Frequently]);
    let r = pool.round(&p, T0 + 66);
    assert_eq!(r.kept, [(first.clone(), "it is held by nasos-repl".to_string())]);
    assert!(r.release.is_empty());
    // The policy stops taking frequent snapshots: the newest one stays.
    let off = SnapshotPlan { keep: Retention { hourly: 1, ..Retention::default() }, ..policy(0, 0) };
    pool.holds.clear();
    pool.refs();
    let r = pool.round(&off, T0 + 120);
    assert_eq!(r.destroy, [first]);
    assert_eq!(r.take, [Kind::Hourly]);
    assert_eq!(pool.snapshots.iter().filter(|s| s.short.ends_with("frequently")).count(), 1);
}

#[test]
fn a_snapshot_taken_before_a_crash_gets_its_hold_in_the_next_round() {
    let p = policy(3, 600);
    let mut pool = Pool::default();
    // Taken, then the agent died before it held it.
    pool.add("tank/train", &auto_name(T0 + 5, Kind::Frequently), T0 + 5);
    let r = decide(&p, T0 + 30, &pool.snapshots, &pool.holds);
    assert_eq!(r.hold, [("tank/train@auto-20261201T214505Z-frequently".to_string(), T0 + 605)]);
    assert!(r.take.is_empty(), "this minute's snapshot exists");
    // One whose hold time is over is not held again.
    let r = decide(&p, T0 + 700, &pool.snapshots, &pool.holds);
    assert!(r.hold.is_empty());
}

#[test]
fn held_reads_the_latest_nasos_expiry_and_names_other_holds() {
    let holds = vec![
        Hold { snapshot: "tank/a@x".into(), tag: hold_tag(T0 + 100), since: T0 },
        Hold { snapshot: "tank/a@x".into(), tag: hold_tag(T0 + 300), since: T0 },
        Hold { snapshot: "tank/a@x".into(), tag: "keep".into(), since: T0 },
        Hold { snapshot: "tank/a@y".into(), tag: hold_tag(T0 + 900), since: T0 },
    ];
    let h = Held::of("tank/a@x", &holds);
    assert_eq!(h.until, Some(T0 + 300));
    assert_eq!(h.others, ["keep"]);
    assert!(h.refusal(T0).is_some_and(|r| r.contains("held until 2026-12-01 21:50:00 UTC (in 5m)")));
    assert_eq!(h.refusal(T0 + 300), Some("it is held by keep".into()));
    assert_eq!(Held::of("tank/a@z", &holds).refusal(T0), None);
}
