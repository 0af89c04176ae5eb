//! The boot disk as the upgrade sees it: the ESP, the two root slots (which one runs, which one
//! may be written), each slot's partition UUID and size. Read from sysfs and the GPT through a
//! root directory pair, so tests use a fixture.

use std::path::{Path, PathBuf};

use nasos_layout::slot::{self, GptEntry};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// "a" or "b".
    pub name: &'static str,
    pub number: u32,
    pub device: PathBuf,
    pub partuuid: String,
    pub bytes: u64,
    /// The running root is on this slot.
    pub running: bool,
}

#[derive(Debug, Clone)]
pub struct BootDisk {
    /// The whole disk (`/dev/vda`).
    pub device: PathBuf,
    pub esp: PathBuf,
    pub slots: Vec<Slot>,
}

impl BootDisk {
    pub fn running(&self) -> Option<&Slot> {
        self.slots.iter().find(|s| s.running)
    }

    /// The slot an upgrade writes: the one that is not running.
    pub fn inactive(&self) -> Option<&Slot> {
        self.slots.iter().find(|s| !s.running)
    }

    /// The slot whose partition UUID a root hash names.
    pub fn slot_of_root_hash(&self, root_hash: &str) -> Option<&Slot> {
        let want = slot::root_partuuid(root_hash)?;
        self.slots.iter().find(|s| s.partuuid == want)
    }
}

/// Finds the boot disk: the disk of the running verified root, its ESP and both root slots.
pub fn discover(sys: &Path, dev: &Path) -> Result<BootDisk, String> {
    let disk = slot::root_disk(sys).ok_or("the disk of the running root is unknown (no nasos-root device)")?;
    let device = dev.join(&disk);
    let mut f = std::fs::File::open(&device).map_err(|e| format!("opening {}: {e}", device.display()))?;
    let entries = slot::gpt_entries(&mut f).ok_or_else(|| format!("{disk} has no GPT"))?;
    let running_part = running_partition(sys);
    let part = |e: &GptEntry| {
        slot::partition_device(sys, dev, &disk, e.number)
            .ok_or_else(|| format!("{disk} partition {} has no device", e.number))
    };
    let esp = entries
        .iter()
        .find(|e| e.type_guid == slot::TYPE_ESP)
        .ok_or_else(|| format!("{disk} has no EFI system partition"))?;
    let esp = part(esp)?;
    let mut slots = Vec::new();
    for (name, label) in [("a", slot::LABEL_ROOT_A), ("b", slot::LABEL_ROOT_B)] {
        let e = entries
            .iter()
            .find(|e| e.name == label && e.type_guid == slot::TYPE_ROOT_X86_64)
            .ok_or_else(|| format!("{disk} has no root slot named {label}"))?;
        let device = part(e)?;
        let dev_name = device.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let sectors = std::fs::read_to_string(sys.join("class/block").join(&dev_name).join("size"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        slots.push(Slot {
            name,
            number: e.number,
            running: running_part.as_deref() == Some(dev_name.as_str()),
            device,
            partuuid: e.unique_guid.clone(),
            bytes: sectors * 512,
        });
    }
    if !slots.iter().any(|s| s.running) {
        return Err("the running root is on neither root slot".into());
    }
    Ok(BootDisk { device, esp, slots })
}

/// The partition under the `nasos-root` verity device (`vda2`).
fn running_partition(sys: &Path) -> Option<String> {
    for e in std::fs::read_dir(sys.join("block")).ok()?.flatten() {
        if std::fs::read_to_string(e.path().join("dm/name")).is_ok_and(|n| n.trim() == slot::ROOT_DM_NAME) {
            let slave = std::fs::read_dir(e.path().join("slaves")).ok()?.flatten().next()?;
            return Some(slave.file_name().to_string_lossy().into_owned());
        }
    }
    None
}

/// Gives partition `number` of `disk` (a whole-disk device or image) the unique GUID `uuid`,
/// in the primary and the backup GPT, and syncs. Only the GUID changes.
pub fn set_partuuid(disk: &Path, number: u32, uuid: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    let guid = uuid::Uuid::parse_str(uuid).with_context(|| format!("{uuid} is not a UUID"))?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(disk)
        .with_context(|| format!("opening {}", disk.display()))?;
    let mut gpt = gpt::GptConfig::new()
        .writable(true)
        .logical_block_size(gpt::disk::LogicalBlockSize::Lb512)
        .open_from_device(f)
        .with_context(|| format!("reading the GPT of {}", disk.display()))?;
    let mut parts = gpt.partitions().clone();
    let p = parts.get_mut(&number).with_context(|| format!("{} has no partition {number}", disk.display()))?;
    p.part_guid = guid;
    gpt.update_partitions(parts).context("updating the partition table")?;
    let f = gpt.write().with_context(|| format!("writing the GPT of {}", disk.display()))?;
    f.sync_all().with_context(|| format!("syncing {}", disk.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real GPT disk image made by the same crate the image builder uses.
    fn disk_image(path: &Path) {
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path).expect("img");
        f.set_len(64 << 20).expect("size");
        let mbr = gpt::mbr::ProtectiveMBR::with_lb_size(u32::try_from((64u64 << 20) / 512 - 1).expect("fits"));
        let mut f = f;
        mbr.overwrite_lba0(&mut f).expect("mbr");
        let mut g = gpt::GptConfig::new()
            .writable(true)
            .logical_block_size(gpt::disk::LogicalBlockSize::Lb512)
            .create_from_device(f, None)
            .expect("gpt");
        for (name, mib) in
            [(slot::LABEL_ESP, 8), (slot::LABEL_ROOT_A, 16), (slot::LABEL_ROOT_B, 16), (slot::LABEL_DATA, 8)]
        {
            g.add_partition(name, mib << 20, gpt::partition_types::LINUX_FS, 0, None).expect("part");
        }
        g.write().expect("write");
    }

    #[test]
    fn a_slot_s_uuid_changes_in_both_tables_and_nothing_else() {
        let p = std::env::temp_dir().join(format!("nasos-slots-{}.img", std::process::id()));
        disk_image(&p);
        let before = slot::gpt_entries(&mut std::fs::File::open(&p).expect("img")).expect("gpt");
        let new = slot::root_partuuid(&"ab".repeat(32)).expect("uuid");
        set_partuuid(&p, 3, &new).expect("set");
        let after = slot::gpt_entries(&mut std::fs::File::open(&p).expect("img")).expect("gpt");
        assert_eq!(after.len(), before.len());
        for (b, a) in before.iter().zip(&after) {
            if a.number == 3 {
                assert_eq!(a.unique_guid, new);
                assert_eq!((a.name.as_str(), a.type_guid.as_str()), (b.name.as_str(), b.type_guid.as_str()));
            } else {
                assert_eq!(a, b);
            }
        }
        // The backup table agrees: the crate reads both and checks their CRCs.
        let f = std::fs::File::open(&p).expect("img");
        let g = gpt::GptConfig::new().writable(false).open_from_device(f).expect("both tables valid");
        assert_eq!(g.partitions()[&3].part_guid.to_string(), new);
        let _ = std::fs::remove_file(&p);
    }
}
