//! The A/B disk: GPT with an ESP (systemd-boot and the UKI, named for boot counting), root-A
//! holding this build, root-B empty, and a blank state partition. GUIDs derive from the image's content
//! and the ESP is written with fixed timestamps, so the same inputs give the same disk.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use anyhow::{Context, bail};
use gpt::partition::Partition;
use gpt::partition_types;
use nasos_layout::slot;

pub const SECTOR: u64 = 512;
const MIB: u64 = 1 << 20;

/// Sizes of the partitions, in MiB.
pub struct Layout {
    pub esp_mib: u64,
    pub slot_mib: u64,
    pub data_mib: u64,
}

/// Stable identities of the partitions, derived from the build.
pub struct Guids {
    pub disk: uuid::Uuid,
    pub esp: uuid::Uuid,
    pub root_a: uuid::Uuid,
    pub root_b: uuid::Uuid,
    pub data: uuid::Uuid,
}

impl Guids {
    /// The partitions' GUIDs for a build whose root has this verity root hash: root-A's by the
    /// slot contract (the hash's first 128 bits), the others derived from the hash.
    pub fn derive(root_hash: &str) -> anyhow::Result<Guids> {
        let seed = root_hash;
        use sha2::{Digest, Sha256};
        let g = |what: &str| {
            let d = Sha256::digest(format!("{seed}/{what}").as_bytes());
            let mut b = [0u8; 16];
            b.copy_from_slice(&d[..16]);
            // RFC 4122 version 4 / variant bits, so tools treat them as ordinary random GUIDs.
            b[6] = (b[6] & 0x0f) | 0x40;
            b[8] = (b[8] & 0x3f) | 0x80;
            uuid::Uuid::from_bytes(b)
        };
        let root_a = slot::root_partuuid(root_hash)
            .with_context(|| format!("the verity root hash {root_hash} is not 128 bits of hex or more"))?;
        let root_a = uuid::Uuid::parse_str(&root_a)?;
        Ok(Guids { disk: g("disk"), esp: g("esp"), root_a, root_b: g("root-b"), data: g("data") })
    }
}

/// Files to put on the ESP: (path on the ESP, contents).
pub type EspFiles = Vec<(String, Vec<u8>)>;

/// Writes the whole disk image to `out` (sparse): GPT, ESP, root-A, an empty root-B, and data.
pub fn build(
    out: &Path,
    layout: &Layout,
    guids: &Guids,
    esp: &EspFiles,
    root_a: &Path,
    epoch: u64,
) -> anyhow::Result<()> {
    let root_len = std::fs::metadata(root_a)?.len();
    if root_len > layout.slot_mib * MIB {
        bail!(
            "the root filesystem with its hash tree is {} MiB, more than the {} MiB slot (image.size_budget_mib)",
            root_len.div_ceil(MIB),
            layout.slot_mib
        );
    }
    // 1 MiB for the GPT at the front, the partitions 1 MiB aligned, 1 MiB for the backup GPT.
    let esp_start = MIB;
    let a_start = esp_start + layout.esp_mib * MIB;
    let b_start = a_start + layout.slot_mib * MIB;
    let data_start = b_start + layout.slot_mib * MIB;
    let total = data_start + layout.data_mib * MIB + MIB;
    let _ = std::fs::remove_file(out);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(out)
        .with_context(|| format!("creating {}", out.display()))?;
    f.set_len(total)?;

    let ty = |guid: &str| -> anyhow::Result<partition_types::Type> {
        Ok(partition_types::Type { guid: uuid::Uuid::parse_str(guid)?, os: partition_types::OperatingSystem::None })
    };
    let (esp_type, root_type, data_type) =
        (ty(slot::TYPE_ESP)?, ty(slot::TYPE_ROOT_X86_64)?, ty(slot::TYPE_LINUX_DATA)?);
    let part = |ty: partition_types::Type, guid: uuid::Uuid, start: u64, mib: u64, name: &str| Partition {
        part_type_guid: ty,
        part_guid: guid,
        first_lba: start / SECTOR,
        last_lba: (start + mib * MIB) / SECTOR - 1,
        flags: 0,
        name: name.to_string(),
    };
    let mut parts: BTreeMap<u32, Partition> = BTreeMap::new();
    parts.insert(1, part(esp_type, guids.esp, esp_start, layout.esp_mib, slot::LABEL_ESP));
    parts.insert(2, part(root_type.clone(), guids.root_a, a_start, layout.slot_mib, slot::LABEL_ROOT_A));
    parts.insert(3, part(root_type, guids.root_b, b_start, layout.slot_mib, slot::LABEL_ROOT_B));
    parts.insert(4, part(data_type, guids.data, data_start, layout.data_mib, slot::LABEL_DATA));
    // Keep the customary 128 entries; the rest are unused.
    for i in 5..=128 {
        parts.insert(i, Partition::zero());
    }
    let mbr = gpt::mbr::ProtectiveMBR::with_lb_size(u32::try_from(total / SECTOR - 1).unwrap_or(u32::MAX));
    mbr.overwrite_lba0(&mut f).context("writing the protective MBR")?;
    let mut disk = gpt::GptConfig::new()
        .writable(true)
        .logical_block_size(gpt::disk::LogicalBlockSize::Lb512)
        .change_partition_count(true)
        .create_from_device(f, Some(guids.disk))
        .context("creating the GPT")?;
    disk.update_partitions(parts).context("laying out the partitions")?;
    let mut f = disk.write().context("writing the GPT")?;

    let esp_img = out.with_extension("esp");
    write_fat(&esp_img, layout.esp_mib, esp, guids.esp.as_fields().0, epoch)?;
    copy_into(&mut f, &esp_img, esp_start)?;
    std::fs::remove_file(&esp_img)?;
    copy_into(&mut f, root_a, a_start)?;
    // The state partition stays blank (sparse zeros): each box makes its filesystem on first
    // boot, with its own UUID, and nasinit never formats a partition that holds anything.
    f.sync_all()?;
    Ok(())
}

