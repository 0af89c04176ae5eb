//! What `nasctl` does with snapshots: list, take (optionally held), destroy, release, roll back.
//! The refusals are decided by pure functions (tested on the host); the commands are one `zfs`
//! call each.

use anyhow::{Context, bail};
use nasos_zfs::snapshot::{self as zsnap, Hold, Snapshot};
use serde::Serialize;

use super::{AUTO_PREFIX, Held, MANUAL_PREFIX, hold_tag, hold_until, human_time, parse_auto, stamp};
use crate::unix_now;

/// One snapshot as `nasctl snapshots` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct View {
    pub name: String,
    pub dataset: String,
    pub snapshot: String,
    /// frequently, hourly, daily, weekly, monthly (the policy's), or manual.
    pub kind: String,
    /// Seconds since the epoch.
    pub created: u64,
    pub used_bytes: u64,
    pub referenced_bytes: u64,
    /// Until when nasos holds it, if it does (the latest of its nasos holds).
    pub held_until: Option<u64>,
    /// Other holds' tags (replication's, an operator's own `zfs hold`).
    pub held_by: Vec<String>,
}

pub fn view(s: &Snapshot, holds: &[Hold]) -> View {
    let held = Held::of(&s.name, holds);
    View {
        name: s.name.clone(),
        dataset: s.dataset.clone(),
        snapshot: s.short.clone(),
        kind: parse_auto(&s.short).map_or_else(|| "manual".to_string(), |(_, k)| k.as_str().to_string()),
        created: s.creation,
        used_bytes: s.used,
        referenced_bytes: s.referenced,
        held_until: held.until,
        held_by: held.others,
    }
}

fn with_holds(snapshots: &[Snapshot]) -> anyhow::Result<Vec<Hold>> {
    let held: Vec<&str> = snapshots.iter().filter(|s| s.userrefs > 0).map(|s| s.name.as_str()).collect();
    Ok(zsnap::holds(&held)?)
}

/// Every snapshot (of `dataset` and below, when given), oldest first per dataset.
pub fn list(dataset: Option<&str>) -> anyhow::Result<Vec<View>> {
    let snaps = zsnap::list(&dataset.into_iter().collect::<Vec<_>>(), true)?;
    let holds = with_holds(&snaps)?;
    Ok(snaps.iter().map(|s| view(s, &holds)).collect())
}

/// `DATASET@NAME` split, or why it is not a snapshot's name.
pub fn split(snapshot: &str) -> Result<(&str, &str), String> {
    match snapshot.split_once('@') {
        Some((ds, name)) if !ds.is_empty() && !name.is_empty() && !name.contains('@') => Ok((ds, name)),
        _ => Err(format!("`{snapshot}` is not a snapshot: name one as DATASET@NAME (`nasctl snapshots` lists them)")),
    }
}

/// Whether an operator may give a snapshot this name.
pub fn check_manual_name(name: &str) -> Result<(), String> {
    if name.starts_with(AUTO_PREFIX) {
        return Err(format!(
            "`{name}`: names starting with `{AUTO_PREFIX}` belong to the snapshot policy, which prunes them; choose another"
        ));
    }
    let ok = !name.is_empty()
        && name.len() <= 200
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
    if !ok {
        return Err(format!("`{name}` is not a snapshot name: use letters, digits, `_` `-` `.` `:`"));
    }
    Ok(())
}

/// `nasctl snapshot DATASET [NAME] [--hold DURATION]`: takes it, and holds it for `hold`.
pub fn take(dataset: &str, name: Option<&str>, hold_seconds: Option<u64>) -> anyhow::Result<String> {
    if dataset.contains('@') {
        bail!("`{dataset}` is a snapshot; name the dataset to snapshot (e.g. tank/train)");
    }
    let now = unix_now();
    let short = match name {
        Some(n) => {
            check_manual_name(n).map_err(anyhow::Error::msg)?;
            n.to_string()
        }
        None => format!("{MANUAL_PREFIX}{}", stamp(now)),
    };
    let full = format!("{dataset}@{short}");
    zsnap::create(&full, false).with_context(|| format!("taking {full}"))?;
    match hold_seconds.filter(|s| *s > 0) {
        Some(secs) => {
            let until = now.saturating_add(secs);
            zsnap::hold(&hold_tag(until), &full, false)
                .with_context(|| format!("{full} was taken, but holding it failed"))?;
            Ok(format!("took {full}, held until {}", human_time(until)))
        }
        None => Ok(format!("took {full}")),
    }
}

