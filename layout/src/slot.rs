//! The disk's partitions and how the appliance finds them. The disk is GPT: an ESP, two root
//! slots (A and B) and the state partition. A root slot's partition UUID is the first 128 bits of
//! the verity root hash of the filesystem it holds (systemd's Discoverable Partitions rule), so a
//! UKI that carries only its root hash finds its root in whichever slot it was installed to.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// EFI System Partition.
pub const TYPE_ESP: &str = "c12a7328-f81f-11d2-ba4b-00a0c93ec93b";
/// Root partition, x86-64 (Discoverable Partitions).
pub const TYPE_ROOT_X86_64: &str = "4f68bce3-e8cd-4db1-96e7-fbcaf984b709";
/// Linux filesystem data: the state partition.
pub const TYPE_LINUX_DATA: &str = "0fc63daf-8483-4772-8e79-3d69d8477de4";

pub const LABEL_ESP: &str = "esp";
pub const LABEL_ROOT_A: &str = "nasos-root-a";
pub const LABEL_ROOT_B: &str = "nasos-root-b";
pub const LABEL_DATA: &str = "nasos-data";

/// The device-mapper name of the verified root the initramfs opens.
pub const ROOT_DM_NAME: &str = "nasos-root";

/// One used entry of a GPT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GptEntry {
    /// 1-based.
    pub number: u32,
    pub type_guid: String,
    pub unique_guid: String,
    pub name: String,
}

/// The partition UUID of a root slot holding the filesystem with this verity root hash: its first
/// 32 hex digits as a UUID, lower case. `None` for a hash shorter than 128 bits or not hex.
pub fn root_partuuid(root_hash: &str) -> Option<String> {
    let h = root_hash.get(..32)?;
    if !h.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let h = h.to_ascii_lowercase();
    Some(format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32]))
}

/// A GPT GUID as text: the first three fields are little-endian on disk.
pub fn guid_string(b: &[u8; 16]) -> String {
    format!(
        "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
        b[3], b[2], b[1], b[0], b[5], b[4], b[7], b[6], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]
    )
}

/// Reads a GPT (512-byte sectors): its used entries. `None` when there is no GPT.
pub fn gpt_entries(disk: &mut (impl Read + Seek)) -> Option<Vec<GptEntry>> {
    let mut header = [0u8; 92];
    disk.seek(SeekFrom::Start(512)).ok()?;
    disk.read_exact(&mut header).ok()?;
    if &header[0..8] != b"EFI PART" {
        return None;
    }
    let entries_lba = u64::from_le_bytes(header[72..80].try_into().ok()?);
    let count = u32::from_le_bytes(header[80..84].try_into().ok()?).min(1024);
    let size = u32::from_le_bytes(header[84..88].try_into().ok()?) as usize;
    if !(128..=4096).contains(&size) {
        return None;
    }
    let mut table = vec![0u8; count as usize * size];
    disk.seek(SeekFrom::Start(entries_lba.checked_mul(512)?)).ok()?;
    disk.read_exact(&mut table).ok()?;
    let guid = |b: &[u8]| b.try_into().ok().map(|g: &[u8; 16]| guid_string(g));
    Some(
        table
            .chunks(size)
            .enumerate()
            .filter(|(_, e)| e[0..16].iter().any(|b| *b != 0))
            .filter_map(|(i, e)| {
                // The name is UTF-16LE, NUL-padded, in the 72 bytes after the attributes.
                let words: Vec<u16> =
                    e[56..128].chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).take_while(|w| *w != 0).collect();
                Some(GptEntry {
                    number: i as u32 + 1,
                    type_guid: guid(&e[0..16])?,
                    unique_guid: guid(&e[16..32])?,
                    name: String::from_utf16_lossy(&words),
                })
            })
            .collect(),
    )
}

/// Reads a GPT and returns the 1-based number of the partition whose unique GUID is `partuuid`
/// (any case).
pub fn gpt_partition_number(disk: &mut (impl Read + Seek), partuuid: &str) -> Option<u32> {
    let want = partuuid.to_ascii_lowercase();
    gpt_entries(disk)?.into_iter().find(|e| e.unique_guid == want).map(|e| e.number)
}

/// The device node of partition `number` of `disk` (`vda` → `/dev/vda4`, `nvme0n1` →
/// `/dev/nvme0n1p4`), from sysfs.
pub fn partition_device(sys: &Path, dev: &Path, disk: &str, number: u32) -> Option<PathBuf> {
    for e in fs::read_dir(sys.join("block").join(disk)).ok()?.flatten() {
        if fs::read_to_string(e.path().join("partition")).is_ok_and(|s| s.trim() == number.to_string()) {
            return Some(dev.join(e.file_name()));
        }
    }
    None
}

