//! Snapshots: the policy's decisions as pure code (which kinds are due, which snapshots to hold,
//! release and destroy), the names it gives, and the holds that carry their own expiry. The
//! agent that applies them every minute is in `agent`, the operator's commands in `ops`.
//!
//! Names sort by time within a dataset and say which kind made them:
//! `auto-20261201T214500Z-hourly` (the policy's, the only ones it prunes) and
//! `manual-20261201T214500Z` (`nasctl snapshot` without a name).
//!
//! A hold's expiry is its tag (`nasos-until-20261215T214500Z`), so it lives with the snapshot in
//! the pool: it cannot disagree with a separate record, and it survives a factory reset of the
//! state partition or the pool moving to another box. ZFS refuses to destroy a held snapshot;
//! nasos refuses to release one of its holds before the time in its tag.

mod agent;
pub mod ops;

pub use agent::run;
/// Hold times as the recipe writes them (`14d`), for `nasctl snapshot --hold`.
pub use nasos_board::units::parse_duration;

use nasos_board::plan::{Retention, SnapshotPlan};
use nasos_zfs::snapshot::{Hold, Snapshot};
use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time};

/// What the policy names its snapshots with; no other snapshot is ever pruned.
pub const AUTO_PREFIX: &str = "auto-";
/// `nasctl snapshot` names a snapshot this when the operator gives no name.
pub const MANUAL_PREFIX: &str = "manual-";
/// A nasos hold's tag: this, then the time it expires.
pub const HOLD_PREFIX: &str = "nasos-until-";

/// The kinds of automatic snapshot, shortest period first (sanoid's words).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Frequently,
    Hourly,
    Daily,
    Weekly,
    Monthly,
}

impl Kind {
    pub const ALL: [Kind; 5] = [Kind::Frequently, Kind::Hourly, Kind::Daily, Kind::Weekly, Kind::Monthly];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Frequently => "frequently",
            Kind::Hourly => "hourly",
            Kind::Daily => "daily",
            Kind::Weekly => "weekly",
            Kind::Monthly => "monthly",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// How many of this kind the policy keeps.
    pub fn keep(self, r: &Retention) -> u32 {
        match self {
            Kind::Frequently => r.frequently,
            Kind::Hourly => r.hourly,
            Kind::Daily => r.daily,
            Kind::Weekly => r.weekly,
            Kind::Monthly => r.monthly,
        }
    }

    /// When the period that `now` falls in began (UTC): frequent periods start every
    /// `frequent_minutes` on the hour, days at midnight, weeks on Monday, months on the first.
    pub fn period_start(self, now: u64, frequent_minutes: u32) -> u64 {
        const DAY: u64 = 86_400;
        match self {
            Kind::Frequently => {
                let p = u64::from(frequent_minutes.max(1)) * 60;
                now - now % p
            }
            Kind::Hourly => now - now % 3600,
            Kind::Daily => now - now % DAY,
            Kind::Weekly => {
                // 1970-01-01 was a Thursday: three days after a Monday.
                let days = now / DAY;
                (days - (days + 3) % 7) * DAY
            }
            Kind::Monthly => {
                let date = utc(now).date();
                let first = date.replace_day(1).unwrap_or(date);
                let start = PrimitiveDateTime::new(first, Time::MIDNIGHT).assume_utc().unix_timestamp();
                u64::try_from(start).unwrap_or(0)
            }
        }
    }
}

fn utc(t: u64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(i64::try_from(t).unwrap_or(i64::MAX)).unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// The UTC calendar fields of `t`: year, month, day, hour, minute, second.
fn civil(t: u64) -> (i32, u8, u8, u8, u8, u8) {
    let d = utc(t);
    (d.year(), u8::from(d.month()), d.day(), d.hour(), d.minute(), d.second())
}

/// `20261201T214500Z`: sorts as the time does, and is safe in a snapshot name and on a shell line.
pub fn stamp(t: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(t);
    format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}Z")
}

/// The time a [`stamp`] says.
pub fn parse_stamp(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let part = s.get(r)?;
        part.bytes().all(|c| c.is_ascii_digit()).then(|| part.parse().ok())?
    };
    let year = i32::try_from(num(0..4)?).ok()?;
    let month = Month::try_from(u8::try_from(num(4..6)?).ok()?).ok()?;
    let date = Date::from_calendar_date(year, month, u8::try_from(num(6..8)?).ok()?).ok()?;
    let [h, m, sec] = [num(9..11)?, num(11..13)?, num(13..15)?].map(|v| u8::try_from(v).unwrap_or(u8::MAX));
    let time = Time::from_hms(h, m, sec).ok()?;
    u64::try_from(PrimitiveDateTime::new(date, time).assume_utc().unix_timestamp()).ok()
}

/// A time for people: `2026-12-15 21:45:00 UTC`.
pub fn human_time(t: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(t);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02} UTC")
}

/// The name the policy gives a snapshot of `kind` taken at `t` (the part after the `@`).
pub fn auto_name(t: u64, kind: Kind) -> String {
    format!("{AUTO_PREFIX}{}-{}", stamp(t), kind.as_str())
}

/// When and of which kind a policy snapshot was taken; `None` for any other snapshot.
pub fn parse_auto(short: &str) -> Option<(u64, Kind)> {
    let rest = short.strip_prefix(AUTO_PREFIX)?;
    let (stamp, kind) = rest.split_once('-')?;
    Some((parse_stamp(stamp)?, Kind::parse(kind)?))
}

/// The tag of a nasos hold that expires at `until`.
pub fn hold_tag(until: u64) -> String {
    format!("{HOLD_PREFIX}{}", stamp(until))
}

