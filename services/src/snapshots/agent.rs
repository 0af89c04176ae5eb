//! The snapshots agent: every minute, one round of each policy of the plan — take what is due,
//! hold it, release holds whose time passed, destroy what is beyond its count and not held.
//! A failing dataset (its pool not imported, a busy snapshot) is said and retried next round;
//! the loop itself never ends.

use std::time::Duration;

use nasos_board::plan::SnapshotPlan;
use nasos_zfs::snapshot as zsnap;

use super::{Round, auto_name, decide, hold_tag};
use crate::{plan, say, unix_now};

/// Rounds run this long after each minute starts: after the boundary a period begins on, with
/// room for a clock that is a little behind.
const AFTER_MINUTE: u64 = 2;

pub fn run() -> anyhow::Result<()> {
    let plan = plan()?;
    if plan.snapshots.is_empty() {
        say("no snapshot policies in the plan");
    }
    for p in &plan.snapshots {
        say(format!(
            "{}{}: every {} min keep {}, hourly {}, daily {}, weekly {}, monthly {}{}",
            p.dataset,
            if p.recursive { " (recursive)" } else { "" },
            p.frequent_minutes,
            p.keep.frequently,
            p.keep.hourly,
            p.keep.daily,
            p.keep.weekly,
            p.keep.monthly,
            if p.hold_seconds > 0 {
                format!(", each held {}", nasos_board::units::format_duration(p.hold_seconds))
            } else {
                String::new()
            }
        ));
    }
    loop {
        let now = unix_now();
        if let Err(e) = round(&plan.snapshots, now) {
            say(format!("snapshots: {e:#}; trying again next minute"));
        }
        let next = (now / 60 + 1) * 60 + AFTER_MINUTE;
        std::thread::sleep(Duration::from_secs(next.saturating_sub(unix_now()).clamp(1, 62)));
    }
}

fn round(policies: &[SnapshotPlan], now: u64) -> anyhow::Result<()> {
    let datasets: Vec<&str> = policies.iter().map(|p| p.dataset.as_str()).collect();
    // Takes first, then a fresh look: a snapshot just taken counts toward its kind's number,
    // and nothing is pruned on the strength of a take that failed.
    for pass in 0..2 {
        let snapshots = zsnap::list(&datasets, false)?;
        let held: Vec<&str> = snapshots.iter().filter(|s| s.userrefs > 0).map(|s| s.name.as_str()).collect();
        let holds = zsnap::holds(&held)?;
        let mut took = false;
        for p in policies {
            let r = decide(p, now, &snapshots, &holds);
            if pass == 0 && !r.take.is_empty() {
                take(p, now, &r);
                took = true;
            } else {
                apply(p, &r);
            }
        }
        if !took {
            break;
        }
    }
    Ok(())
}

/// Takes what is due, and holds each new snapshot at once when the policy holds.
fn take(p: &SnapshotPlan, now: u64, r: &Round) {
    for kind in &r.take {
        let name = format!("{}@{}", p.dataset, auto_name(now, *kind));
        match zsnap::create(&name, p.recursive) {
            Ok(()) => {
                say(format!("took {name}"));
                if p.hold_seconds > 0 {
                    let until = now.saturating_add(p.hold_seconds);
                    step(
                        format!("held {name} until {}", super::human_time(until)),
                        zsnap::hold(&hold_tag(until), &name, p.recursive),
                    );
                }
            }
            Err(e) => say(format!("taking {name} failed: {e}")),
        }
    }
}

fn step(what: String, result: Result<(), nasos_zfs::Error>) {
    match result {
        Ok(()) => say(what),
        Err(e) => say(format!("{what} failed: {e}")),
    }
}

/// Applies a round's holds, releases and prunes, saying each step; one failed step does not
/// stop the others.
fn apply(p: &SnapshotPlan, r: &Round) {
    for (name, until) in &r.hold {
        step(
            format!("held {name} until {}", super::human_time(*until)),
            zsnap::hold(&hold_tag(*until), name, p.recursive),
        );
    }
    for (name, tag) in &r.release {
        step(format!("released {name} ({tag}: its time has passed)"), zsnap::release(tag, name, p.recursive));
    }
    for name in &r.destroy {
        // A snapshot an NFS client has open is busy; it goes in a later round.
        step(format!("pruned {name}"), zsnap::destroy(name, p.recursive));
    }
}