/// The disk the running verified root comes from: the disk holding the partition under the
/// `nasos-root` device-mapper device.
pub fn root_disk(sys: &Path) -> Option<String> {
    for e in fs::read_dir(sys.join("block")).ok()?.flatten() {
        if !fs::read_to_string(e.path().join("dm/name")).is_ok_and(|n| n.trim() == ROOT_DM_NAME) {
            continue;
        }
        let part = fs::read_dir(e.path().join("slaves")).ok()?.flatten().next()?.file_name();
        // /sys/class/block/vda2 links into .../block/vda/vda2: the parent is the disk.
        let real = fs::canonicalize(sys.join("class/block").join(&part)).ok()?;
        return real.parent()?.file_name().map(|d| d.to_string_lossy().into_owned());
    }
    None
}

/// The state partition: on the disk the root comes from, the Linux-data partition named
/// [`LABEL_DATA`]. (Never looked for on other disks: a bay may hold another nasos box's boot disk.)
pub fn state_partition(sys: &Path, dev: &Path) -> Result<PathBuf, String> {
    let disk = root_disk(sys).ok_or("the disk of the running root is unknown (no nasos-root device)")?;
    let mut f = fs::File::open(dev.join(&disk)).map_err(|e| format!("opening {}: {e}", dev.join(&disk).display()))?;
    let entries = gpt_entries(&mut f).ok_or_else(|| format!("{disk} has no GPT"))?;
    let e = entries
        .iter()
        .find(|e| e.name == LABEL_DATA && e.type_guid == TYPE_LINUX_DATA)
        .ok_or_else(|| format!("{disk} has no partition named {LABEL_DATA}"))?;
    partition_device(sys, dev, &disk, e.number).ok_or_else(|| format!("{disk} partition {} has no device", e.number))
}

