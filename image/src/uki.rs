//! The unified kernel image: systemd's EFI stub with the kernel, the initramfs, the command line
//! (carrying the verity root hash) and os-release added as PE sections by objcopy, each placed
//! after the stub's own sections at the stub's section alignment (what ukify does).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};
use object::read::pe::PeFile64;
use object::{Object, ObjectSection};

/// Where the image's systemd-boot-efi package puts the stub (the build takes it from the image).
pub const STUB: &str = "usr/lib/systemd/boot/efi/linuxx64.efi.stub";
/// ... and systemd-boot itself.
pub const BOOT: &str = "usr/lib/systemd/boot/efi/systemd-bootx64.efi";

pub struct Parts<'a> {
    pub os_release: &'a Path,
    pub cmdline: &'a Path,
    pub kernel: &'a Path,
    pub initrd: &'a Path,
}

pub fn build(stub: &Path, parts: &Parts<'_>, out: &Path, epoch: u64) -> anyhow::Result<()> {
    let bytes = std::fs::read(stub).with_context(|| format!("reading the EFI stub {}", stub.display()))?;
    let pe = PeFile64::parse(&*bytes).context("the EFI stub is not a PE32+ image")?;
    let align = u64::from(pe.nt_headers().optional_header.section_alignment.get(object::LittleEndian)).max(0x1000);
    let end = pe.sections().map(|s| s.address() + s.size()).max().context("the EFI stub has no sections")?;
    let mut vma = end.div_ceil(align) * align;
    let mut cmd = Command::new("objcopy");
    for (name, file) in
        [(".osrel", parts.os_release), (".cmdline", parts.cmdline), (".initrd", parts.initrd), (".linux", parts.kernel)]
    {
        let size = std::fs::metadata(file).with_context(|| format!("reading {}", file.display()))?.len();
        cmd.arg("--add-section").arg(format!("{name}={}", file.display()));
        cmd.arg("--change-section-vma").arg(format!("{name}=0x{vma:x}"));
        vma = (vma + size).div_ceil(align) * align;
    }
    cmd.arg(stub).arg(out);
    let o = cmd.output().context("running objcopy")?;
    if !o.status.success() {
        bail!("objcopy failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    // objcopy stamps PE images with the current time (it ignores SOURCE_DATE_EPOCH for PE):
    // put the build's epoch there and recompute the checksum, so the UKI is reproducible.
    let mut bytes = std::fs::read(out)?;
    set_timestamp(&mut bytes, epoch).context("the UKI is not a PE image")?;
    std::fs::write(out, bytes)?;
    Ok(())
}

/// Sets the COFF TimeDateStamp and recomputes the optional header's CheckSum.
fn set_timestamp(pe: &mut [u8], epoch: u64) -> Option<()> {
    let off = u32::from_le_bytes(pe.get(0x3c..0x40)?.try_into().ok()?) as usize;
    if pe.get(off..off + 4)? != b"PE\0\0" {
        return None;
    }
    pe.get_mut(off + 8..off + 12)?.copy_from_slice(&(epoch as u32).to_le_bytes());
    let csum_at = off + 24 + 64;
    pe.get_mut(csum_at..csum_at + 4)?.copy_from_slice(&[0; 4]);
    let sum = pe_checksum(pe, csum_at);
    pe.get_mut(csum_at..csum_at + 4)?.copy_from_slice(&sum.to_le_bytes());
    Some(())
}

/// The PE image checksum: 16-bit one's-complement-style sum of the file (its own field
/// skipped), folded, plus the file length.
fn pe_checksum(pe: &[u8], csum_at: usize) -> u32 {
    let mut sum: u64 = 0;
    for (i, chunk) in pe.chunks(2).enumerate() {
        let at = i * 2;
        if at >= csum_at && at < csum_at + 4 {
            continue;
        }
        let word = u64::from(chunk[0]) | chunk.get(1).map_or(0, |b| u64::from(*b) << 8);
        sum += word;
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum = (sum & 0xffff) + (sum >> 16);
    (sum as u32).wrapping_add(pe.len() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_ignores_its_own_field_and_counts_length() {
        let mut a = vec![0u8; 256];
        a[0x3c] = 0x40;
        a[0x40..0x44].copy_from_slice(b"PE\0\0");
        a[200] = 1;
        let at = 0x40 + 24 + 64;
        let mut b = a.clone();
        b[at] = 0xff;
        assert_eq!(pe_checksum(&a, at), pe_checksum(&b, at));
        // The words 0x0040 (e_lfanew), 0x4550 ("PE") and 1, plus 256 bytes of length.
        assert_eq!(pe_checksum(&a, at), 0x40 + 0x4550 + 1 + 256);
        set_timestamp(&mut a, 1_700_000_000).expect("pe");
        assert_eq!(u32::from_le_bytes(a[0x48..0x4c].try_into().expect("4")), 1_700_000_000);
        assert_eq!(u32::from_le_bytes(a[at..at + 4].try_into().expect("4")), pe_checksum(&a, at));
        assert!(set_timestamp(&mut [0u8; 16], 1).is_none());
    }
}