fn find(snapshot: &str) -> anyhow::Result<(Vec<Snapshot>, Vec<Hold>)> {
    let (ds, _) = split(snapshot).map_err(anyhow::Error::msg)?;
    let snaps = zsnap::list(&[ds], false).with_context(|| format!("listing the snapshots of {ds}"))?;
    if !snaps.iter().any(|s| s.name == snapshot) {
        bail!("{snapshot} does not exist (`nasctl snapshots {ds}` lists its snapshots)");
    }
    let holds = with_holds(&snaps)?;
    Ok((snaps, holds))
}

/// `nasctl destroy SNAPSHOT`: refused while anything holds it.
pub fn destroy(snapshot: &str) -> anyhow::Result<String> {
    let (_, holds) = find(snapshot)?;
    let now = unix_now();
    release_expired(snapshot, &holds, now)?;
    if let Some(why) = Held::of(snapshot, &holds).refusal(now) {
        bail!(
            "refusing to destroy {snapshot}: {why}; a held snapshot is destroyed neither before its time nor on request"
        );
    }
    zsnap::destroy(snapshot, false).with_context(|| format!("destroying {snapshot}"))?;
    Ok(format!("destroyed {snapshot}"))
}

fn release_expired(snapshot: &str, holds: &[Hold], now: u64) -> anyhow::Result<Vec<String>> {
    let mut released = Vec::new();
    for h in holds.iter().filter(|h| h.snapshot == snapshot) {
        if hold_until(&h.tag).is_some_and(|u| u <= now) {
            zsnap::release(&h.tag, snapshot, false).with_context(|| format!("releasing {} on {snapshot}", h.tag))?;
            released.push(h.tag.clone());
        }
    }
    Ok(released)
}

/// Why nasos's holds on a snapshot cannot be released at `now`, or which may be.
pub fn release_decision(snapshot: &str, holds: &[Hold], now: u64) -> Result<Vec<String>, String> {
    let mine: Vec<(&str, u64)> = holds
        .iter()
        .filter(|h| h.snapshot == snapshot)
        .filter_map(|h| hold_until(&h.tag).map(|u| (h.tag.as_str(), u)))
        .collect();
    if mine.is_empty() {
        let others = Held::of(snapshot, holds).others;
        return Err(if others.is_empty() {
            format!("{snapshot} is not held")
        } else {
            format!(
                "{snapshot} has no nasos hold; it is held by {} (nasos releases only its own holds)",
                others.join(", ")
            )
        });
    }
    if let Some(latest) = mine.iter().map(|(_, u)| *u).max().filter(|u| *u > now) {
        return Err(format!(
            "refusing to release {snapshot}: it is held until {} (in {}); a hold cannot be released before its time",
            human_time(latest),
            super::human_span(latest - now)
        ));
    }
    Ok(mine.into_iter().map(|(t, _)| t.to_string()).collect())
}

/// `nasctl release SNAPSHOT`: releases nasos's holds once their time has passed.
pub fn release(snapshot: &str) -> anyhow::Result<String> {
    let (_, holds) = find(snapshot)?;
    let tags = release_decision(snapshot, &holds, unix_now()).map_err(anyhow::Error::msg)?;
    for t in &tags {
        zsnap::release(t, snapshot, false).with_context(|| format!("releasing {t} on {snapshot}"))?;
    }
    Ok(format!("released {snapshot} ({})", tags.join(", ")))
}

/// What a rollback to a snapshot would destroy: the dataset's later snapshots; refused when one
/// of them is held (ZFS would refuse halfway otherwise).
pub fn rollback_decision(snapshot: &str, snaps: &[Snapshot], holds: &[Hold], now: u64) -> Result<Vec<String>, String> {
    let target = snaps.iter().find(|s| s.name == snapshot).ok_or_else(|| format!("{snapshot} does not exist"))?;
    let later: Vec<&Snapshot> = snaps.iter().filter(|s| s.dataset == target.dataset && s.txg > target.txg).collect();
    let held: Vec<String> = later
        .iter()
        .filter_map(|s| {
            // Holds nasos cannot see (ZFS counts more than `zfs holds` listed) count too.
            let seen = holds.iter().filter(|h| h.snapshot == s.name).count() as u64;
            let unseen = (s.userrefs > seen).then(|| "it is held".to_string());
            Held::of(&s.name, holds).refusal(now).or(unseen).map(|w| format!("{} ({w})", s.name))
        })
        .collect();
    if !held.is_empty() {
        return Err(format!(
            "refusing to roll back to {snapshot}: it would destroy later snapshots that are held: {}",
            held.join("; ")
        ));
    }
    Ok(later.iter().map(|s| s.name.clone()).collect())
}

