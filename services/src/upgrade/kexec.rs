//! Fast reboots: the kernel of the entry systemd-boot would start next, loaded with kexec, so a
//! reboot goes from the old kernel straight to the new one and skips the firmware — minutes of
//! POST on an EPYC server, during which the GPU cluster waits. The choice and the try counting
//! are systemd-boot's own: the one-shot entry (a downgrade's first boot, the variable then
//! deleted), else the newest version with tries left; an entry on trial is renamed with one try
//! fewer before the reboot, as systemd-boot renames it, and the new kernel is told which file it
//! is (`nasos.kexec-entry=`) because the firmware's variables still describe the boot before.
//! The verified root is the UKI's own command line, unchanged; the kernel is checked by the
//! running kernel as kexec_file_load does (signatures, under lockdown). Anything that does not
//! work leaves nothing loaded, and the reboot goes through the firmware.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use anyhow::{Context, bail};
use nasos_layout::entry;

/// What a fast reboot will start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    pub version: String,
    /// The entry's file as the new kernel sees it (after its try was counted).
    pub entry: String,
}

/// The pieces of a UKI kexec needs.
pub struct Uki {
    pub linux: Vec<u8>,
    pub initrd: Vec<u8>,
    pub cmdline: String,
}

/// Reads the kernel, initramfs and command line out of a UKI's sections.
pub fn uki_parts(data: &[u8]) -> anyhow::Result<Uki> {
    use object::read::pe::PeFile64;
    use object::{Object, ObjectSection};
    let pe = PeFile64::parse(data).context("not a PE image")?;
    let section = |name: &str| -> anyhow::Result<Vec<u8>> {
        let s = pe.section_by_name(name).with_context(|| format!("no {name} section"))?;
        Ok(s.data().with_context(|| format!("reading its {name} section"))?.to_vec())
    };
    let cmdline = String::from_utf8(section(".cmdline")?).context("its .cmdline is not text")?;
    Ok(Uki { linux: section(".linux")?, initrd: section(".initrd")?, cmdline })
}

/// The command line the new kernel gets: the UKI's, and the entry it was started from.
pub fn command_line(uki_cmdline: &str, entry_name: &str) -> String {
    format!("{} {}={entry_name}", uki_cmdline.trim_end_matches(['\0', '\n', ' ']), entry::KEXEC_ARG)
}

/// The entry a fast reboot starts: the one systemd-boot would. A one-shot entry that is not one
/// of nasos's (an operator's, say) only systemd-boot can start: the reboot goes through it.
pub fn target(entries: &[(String, entry::Entry)], oneshot: Option<&str>) -> anyhow::Result<String> {
    if let Some(id) = oneshot
        && !super::status::is_nasos_entry(entries, id)
    {
        bail!("the one-shot entry {id} is not one of nasos's boot entries; systemd-boot starts it");
    }
    super::status::boots_next(entries, oneshot).context("the ESP has no entry to boot")
}

/// Loads the next boot's kernel for a fast reboot, counting its try. Errors leave nothing loaded
/// and no entry renamed.
pub fn prepare() -> anyhow::Result<Loaded> {
    let (_disk, esp, oneshot) = super::status::boot_choice()?;
    let next = target(&esp.entries(), oneshot.as_deref())?;
    let version = entry::parse(&next).map(|e| e.version).unwrap_or_default();
    let counted = entry::after_a_try(&next);
    let started_as = counted.clone().unwrap_or_else(|| next.clone());
    let data = std::fs::read(esp.dir().join(&next)).with_context(|| format!("reading {next}"))?;
    let uki = uki_parts(&data).with_context(|| format!("{next} is not a UKI kexec can start"))?;
    load(&uki.linux, &uki.initrd, &command_line(&uki.cmdline, &started_as))?;
    // Loaded: now count the try, as systemd-boot would have; a failure here unloads again.
    let counted_ok = match &counted {
        Some(to) => std::fs::rename(esp.dir().join(&next), esp.dir().join(to))
            .with_context(|| format!("counting the try: renaming {next} to {to}"))
            .and_then(|()| esp.sync()),
        None => Ok(()),
    };
    if let Err(e) = counted_ok {
        let _ = unload();
        return Err(e);
    }
    if oneshot.is_some() {
        // systemd-boot deletes the one-shot variable as it boots the entry.
        let path = Path::new(entry::EFIVARS).join(format!("{}-{}", super::ONESHOT, entry::LOADER_VENDOR_GUID));
        let _ = crate::run("chattr", &["-i", &path.display().to_string()]);
        let _ = std::fs::remove_file(&path);
    }
    Ok(Loaded { version, entry: started_as })
}

