//! What is mounted where, from `/proc/self/mountinfo`: the NFS service serves an export only
//! when its dataset is what is mounted at its path, never the tmpfs under it.

/// One mount: its filesystem type and source (for ZFS, the dataset's name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub fstype: String,
    pub source: String,
}

/// The mount on top at `path`, from mountinfo text; `None` when nothing is mounted exactly there.
pub fn mount_at(mountinfo: &str, path: &str) -> Option<Mount> {
    mountinfo.lines().rev().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let point = left.split_whitespace().nth(4)?.replace("\\040", " ");
        let mut r = right.split_whitespace();
        let fstype = r.next()?.to_string();
        let source = r.next()?.replace("\\040", " ");
        (point == path).then_some(Mount { fstype, source })
    })
}

/// Whether ZFS dataset `dataset` is what is mounted at `path`; if not, what is there instead.
pub fn dataset_mounted(mountinfo: &str, dataset: &str, path: &str) -> Result<(), String> {
    match mount_at(mountinfo, path) {
        Some(m) if m.fstype == "zfs" && m.source == dataset => Ok(()),
        Some(m) => Err(format!("{path} is {} {} , not dataset {dataset}", m.fstype, m.source).replace(" ,", ",")),
        None => Err(format!("{dataset} is not mounted at {path}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 0:21 / / ro,relatime shared:1 - erofs /dev/dm-0 ro
30 22 0:27 / /export rw,nosuid,nodev shared:9 - tmpfs tmpfs rw,size=1024k,mode=755
95 30 0:52 / /export/tank rw,noatime shared:40 - zfs tank rw,xattr,noacl
96 95 0:53 / /export/tank/train rw,noatime shared:41 - zfs tank/train rw,xattr,noacl
";

    #[test]
    fn an_export_is_served_only_from_its_mounted_dataset() {
        assert_eq!(dataset_mounted(INFO, "tank/train", "/export/tank/train"), Ok(()));
        assert_eq!(
            dataset_mounted(INFO, "tank/scratch", "/export/tank/scratch"),
            Err("tank/scratch is not mounted at /export/tank/scratch".into())
        );
        // The pool's dataset mounted where a child dataset was expected is not the child.
        assert_eq!(
            dataset_mounted(INFO, "tank/train", "/export/tank"),
            Err("/export/tank is zfs tank, not dataset tank/train".into())
        );
        assert_eq!(mount_at(INFO, "/export").map(|m| m.fstype).as_deref(), Some("tmpfs"));
    }
}
