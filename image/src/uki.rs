//! The unified kernel image: systemd's EFI stub with the kernel, the initramfs, the command line
//! (carrying the verity root hash) and os-release added as PE sections by objcopy, each placed
//! after the stub's own sections at the stub's section alignment (what ukify does).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};
use object::read::pe::PeFile64;
use object::{Object, ObjectSection};

pub const STUB: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";

pub struct Parts<'a> {
    pub os_release: &'a Path,
    pub cmdline: &'a Path,
    pub kernel: &'a Path,
    pub initrd: &'a Path,
}

pub fn build(stub: &Path, parts: &Parts<'_>, out: &Path) -> anyhow::Result<()> {
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
    Ok(())
}
