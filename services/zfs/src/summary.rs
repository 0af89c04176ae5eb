//! What an operator wants from a pool at a glance: health, space, and each member by bay.

use serde::{Deserialize, Serialize};

use crate::{PoolStatus, Vdev};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The bay (`BAY03`) when the disk is named by bay, else the device name.
    pub disk: String,
    /// The top-level vdev it belongs to (`raidz2-0`, `spare`, …).
    pub group: String,
    pub state: String,
    /// Read + write + checksum errors.
    pub errors: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub checksum_errors: u64,
    /// For a hot spare at work: the disk(s) it stands in for (`BAY07`), on both of its lines
    /// (inside the data vdev and in the spares list, where it is INUSE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spare_for: Option<String>,
}

/// Every leaf disk of a pool, in the order ZFS lists them: data vdevs, then logs, cache and
/// spares.
pub fn members(pool: &PoolStatus) -> Vec<Member> {
    let mut out = Vec::new();
    for root in pool.vdevs.values() {
        for (group_name, group) in &root.vdevs {
            if group.vdevs.is_empty() {
                out.push(leaf(group, "-"));
            }
            collect(group, group_name, &mut out);
        }
    }
    for (class, devices) in [("logs", &pool.logs), ("cache", &pool.l2cache), ("spare", &pool.spares)] {
        for (name, v) in devices {
            if v.vdevs.is_empty() {
                let mut m = leaf(v, class);
                // The same disk (by GUID) inside a data vdev says whom it stands in for.
                m.spare_for = pool.vdevs.values().find_map(|root| spare_for(root, v.guid));
                out.push(m);
            }
            // A mirrored log is a group of its own.
            collect(v, if v.vdevs.is_empty() { class } else { name }, &mut out);
        }
    }
    out
}

fn collect(v: &Vdev, group: &str, out: &mut Vec<Member>) {
    for child in v.vdevs.values() {
        if child.vdevs.is_empty() {
            let mut m = leaf(child, group);
            if v.vdev_type == "spare" && child.class.as_deref() == Some("spare") {
                m.spare_for = Some(replaced(v));
            }
            out.push(m);
        } else {
            // A replacing/spare vdev inside a raidz: its leaves still belong to the group.
            collect(child, group, out);
        }
    }
}

/// The disks a `spare-N` vdev holds besides its hot spare: the ones the spare stands in for.
fn replaced(spare: &Vdev) -> String {
    let names: Vec<&str> = spare
        .vdevs
        .values()
        .filter(|c| c.class.as_deref() != Some("spare"))
        .map(|c| c.name.rsplit('/').next().unwrap_or(&c.name))
        .collect();
    names.join(" ")
}

/// Whom the hot spare with this GUID stands in for, if it is at work anywhere under `v`.
fn spare_for(v: &Vdev, guid: u64) -> Option<String> {
    if v.vdev_type == "spare" && v.vdevs.values().any(|c| c.guid == guid && c.class.as_deref() == Some("spare")) {
        return Some(replaced(v));
    }
    v.vdevs.values().find_map(|c| spare_for(c, guid))
}

fn leaf(v: &Vdev, group: &str) -> Member {
    let disk = v.name.rsplit('/').next().unwrap_or(&v.name).to_string();
    Member {
        disk,
        group: group.to_string(),
        state: v.state.clone(),
        errors: v.read_errors + v.write_errors + v.checksum_errors,
        read_errors: v.read_errors,
        write_errors: v.write_errors,
        checksum_errors: v.checksum_errors,
        spare_for: None,
    }
}

/// Read + write + checksum errors over the whole pool.
pub fn errors(pool: &PoolStatus) -> u64 {
    members(pool).iter().map(|m| m.errors).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf_json(name: &str) -> String {
        format!(
            r#""{name}":{{"name":"{name}","vdev_type":"disk","guid":1,"state":"ONLINE","read_errors":0,"write_errors":0,"checksum_errors":{}}}"#,
            if name.ends_with("BAY03") { 2 } else { 0 }
        )
    }

    #[test]
    fn members_keep_zfs_order_and_include_spares() {
        // The shape of zpool status -j, cut down; the spares key is modelled on the text output.
        let json = format!(
            r#"{{"output_version":{{"command":"zpool status","vers_major":0,"vers_minor":1}},"pools":{{"t":{{"name":"t","state":"ONLINE","pool_guid":2,"txg":1,
            "vdevs":{{"t":{{"name":"t","vdev_type":"root","guid":2,"state":"ONLINE","vdevs":{{
              "raidz2-10":{{"name":"raidz2-10","vdev_type":"raidz","guid":3,"state":"ONLINE","vdevs":{{{},{}}}}},
              "raidz2-2":{{"name":"raidz2-2","vdev_type":"raidz","guid":4,"state":"ONLINE","vdevs":{{{}}}}}}}}}}},
            "spares":{{{}}}}}}}}}"#,
            leaf_json("disk/by-bay/BAY01"),
            leaf_json("disk/by-bay/BAY02"),
            leaf_json("disk/by-bay/BAY03"),
            leaf_json("disk/by-bay/BAY12"),
        );
        let s = crate::parse_status(&json).expect("parses");
        let m = members(&s.pools["t"]);
        let got: Vec<(&str, &str)> = m.iter().map(|m| (m.disk.as_str(), m.group.as_str())).collect();
        assert_eq!(
            got,
            vec![("BAY01", "raidz2-10"), ("BAY02", "raidz2-10"), ("BAY03", "raidz2-2"), ("BAY12", "spare")]
        );
        assert_eq!(errors(&s.pools["t"]), 2);
    }
}