/// kexec_file_load(2) with the kernel and initramfs in memory files. The syscall has no wrapper
/// in nix or rustix; it takes two file descriptors, a length and a NUL-terminated string.
fn load(linux: &[u8], initrd: &[u8], cmdline: &str) -> anyhow::Result<()> {
    let kernel = memory_file("nasos-kexec-linux", linux)?;
    let ramdisk = memory_file("nasos-kexec-initrd", initrd)?;
    let text = CString::new(cmdline).context("the command line has a NUL")?;
    let len = text.as_bytes_with_nul().len();
    // SAFETY: both descriptors are open for the call, `text` outlives it and `len` counts its NUL.
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_kexec_file_load,
            kernel.as_raw_fd(),
            ramdisk.as_raw_fd(),
            len,
            text.as_ptr(),
            0usize,
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        bail!("the kernel refused to load the next kernel with kexec_file_load: {e}{}", hint(&e));
    }
    Ok(())
}

fn hint(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(nix::libc::EPERM) => " (locked down: the next kernel's signature is not one this kernel trusts)",
        Some(nix::libc::EKEYREJECTED) | Some(nix::libc::EBADMSG) => " (the next kernel's signature was rejected)",
        // Seen under Secure Boot: Debian signs the kernel, and only the db's key is trusted here.
        Some(nix::libc::ENOKEY) => " (locked down: no key this kernel trusts signed the next kernel)",
        Some(nix::libc::ENOSYS) => " (this kernel has no kexec_file_load)",
        _ => "",
    }
}

/// Unloads whatever a fast reboot had loaded: the next reboot goes through the firmware.
pub fn unload() -> anyhow::Result<()> {
    nasos_exec::kexec::unload().context("unloading the kexec kernel")
}

fn memory_file(name: &str, data: &[u8]) -> anyhow::Result<OwnedFd> {
    use std::io::Write;
    let fd = nix::sys::memfd::memfd_create(
        CString::new(name).context("memfd name")?.as_c_str(),
        nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
    )
    .context("memfd_create")?;
    let mut f = std::fs::File::from(fd);
    f.write_all(data).with_context(|| format!("writing {name}"))?;
    Ok(f.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_new_kernel_gets_the_ukis_command_line_and_the_entry_it_was_started_from() {
        let verity = format!("nasos.verity={}:{}:4096:16777216", "ab".repeat(32), "cd".repeat(32));
        let c = command_line(&format!("console=ttyS0,115200 {verity}\0"), "nasos-0.2.0+2-1.efi");
        assert_eq!(c, format!("console=ttyS0,115200 {verity} nasos.kexec-entry=nasos-0.2.0+2-1.efi"));
        assert_eq!(entry::kexec_entry(&c).as_deref(), Some("nasos-0.2.0+2-1.efi"));
        // What the root is stays the UKI's: the verity argument is untouched.
        let root = nasos_layout::cmdline::RootArgs::parse(&c).expect("the verity argument");
        assert_eq!(root.verity.root_hash, "ab".repeat(32));
        assert_eq!(root.init, None);
    }

    #[test]
    fn the_target_is_systemd_boots_choice_and_an_entry_only_it_can_start_is_refused() {
        let entries: Vec<(String, entry::Entry)> = ["nasos-0.1.0.efi", "nasos-0.2.0+2.efi", "nasos-0.3.0+0-2.efi"]
            .iter()
            .map(|n| (n.to_string(), entry::parse(n).expect("an entry")))
            .collect();
        // The newest with tries left; 0.3.0 has none.
        assert_eq!(target(&entries, None).expect("a target"), "nasos-0.2.0+2.efi");
        // A downgrade's one-shot, by its id.
        assert_eq!(target(&entries, Some("nasos-0.1.0.efi")).expect("a target"), "nasos-0.1.0.efi");
        let e = target(&entries, Some("shell.conf")).expect_err("not nasos's");
        assert!(format!("{e}").contains("the one-shot entry shell.conf is not one of nasos's boot entries"), "{e}");
        assert!(target(&[], None).is_err());
    }

    #[test]
    fn a_file_that_is_not_a_uki_is_refused_with_the_reason() {
        assert!(uki_parts(b"MZ not really").is_err());
    }
}