/// The later snapshots a rollback to `snapshot` destroys (for nasctl's confirmation), or why it
/// is refused.
pub fn rollback_preview(snapshot: &str) -> anyhow::Result<(u64, Vec<String>)> {
    let (snaps, holds) = find(snapshot)?;
    let later = rollback_decision(snapshot, &snaps, &holds, unix_now()).map_err(anyhow::Error::msg)?;
    let created = snaps.iter().find(|s| s.name == snapshot).map_or(0, |s| s.creation);
    Ok((created, later))
}

/// `nasctl rollback SNAPSHOT`, once confirmed.
pub fn rollback(snapshot: &str) -> anyhow::Result<String> {
    let (snaps, holds) = find(snapshot)?;
    let now = unix_now();
    let later = rollback_decision(snapshot, &snaps, &holds, now).map_err(anyhow::Error::msg)?;
    for s in &later {
        release_expired(s, &holds, now)?;
    }
    zsnap::rollback(snapshot, !later.is_empty()).with_context(|| format!("rolling back to {snapshot}"))?;
    Ok(if later.is_empty() {
        format!("rolled back to {snapshot}")
    } else {
        format!("rolled back to {snapshot}; destroyed {}", later.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_796_161_500;

    fn snap(name: &str, txg: u64, userrefs: u64) -> Snapshot {
        let (ds, short) = name.split_once('@').expect("snapshot name");
        Snapshot {
            name: name.into(),
            dataset: ds.into(),
            short: short.into(),
            guid: txg,
            creation: T0 + txg,
            txg,
            used: 0,
            referenced: 0,
            userrefs,
        }
    }

    #[test]
    fn names_are_checked() {
        assert_eq!(split("tank/train@x"), Ok(("tank/train", "x")));
        for bad in ["tank/train", "@x", "tank@", "tank@a@b"] {
            assert!(split(bad).is_err(), "{bad}");
        }
        assert!(check_manual_name("before-upgrade").is_ok());
        let e = check_manual_name("auto-20261201T000000Z-hourly").expect_err("reserved");
        assert!(e.contains("belong to the snapshot policy"), "{e}");
        assert!(check_manual_name("a b").is_err());
        assert!(check_manual_name("").is_err());
    }

    #[test]
    fn a_hold_is_released_only_after_its_time_and_only_nasos_own() {
        let h = |snap: &str, tag: &str| Hold { snapshot: snap.into(), tag: tag.into(), since: T0 };
        let holds = [h("tank/a@x", &hold_tag(T0 + 600)), h("tank/a@x", &hold_tag(T0 + 60)), h("tank/a@y", "keep")];
        let e = release_decision("tank/a@x", &holds, T0).expect_err("not yet");
        assert!(e.contains("held until 2026-12-01 21:55:00 UTC (in 10m)"), "{e}");
        assert_eq!(release_decision("tank/a@x", &holds, T0 + 600).map(|v| v.len()), Ok(2));
        let e = release_decision("tank/a@y", &holds, T0).expect_err("not ours");
        assert!(e.contains("held by keep"), "{e}");
        assert_eq!(release_decision("tank/a@z", &holds, T0), Err("tank/a@z is not held".into()));
    }

    #[test]
    fn a_rollback_names_what_it_destroys_and_refuses_past_a_held_snapshot() {
        let snaps =
            [snap("tank/a@one", 1, 0), snap("tank/a@two", 2, 0), snap("tank/a@three", 3, 1), snap("tank/b@four", 4, 0)];
        let holds = [Hold { snapshot: "tank/a@three".into(), tag: hold_tag(T0 + 3600), since: T0 }];
        assert_eq!(rollback_decision("tank/a@three", &snaps, &holds, T0), Ok(vec![]));
        let e = rollback_decision("tank/a@one", &snaps, &holds, T0).expect_err("held later snapshot");
        assert!(e.contains("tank/a@three (it is held until 2026-12-01 22:45:00 UTC"), "{e}");
        assert!(!e.contains("tank/a@two"), "only the held one is named: {e}");
        assert_eq!(
            rollback_decision("tank/a@one", &snaps, &holds, T0 + 3600),
            Ok(vec!["tank/a@two".into(), "tank/a@three".into()])
        );
        assert!(rollback_decision("tank/a@nope", &snaps, &holds, T0).is_err());
    }
}