/// Formats the FAT32 ESP with mkfs.vfat and writes the files with mtools. (A FAT written by the
/// fatfs crate booted, but OVMF's FAT driver refused to rename files on it, which breaks
/// systemd-boot's boot counting.) `--invariant`, a fixed volume id and SOURCE_DATE_EPOCH for
/// mtools make it reproducible.
fn write_fat(img: &Path, mib: u64, files: &EspFiles, volume_id: u32, epoch: u64) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(img);
    File::create(img)?.set_len(mib * MIB)?;
    let tool = |name: &str, args: &[&str]| -> anyhow::Result<()> {
        let o = std::process::Command::new(name)
            .args(args)
            .env("SOURCE_DATE_EPOCH", epoch.to_string())
            .env("MTOOLS_SKIP_CHECK", "1")
            .output()
            .with_context(|| format!("running {name}"))?;
        if !o.status.success() {
            bail!("{name} {} failed: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim());
        }
        Ok(())
    };
    let img_s = img.display().to_string();
    tool("mkfs.vfat", &["--invariant", "-i", &format!("{volume_id:08x}"), "-F", "32", "-n", "NASOS-ESP", &img_s])?;
    let dir = img.with_extension("files");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let mut made: Vec<String> = Vec::new();
    for (i, (path, data)) in files.iter().enumerate() {
        let comps: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        for depth in 1..comps.len() {
            let d = comps[..depth].join("/");
            if !made.contains(&d) {
                tool("mmd", &["-i", &img_s, &format!("::{d}")])?;
                made.push(d);
            }
        }
        let src = dir.join(i.to_string());
        std::fs::write(&src, data)?;
        tool("mcopy", &["-i", &img_s, &src.display().to_string(), &format!("::{}", comps.join("/"))])?;
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

fn copy_into(dest: &mut File, src: &Path, offset: u64) -> anyhow::Result<()> {
    let mut s = File::open(src).with_context(|| format!("opening {}", src.display()))?;
    dest.seek(SeekFrom::Start(offset))?;
    let mut buf = vec![0u8; 4 * MIB as usize];
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        // Leave runs of zeros as holes: the raw image stays sparse.
        if buf[..n].iter().all(|&b| b == 0) {
            dest.seek(SeekFrom::Current(n as i64))?;
        } else {
            dest.write_all(&buf[..n])?;
        }
    }
    Ok(())
}
