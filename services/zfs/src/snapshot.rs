//! Snapshots and user holds: listing them typed (`zfs list -t snapshot -j`, `zfs holds -H -p`)
//! and the operations on them, each one `zfs` command.

use crate::{Error, parse, run};

/// One snapshot, as `zfs list -t snapshot -j --json-int -p` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// `tank/train@auto-20261201T2145Z-hourly`.
    pub name: String,
    pub dataset: String,
    /// The part after the `@`.
    pub short: String,
    /// Unique in the pool and kept by `zfs send`/`receive`: what says two boxes hold the same
    /// snapshot, whatever it is called.
    pub guid: u64,
    /// Seconds since the epoch.
    pub creation: u64,
    /// The transaction group it was taken in: orders snapshots taken in the same second.
    pub txg: u64,
    /// Bytes only this snapshot holds (what destroying it frees).
    pub used: u64,
    pub referenced: u64,
    /// How many user holds it has (`zfs hold`); a held snapshot cannot be destroyed.
    pub userrefs: u64,
}

/// The properties [`list`] asks for.
const PROPS: &str = "name,guid,creation,used,referenced,userrefs";

/// Reads `zfs list -t snapshot -j -p -o name,guid,creation,used,referenced,userrefs`, oldest
/// first within each dataset (by transaction group).
///
/// Not `--json-int`: zfs 2.3 prints property values as signed 64-bit numbers then, and a GUID
/// of 2^63 or more comes out as 9223372036854775807 — every such snapshot would look like the
/// same one. `-p` alone prints each number exactly, as text.
pub fn parse_list(json: &str) -> Result<Vec<Snapshot>, Error> {
    let list: crate::DatasetList = parse("zfs list -t snapshot", json)?;
    let mut out: Vec<Snapshot> = list
        .datasets
        .into_values()
        .filter(|d| d.kind == "SNAPSHOT")
        .map(|d| {
            let num = |p: &str| d.value(p).and_then(crate::Value::as_u64).unwrap_or(0);
            let (dataset, short) = match (&d.dataset, &d.snapshot_name) {
                (Some(ds), Some(s)) => (ds.clone(), s.clone()),
                _ => {
                    let (ds, s) = d.name.split_once('@').unwrap_or((d.name.as_str(), ""));
                    (ds.to_string(), s.to_string())
                }
            };
            Snapshot {
                guid: num("guid"),
                creation: num("creation"),
                txg: d.createtxg.unwrap_or(0),
                used: num("used"),
                referenced: num("referenced"),
                userrefs: num("userrefs"),
                name: d.name,
                dataset,
                short,
            }
        })
        .collect();
    out.sort_by(|a, b| (&a.dataset, a.txg, a.creation, &a.name).cmp(&(&b.dataset, b.txg, b.creation, &b.name)));
    Ok(out)
}

/// The snapshots of `datasets` (only their own with `recursive` false, theirs and every
/// descendant's with true); every snapshot of every pool when `datasets` is empty.
pub fn list(datasets: &[&str], recursive: bool) -> Result<Vec<Snapshot>, Error> {
    let mut args = vec!["list", "-t", "snapshot", "-j", "-p", "-o", PROPS];
    if !datasets.is_empty() {
        args.push(if recursive { "-r" } else { "-d1" });
        args.extend(datasets);
    }
    parse_list(&run("zfs", &args)?)
}

/// One user hold on a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub snapshot: String,
    pub tag: String,
    /// When it was placed, seconds since the epoch.
    pub since: u64,
}

/// Reads `zfs holds -H -p` (tab-separated: snapshot, tag, time); ZFS 2.3 has no JSON for holds.
pub fn parse_holds(text: &str) -> Vec<Hold> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            let snapshot = f.next()?.trim();
            let tag = f.next()?.trim();
            let since = f.next()?.trim().parse().ok()?;
            (!snapshot.is_empty() && !tag.is_empty()).then(|| Hold {
                snapshot: snapshot.to_string(),
                tag: tag.to_string(),
                since,
            })
        })
        .collect()
}

