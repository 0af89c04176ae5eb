//! Storage: the decisions that can be tested without ZFS (what a disk holds, what to do with a
//! pool that is not imported) here, and the agent's bring-up and export in `agent`.

mod agent;

pub use agent::{export, probe, replace, up};

/// What a probe of a member disk found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskContent {
    Missing,
    Blank,
    /// Something blkid recognised: a filesystem, a partition table, another pool's label.
    Holds(String),
}

/// Whether a pool may be created over these disks; the error names each bay and what is on it.
pub fn may_create(pool: &str, disks: &[(String, DiskContent)]) -> Result<(), String> {
    let problems: Vec<String> = disks
        .iter()
        .filter_map(|(bay, c)| match c {
            DiskContent::Blank => None,
            DiskContent::Missing => Some(format!("{bay} is empty (no drive found)")),
            DiskContent::Holds(what) => Some(format!("{bay} holds {what}")),
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "refusing to create pool {pool}: {}; nasos never wipes a disk. Clear it deliberately (wipefs -a) or set create = \"import-only\"",
            problems.join("; ")
        ))
    }
}

/// The pool names `zpool import -d DIR` (without a name) lists as importable.
pub fn importable_names(scan: &str) -> Vec<String> {
    scan.lines().filter_map(|l| l.trim().strip_prefix("pool: ")).map(|n| n.trim().to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn importable_pools_are_found_in_zpools_scan() {
        // As zpool 2.3.9 printed it for a pool last used by another host.
        let scan = "  pool: tank\n    id: 644726112428041454\n state: ONLINE\nstatus: The pool was last accessed by another system.\n\n\ttank                   ONLINE\n\t  raidz2-0             ONLINE\n   pool: old\n";
        assert_eq!(importable_names(scan), vec!["tank".to_string(), "old".to_string()]);
        assert!(importable_names("no pools available to import\n").is_empty());
    }

    #[test]
    fn creation_is_refused_for_anything_but_blank_disks() {
        let ok = vec![("BAY01".to_string(), DiskContent::Blank), ("BAY02".to_string(), DiskContent::Blank)];
        assert!(may_create("tank", &ok).is_ok());
        let bad = vec![
            ("BAY01".to_string(), DiskContent::Blank),
            ("BAY02".to_string(), DiskContent::Holds("a ext4 signature".into())),
            ("BAY03".to_string(), DiskContent::Missing),
        ];
        let e = may_create("tank", &bad).expect_err("refused");
        assert!(
            e.contains("BAY02 holds a ext4 signature") && e.contains("BAY03 is empty") && !e.contains("BAY01"),
            "{e}"
        );
        assert!(e.contains("never wipes"));
    }
}

/// What `nasctl replace BAY` does with the drive now in a bay whose pool member is not online.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replace {
    /// The same disk came back (its ZFS label names this pool): bring it online; ZFS resilvers
    /// only what it missed.
    Online,
    /// A blank disk: resilver the member onto it.
    Resilver,
}

/// Decides, from the member's state in the pool, what the bay holds and whether that is a
/// member of this very pool (by pool GUID), what to do — or why not.
pub fn replace_action(
    bay: &str,
    pool: &str,
    member_state: &str,
    content: &DiskContent,
    same_pool: bool,
) -> Result<Replace, String> {
    if member_state == "ONLINE" {
        return Err(format!("{bay} is ONLINE in pool {pool}: there is nothing to replace"));
    }
    match content {
        DiskContent::Missing => Err(format!("{bay} is empty: put the new drive in the bay first")),
        DiskContent::Blank => Ok(Replace::Resilver),
        DiskContent::Holds(_) if same_pool => Ok(Replace::Online),
        DiskContent::Holds(what) => Err(format!(
            "refusing to replace {bay} of pool {pool}: the drive in it holds {what}; nasos never wipes a disk. Clear it deliberately (wipefs -a on every partition, then the disk) and run the command again"
        )),
    }
}

#[cfg(test)]
mod replace_tests {
    use super::*;

    #[test]
    fn only_a_blank_disk_or_the_same_member_is_taken() {
        let holds = DiskContent::Holds("a ext4 signature labelled scratch".into());
        assert_eq!(replace_action("BAY07", "tank", "REMOVED", &DiskContent::Blank, false), Ok(Replace::Resilver));
        assert_eq!(replace_action("BAY07", "tank", "REMOVED", &holds, true), Ok(Replace::Online));
        let e = replace_action("BAY07", "tank", "FAULTED", &holds, false).expect_err("refused");
        assert!(
            e.contains("BAY07") && e.contains("a ext4 signature labelled scratch") && e.contains("never wipes"),
            "{e}"
        );
        let e = replace_action("BAY07", "tank", "REMOVED", &DiskContent::Missing, false).expect_err("refused");
        assert!(e.contains("empty"), "{e}");
        let e = replace_action("BAY07", "tank", "ONLINE", &DiskContent::Blank, false).expect_err("refused");
        assert!(e.contains("nothing to replace"), "{e}");
    }
}
