//! What an operator wants from a pool at a glance: health, space, and each member by bay.

use serde::Serialize;

use crate::{PoolStatus, Vdev};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Member {
    /// The bay (`BAY03`) when the disk is named by bay, else the device name.
    pub disk: String,
    /// The top-level vdev it belongs to (`raidz2-0`, `spare`, …).
    pub group: String,
    pub state: String,
    pub errors: u64,
}

/// Every leaf disk of a pool, in the order ZFS lists them.
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
    out
}

fn collect(v: &Vdev, group: &str, out: &mut Vec<Member>) {
    for child in v.vdevs.values() {
        if child.vdevs.is_empty() {
            out.push(leaf(child, group));
        } else {
            // A replacing/spare vdev inside a raidz: its leaves still belong to the group.
            collect(child, group, out);
        }
    }
}

fn leaf(v: &Vdev, group: &str) -> Member {
    let disk = v.name.rsplit('/').next().unwrap_or(&v.name).to_string();
    Member {
        disk,
        group: group.to_string(),
        state: v.state.clone(),
        errors: v.read_errors + v.write_errors + v.checksum_errors,
    }
}

/// Read + write + checksum errors over the whole pool.
pub fn errors(pool: &PoolStatus) -> u64 {
    members(pool).iter().map(|m| m.errors).sum()
}
