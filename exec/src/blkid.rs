//! What `blkid -p` finds on a device, reading only (`-p` probes the device itself, no cache).
//! nasinit asks it of the state partition and storage of every bay before creating a pool:
//! neither ever formats what it finds something on.

use std::collections::BTreeMap;
use std::path::Path;

use crate::{Error, Tool};

/// A device's content as blkid names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// No signature blkid knows (exit status 2).
    Blank,
    /// A filesystem or other signature (`TYPE`), maybe labelled, or a partition table.
    Found {
        kind: String,
        label: Option<String>,
        /// The signature's UUID: for a ZFS member, its pool's GUID (in decimal).
        uuid: Option<String>,
        partition_table: Option<String>,
    },
}

impl Content {
    /// `a ext4 signature labelled oldbox-data`, `a gpt partition table`.
    pub fn describe(&self) -> String {
        match self {
            Content::Blank => "nothing blkid recognises".to_string(),
            Content::Found { kind, label, partition_table, .. } => {
                if kind.is_empty() {
                    format!("a {} partition table", partition_table.as_deref().unwrap_or("unknown"))
                } else {
                    let label = label.as_ref().map(|l| format!(" labelled {l}")).unwrap_or_default();
                    format!("a {kind} signature{label}")
                }
            }
        }
    }
}

/// Parses `blkid -p -o export` output; `None` when it names nothing.
pub fn parse_export(output: &str) -> Option<Content> {
    let kv: BTreeMap<&str, &str> = output.lines().filter_map(|l| l.split_once('=')).collect();
    let kind = kv.get("TYPE").map(|s| s.to_string());
    let pt = kv.get("PTTYPE").map(|s| s.to_string());
    if kind.is_none() && pt.is_none() {
        return None;
    }
    Some(Content::Found {
        kind: kind.unwrap_or_default(),
        label: kv.get("LABEL").map(|s| s.to_string()),
        uuid: kv.get("UUID").map(|s| s.to_string()),
        partition_table: pt,
    })
}

/// Probes `dev`.
pub fn probe(dev: &Path) -> Result<Content, Error> {
    match Tool::new("blkid").args(["-p", "-o", "export"]).arg(dev).output() {
        // On a partition blkid also prints what the partition table says of it (PART_ENTRY_*),
        // and exits 0 even when the partition holds nothing: only a signature or a partition
        // table counts as content.
        Ok(o) => Ok(parse_export(&o.stdout).unwrap_or(Content::Blank)),
        // Exit status 2: nothing identifiable on the device.
        Err(Error::Failed { status, .. }) if status.code() == Some(2) => Ok(Content::Blank),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blkid_findings_are_described() {
        let zfs = parse_export("DEVNAME=/dev/nvme0n1\nTYPE=zfs_member\nLABEL=oldpool\n").expect("found");
        assert_eq!(zfs.describe(), "a zfs_member signature labelled oldpool");
        let gpt = parse_export("DEVNAME=/dev/nvme0n1\nPTUUID=x\nPTTYPE=gpt\n").expect("found");
        assert_eq!(gpt.describe(), "a gpt partition table");
        assert_eq!(parse_export(""), None);
        assert_eq!(parse_export("DEVNAME=/dev/vda4\n"), None);
        // What blkid -p says of an empty GPT partition: the table's entry, no content.
        let empty = "DEVNAME=/dev/vda4\nPART_ENTRY_SCHEME=gpt\nPART_ENTRY_NAME=nasos-data\nPART_ENTRY_UUID=8e2f\nPART_ENTRY_TYPE=0fc63daf-8483-4772-8e79-3d69d8477de4\nPART_ENTRY_NUMBER=4\n";
        assert_eq!(parse_export(empty), None);
        let ext4 = parse_export("TYPE=ext4\nLABEL=nasos-data\n").expect("found");
        assert!(matches!(&ext4, Content::Found { kind, label: Some(l), .. } if kind == "ext4" && l == "nasos-data"));
    }
}