/// Finds the block device of the partition whose unique GUID is `partuuid` by reading each disk's
/// GPT, without udev or blkid (the initramfs has neither). `sys` and `dev` are normally `/sys`
/// and `/dev`; tests pass a fixture tree.
pub fn find_partition(sys: &Path, dev: &Path, partuuid: &str) -> Option<PathBuf> {
    let mut disks: Vec<String> = fs::read_dir(sys.join("block"))
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|d| !d.starts_with("loop") && !d.starts_with("dm-") && !d.starts_with("ram"))
        .collect();
    disks.sort();
    for disk in disks {
        let Ok(mut f) = fs::File::open(dev.join(&disk)) else { continue };
        let Some(n) = gpt_partition_number(&mut f, partuuid) else { continue };
        // The partition's own name (sda2, nvme0n1p2, vda2) comes from sysfs.
        if let Some(p) = partition_device(sys, dev, &disk, n) {
            return Some(p);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal GPT: protective MBR sector, header at LBA 1, entries at LBA 2.
    fn gpt_with(guids: &[[u8; 16]]) -> Vec<u8> {
        let mut d = vec![0u8; 512 * 40];
        d[512..520].copy_from_slice(b"EFI PART");
        d[512 + 72..512 + 80].copy_from_slice(&2u64.to_le_bytes());
        d[512 + 80..512 + 84].copy_from_slice(&128u32.to_le_bytes());
        d[512 + 84..512 + 88].copy_from_slice(&128u32.to_le_bytes());
        d.resize(1024 + 128 * 128, 0);
        for (i, g) in guids.iter().enumerate() {
            let e = 1024 + i * 128;
            d[e..e + 16].copy_from_slice(&[1; 16]);
            d[e + 16..e + 32].copy_from_slice(g);
        }
        d
    }

    /// Linux data type 0fc63daf-8483-4772-8e79-3d69d8477de4 as stored on disk.
    const LINUX_DATA: [u8; 16] =
        [0xaf, 0x3d, 0xc6, 0x0f, 0x83, 0x84, 0x72, 0x47, 0x8e, 0x79, 0x3d, 0x69, 0xd8, 0x47, 0x7d, 0xe4];

    fn name(d: &mut [u8], index: usize, ty: [u8; 16], name: &str) {
        let e = 1024 + index * 128;
        d[e..e + 16].copy_from_slice(&ty);
        for (k, w) in name.encode_utf16().enumerate() {
            d[e + 56 + 2 * k..e + 58 + 2 * k].copy_from_slice(&w.to_le_bytes());
        }
    }

    #[test]
    fn the_state_partition_is_found_on_the_root_disk_only() {
        let t = std::env::temp_dir().join(format!("nasos-layout-state-part-{}", std::process::id()));
        let _ = fs::remove_dir_all(&t);
        let (sys, dev) = (t.join("sys"), t.join("dev"));
        // The root disk vda (verity on vda2) and a bay nvme0n1 carrying another box's disk.
        for (disk, parts) in [("vda", 4), ("nvme0n1", 4)] {
            for n in 1..=parts {
                let p = if disk.starts_with("nvme") { format!("{disk}p{n}") } else { format!("{disk}{n}") };
                fs::create_dir_all(sys.join("devices/blk").join(disk).join(&p)).expect("fixture");
                fs::write(sys.join("devices/blk").join(disk).join(&p).join("partition"), format!("{n}\n"))
                    .expect("fixture");
                fs::create_dir_all(sys.join("class/block")).expect("fixture");
                std::os::unix::fs::symlink(
                    sys.join("devices/blk").join(disk).join(&p),
                    sys.join("class/block").join(&p),
                )
                .expect("fixture");
            }
            fs::create_dir_all(sys.join("block")).expect("fixture");
            std::os::unix::fs::symlink(sys.join("devices/blk").join(disk), sys.join("block").join(disk))
                .expect("fixture");
        }
        fs::create_dir_all(sys.join("block/dm-0/dm")).expect("fixture");
        fs::write(sys.join("block/dm-0/dm/name"), "nasos-root\n").expect("fixture");
        fs::create_dir_all(sys.join("block/dm-0/slaves/vda2")).expect("fixture");
        fs::create_dir_all(&dev).expect("fixture");
        for disk in ["vda", "nvme0n1"] {
            let mut d = gpt_with(&[[2; 16], [3; 16], [4; 16], [5; 16]]);
            name(&mut d, 3, LINUX_DATA, LABEL_DATA);
            fs::write(dev.join(disk), d).expect("fixture");
        }
        assert_eq!(root_disk(&sys).as_deref(), Some("vda"));
        assert_eq!(state_partition(&sys, &dev), Ok(dev.join("vda4")));
        let entries = gpt_entries(&mut fs::File::open(dev.join("vda")).expect("disk")).expect("gpt");
        assert_eq!(entries.len(), 4);
        assert_eq!(entries[3].type_guid, TYPE_LINUX_DATA);
        assert_eq!(entries[3].name, LABEL_DATA);
        // Without the verity device there is no root disk, and no guessing.
        fs::remove_dir_all(sys.join("block/dm-0")).expect("fixture");
        assert!(state_partition(&sys, &dev).is_err());
        let _ = fs::remove_dir_all(&t);
    }

    #[test]
    fn root_uuid_is_the_hash_prefix() {
        let h = "0123456789ABCDEF0123456789abcdef".to_string() + &"9".repeat(32);
        assert_eq!(root_partuuid(&h).as_deref(), Some("01234567-89ab-cdef-0123-456789abcdef"));
        assert_eq!(root_partuuid("abc"), None);
        assert_eq!(root_partuuid(&"g".repeat(64)), None);
    }

    #[test]
    fn finds_a_partition_by_its_uuid_in_mixed_endian() {
        // 01234567-89ab-cdef-0123-456789abcdef as stored on disk.
        let on_disk = [0x67, 0x45, 0x23, 0x01, 0xab, 0x89, 0xef, 0xcd, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef];
        assert_eq!(guid_string(&on_disk), "01234567-89ab-cdef-0123-456789abcdef");
        let disk = gpt_with(&[[7; 16], on_disk]);
        let mut c = std::io::Cursor::new(disk);
        assert_eq!(gpt_partition_number(&mut c, "01234567-89AB-cdef-0123-456789abcdef"), Some(2));
        assert_eq!(gpt_partition_number(&mut c, "11234567-89ab-cdef-0123-456789abcdef"), None);
        assert_eq!(gpt_partition_number(&mut std::io::Cursor::new(vec![0u8; 4096]), "x"), None);
    }

    #[test]
    fn finds_the_device_through_sysfs() {
        let t = std::env::temp_dir().join(format!("nasos-layout-slot-{}", std::process::id()));
        let _ = fs::remove_dir_all(&t);
        let (sys, dev) = (t.join("sys"), t.join("dev"));
        fs::create_dir_all(sys.join("block/vda/vda2")).expect("fixture");
        fs::create_dir_all(sys.join("block/vda/vda1")).expect("fixture");
        fs::create_dir_all(sys.join("block/loop0")).expect("fixture");
        fs::write(sys.join("block/vda/vda1/partition"), "1\n").expect("fixture");
        fs::write(sys.join("block/vda/vda2/partition"), "2\n").expect("fixture");
        fs::create_dir_all(&dev).expect("fixture");
        let g = [0x11; 16];
        fs::write(dev.join("vda"), gpt_with(&[[7; 16], g])).expect("fixture");
        assert_eq!(find_partition(&sys, &dev, &guid_string(&g)), Some(dev.join("vda2")));
        assert_eq!(find_partition(&sys, &dev, "00000000-0000-0000-0000-000000000000"), None);
        let _ = fs::remove_dir_all(&t);
    }
}