/// The holds on `snapshots`.
///
/// The list was read a moment before, and the snapshot policy or replication may have destroyed
/// one of them since: a snapshot that no longer exists holds nothing, so it is left out and the
/// rest asked again (once), rather than failing a whole round on a race that is no error.
pub fn holds(snapshots: &[&str]) -> Result<Vec<Hold>, Error> {
    match holds_once(snapshots) {
        Err(Error::Run(e)) => match vanished(e.stderr()) {
            Some(gone) => {
                let left: Vec<&str> = snapshots.iter().copied().filter(|s| !gone.contains(s)).collect();
                holds_once(&left)
            }
            None => Err(Error::Run(e)),
        },
        other => other,
    }
}

fn holds_once(snapshots: &[&str]) -> Result<Vec<Hold>, Error> {
    if snapshots.is_empty() {
        return Ok(Vec::new());
    }
    let mut args = vec!["holds", "-H", "-p"];
    args.extend(snapshots);
    Ok(parse_holds(&run("zfs", &args)?))
}

/// The snapshots `zfs holds` said do not exist, when that is all its stderr says.
fn vanished(stderr: &str) -> Option<Vec<&str>> {
    let lines: Vec<&str> = stderr.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let gone: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("cannot open '")?.strip_suffix("': dataset does not exist"))
        .collect();
    (!gone.is_empty() && gone.len() == lines.len()).then_some(gone)
}

fn r(recursive: bool) -> Option<&'static str> {
    recursive.then_some("-r")
}

/// `zfs snapshot [-r] NAME`: with `recursive`, of the dataset and every descendant, atomically.
pub fn create(name: &str, recursive: bool) -> Result<(), Error> {
    let mut args = vec!["snapshot"];
    args.extend(r(recursive));
    args.push(name);
    run("zfs", &args).map(drop)
}

/// `zfs destroy [-r] NAME` of one snapshot (and, recursive, the same-named ones below).
pub fn destroy(name: &str, recursive: bool) -> Result<(), Error> {
    let mut args = vec!["destroy"];
    args.extend(r(recursive));
    args.push(name);
    run("zfs", &args).map(drop)
}

/// `zfs hold [-r] TAG NAME`.
pub fn hold(tag: &str, name: &str, recursive: bool) -> Result<(), Error> {
    let mut args = vec!["hold"];
    args.extend(r(recursive));
    args.extend([tag, name]);
    run("zfs", &args).map(drop)
}

/// `zfs release [-r] TAG NAME`.
pub fn release(tag: &str, name: &str, recursive: bool) -> Result<(), Error> {
    let mut args = vec!["release"];
    args.extend(r(recursive));
    args.extend([tag, name]);
    run("zfs", &args).map(drop)
}

/// `zfs rollback [-r] NAME`: with `destroy_later`, the snapshots taken after it are destroyed
/// (ZFS refuses to roll back past them otherwise).
pub fn rollback(name: &str, destroy_later: bool) -> Result<(), Error> {
    let mut args = vec!["rollback"];
    args.extend(r(destroy_later));
    args.push(name);
    run("zfs", &args).map(drop)
}

#[cfg(test)]
mod tests {
    use super::vanished;

    #[test]
    fn only_a_stderr_of_vanished_snapshots_is_a_race() {
        // What zfs 2.3 printed when pruning destroyed a snapshot between the list and the holds.
        let race = "cannot open 'tank/train@auto-20261204T045345Z-hourly': dataset does not exist\n\
                    cannot open 'tank/train@repl-dr-1': dataset does not exist\n";
        assert_eq!(vanished(race), Some(vec!["tank/train@auto-20261204T045345Z-hourly", "tank/train@repl-dr-1"]));
        let other = "cannot open 'tank/train@a': dataset does not exist\ninternal error: out of memory\n";
        assert_eq!(vanished(other), None);
        assert_eq!(vanished("cannot open 'tank@x': permission denied"), None);
        assert_eq!(vanished(""), None);
    }
}
