//! Storage: the decisions that can be tested without ZFS (what a disk holds, what to do with a
//! pool that is not imported) here, and the agent's bring-up and export in `agent`.

mod agent;

pub use agent::{export, up};

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
