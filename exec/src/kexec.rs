//! The kernel's kexec slot, shared by the fast-reboot loader (nasctl) and PID 1's last step.

/// Unloads whatever kernel is loaded for kexec (kexec_file_load with KEXEC_FILE_UNLOAD; the call
/// has no wrapper in nix or rustix).
pub fn unload() -> std::io::Result<()> {
    const KEXEC_FILE_UNLOAD: usize = 1;
    // SAFETY: with KEXEC_FILE_UNLOAD the descriptors and the command line are not read.
    let r = unsafe { nix::libc::syscall(nix::libc::SYS_kexec_file_load, -1, -1, 0usize, 0usize, KEXEC_FILE_UNLOAD) };
    if r != 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

/// Whether a kernel is loaded for kexec.
pub fn loaded() -> bool {
    std::fs::read_to_string("/sys/kernel/kexec_loaded").is_ok_and(|s| s.trim() == "1")
}