/// When a nasos hold expires; `None` for any other tag (replication's, an operator's own).
pub fn hold_until(tag: &str) -> Option<u64> {
    parse_stamp(tag.strip_prefix(HOLD_PREFIX)?)
}

/// How a snapshot is held, from its holds: the latest expiry among nasos's holds, and the other
/// holds' tags (nasos never releases those).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    pub until: Option<u64>,
    pub others: Vec<String>,
}

impl Held {
    pub fn of<'a>(snapshot: &str, holds: impl IntoIterator<Item = &'a Hold>) -> Held {
        let mut h = Held::default();
        for hold in holds.into_iter().filter(|x| x.snapshot == snapshot) {
            match hold_until(&hold.tag) {
                Some(t) => h.until = Some(h.until.map_or(t, |u| u.max(t))),
                None => h.others.push(hold.tag.clone()),
            }
        }
        h
    }

    /// Why it cannot be destroyed or released at `now`, if it cannot.
    pub fn refusal(&self, now: u64) -> Option<String> {
        if let Some(until) = self.until.filter(|u| *u > now) {
            return Some(format!("it is held until {} (in {})", human_time(until), human_span(until - now)));
        }
        if !self.others.is_empty() {
            return Some(format!("it is held by {}", self.others.join(", ")));
        }
        None
    }
}

/// `13d 23h`, `4m 10s`: the two largest units.
pub fn human_span(secs: u64) -> String {
    let units = [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)];
    let mut parts = Vec::new();
    let mut rest = secs;
    for (name, size) in units {
        if rest >= size || (parts.is_empty() && size == 1) {
            parts.push(format!("{}{name}", rest / size));
            rest %= size;
        }
        if parts.len() == 2 {
            break;
        }
    }
    parts.join(" ")
}

/// What one round of a policy does, decided from the dataset's snapshots and their holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Round {
    /// Kinds whose period began since the last snapshot of that kind: take one of each now.
    pub take: Vec<Kind>,
    /// Policy snapshots still inside their hold time without a nasos hold (a snapshot taken just
    /// before a crash, or before the policy had a hold): hold them until the given time.
    pub hold: Vec<(String, u64)>,
    /// nasos holds whose time has passed: release them.
    pub release: Vec<(String, String)>,
    /// Policy snapshots beyond their kind's count, not held: destroy them.
    pub destroy: Vec<String>,
    /// Policy snapshots beyond their kind's count that stay, and why.
    pub kept: Vec<(String, String)>,
}

/// Decides a round of `policy` at `now`. `snapshots` are the dataset's own (for a recursive
/// policy, the top dataset's: its snapshots, holds and destroys are recursive); `holds` those
/// of any snapshot with holds.
pub fn decide(policy: &SnapshotPlan, now: u64, snapshots: &[Snapshot], holds: &[Hold]) -> Round {
    let mut round = Round::default();
    let own: Vec<&Snapshot> = snapshots.iter().filter(|s| s.dataset == policy.dataset).collect();
    let autos: Vec<(&Snapshot, u64, Kind)> =
        own.iter().filter_map(|s| parse_auto(&s.short).map(|(t, k)| (*s, t, k))).collect();
    for kind in Kind::ALL {
        if kind.keep(&policy.keep) == 0 {
            continue;
        }
        let start = kind.period_start(now, policy.frequent_minutes);
        if !autos.iter().any(|(_, t, k)| *k == kind && *t >= start) {
            round.take.push(kind);
        }
    }
    // Releases first: a snapshot whose hold ran out can go in the same round.
    let mut still_held: Vec<&str> = Vec::new();
    for s in &own {
        let mine: Vec<&Hold> = holds.iter().filter(|h| h.snapshot == s.name).collect();
        let mut remaining = mine.len();
        for h in mine {
            if hold_until(&h.tag).is_some_and(|u| u <= now) {
                round.release.push((s.name.clone(), h.tag.clone()));
                remaining -= 1;
            }
        }
        // A hold nasos cannot see (`zfs holds` failed, or a child's under a recursive policy)
        // still counts: ZFS says how many there are.
        let counted = usize::try_from(s.userrefs).unwrap_or(usize::MAX);
        let unseen = counted.saturating_sub(holds.iter().filter(|h| h.snapshot == s.name).count());
        if remaining + unseen > 0 {
            still_held.push(&s.name);
        }
    }
    if policy.hold_seconds > 0 {
        for (s, t, _) in &autos {
            let until = t.saturating_add(policy.hold_seconds);
            let has = holds.iter().any(|h| h.snapshot == s.name && hold_until(&h.tag).is_some());
            if until > now && !has {
                round.hold.push((s.name.clone(), until));
                still_held.push(&s.name);
            }
        }
    }
    for kind in Kind::ALL {
        let mut of_kind: Vec<&(&Snapshot, u64, Kind)> = autos.iter().filter(|(_, _, k)| *k == kind).collect();
        of_kind.sort_by(|a, b| (b.1, &b.0.name).cmp(&(a.1, &a.0.name)));
        // The newest of each kind stays even when the policy keeps none of it any more.
        let keep = usize::try_from(kind.keep(&policy.keep).max(1)).unwrap_or(usize::MAX);
        for (s, _, _) in of_kind.into_iter().skip(keep) {
            if still_held.contains(&s.name.as_str()) {
                let why = Held::of(&s.name, holds)
                    .refusal(now)
                    .unwrap_or_else(|| "it is held (its hold is placed this round)".into());
                round.kept.push((s.name.clone(), why));
            } else {
                round.destroy.push(s.name.clone());
            }
        }
    }
    round
}

#[cfg(test)]
mod tests;
