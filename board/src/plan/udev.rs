//! The bay map as udev rules: udev names a drive after its bay the moment it appears and drops
//! the name when it is pulled, so `/dev/disk/by-bay` follows hot-plug (a link made once at boot
//! would outlive the drive). The match is the one nasinit used to make by hand: the controller's
//! serial on the twin board, its PCI address on real hardware (udev's `ID_PATH`, which names
//! the nearest PCI device even under native multipath), never kernel numbering.

use super::BayPlan;

/// The rules file for `bays`; runs after 60-persistent-storage.rules, which sets `ID_SERIAL_SHORT`
/// and `ID_PATH` for the disk and copies them to its partitions.
pub fn bay_rules(bays: &[BayPlan]) -> String {
    let mut out = String::from(
        "# Written by nasos from the plan's bay map: /dev/disk/by-bay/BAYnn and BAYnn-partN.\n\
         ACTION==\"remove\", GOTO=\"nasos_bays_end\"\n\
         SUBSYSTEM!=\"block\", GOTO=\"nasos_bays_end\"\n\
         KERNEL!=\"nvme*\", GOTO=\"nasos_bays_end\"\n",
    );
    for bay in bays {
        let m = &bay.matcher;
        if let Some(serial) = &m.serial {
            out.push_str(&format!("ENV{{ID_SERIAL_SHORT}}==\"{serial}\", ENV{{NASOS_BAY}}=\"{}\"\n", bay.name));
        } else if let Some(pci) = &m.pci {
            out.push_str(&format!("ENV{{ID_PATH}}==\"pci-{pci}-nvme-*\", ENV{{NASOS_BAY}}=\"{}\"\n", bay.name));
        }
    }
    out.push_str(
        "ENV{NASOS_BAY}==\"?*\", ENV{DEVTYPE}==\"disk\", SYMLINK+=\"disk/by-bay/$env{NASOS_BAY}\"\n\
         ENV{NASOS_BAY}==\"?*\", ENV{DEVTYPE}==\"partition\", SYMLINK+=\"disk/by-bay/$env{NASOS_BAY}-part%n\"\n\
         LABEL=\"nasos_bays_end\"\n",
    );
    out
}

/// The rules file that defers blkid for NVMe drives until `probed` exists (the storage agent
/// creates it once its imports are done). blkid reads a few dozen sectors of every drive and
/// partition, one at a time, and libzfs's import waits for udev to finish each member's
/// partition. What the import needs from udev stays: `ID_PATH`, the by-id and by-bay names.
/// What waits: `ID_FS_*`/`ID_PART_*` and the by-uuid, by-label and by-partuuid names. zed
/// needs one of them, the vdev GUID of a member's partition, to match a pulled drive: the
/// storage agent replays the members' add events once the flag exists. Drives that come later
/// get the full rules.
pub fn boot_rules(probed: &str) -> String {
    format!(
        "# Written by nasos: until {probed} exists (the pools are imported), NVMe drives skip blkid's probe.\n\
         ACTION==\"remove\", GOTO=\"nasos_boot_end\"\n\
         SUBSYSTEM!=\"block\", GOTO=\"nasos_boot_end\"\n\
         KERNEL!=\"nvme*\", GOTO=\"nasos_boot_end\"\n\
         TEST==\"{probed}\", GOTO=\"nasos_boot_end\"\n\
         ENV{{UDEV_DISABLE_PERSISTENT_STORAGE_BLKID_FLAG}}=\"1\"\n\
         LABEL=\"nasos_boot_end\"\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::DeviceMatch;

    #[test]
    fn until_the_flag_exists_nvme_drives_skip_blkid_and_nothing_else_is_touched() {
        let rules = boot_rules("/run/x/probed");
        assert!(rules.contains("TEST==\"/run/x/probed\", GOTO=\"nasos_boot_end\"\n"), "{rules}");
        assert!(rules.contains("KERNEL!=\"nvme*\", GOTO"), "{rules}");
        assert!(rules.contains("ACTION==\"remove\", GOTO"), "{rules}");
        // The one assignment, after every way out: the flag 60-persistent-storage.rules reads.
        let assignments: Vec<&str> =
            rules.lines().filter(|l| !l.starts_with('#') && !l.contains("GOTO") && !l.starts_with("LABEL")).collect();
        assert_eq!(assignments, ["ENV{UDEV_DISABLE_PERSISTENT_STORAGE_BLKID_FLAG}=\"1\""]);
        assert!(rules.trim_end().ends_with("LABEL=\"nasos_boot_end\""));
    }

    #[test]
    fn each_bay_is_matched_by_its_serial_or_its_pci_address() {
        let bays = [
            BayPlan {
                name: "BAY01".into(),
                matcher: DeviceMatch { serial: Some("BAY01".into()), ..Default::default() },
            },
            BayPlan {
                name: "BAY02".into(),
                matcher: DeviceMatch { pci: Some("0000:43:00.0".into()), ..Default::default() },
            },
        ];
        let rules = bay_rules(&bays);
        assert!(rules.contains("ENV{ID_SERIAL_SHORT}==\"BAY01\", ENV{NASOS_BAY}=\"BAY01\"\n"), "{rules}");
        assert!(rules.contains("ENV{ID_PATH}==\"pci-0000:43:00.0-nvme-*\", ENV{NASOS_BAY}=\"BAY02\"\n"), "{rules}");
        assert!(rules.contains("SYMLINK+=\"disk/by-bay/$env{NASOS_BAY}-part%n\""));
        // Removal needs no rule (udev drops the links it made), and nothing but NVMe is named.
        assert!(rules.starts_with("#") && rules.contains("ACTION==\"remove\", GOTO"));
        assert_eq!(rules.matches("GOTO=\"nasos_bays_end\"").count(), 3);
        assert!(rules.trim_end().ends_with("LABEL=\"nasos_bays_end\""));
    }
}
