//! Boot entries on the ESP, as systemd-boot counts tries: `EFI/Linux/nasos-VERSION+LEFT[-DONE].efi`
//! while the entry is on trial, `nasos-VERSION.efi` once the appliance has blessed it. systemd-boot
//! renames the file before each try and boots the newest entry that has tries left.

/// Where UKIs live on the ESP (systemd-boot's Type #2 entries).
pub const DIR: &str = "EFI/Linux";
/// Name prefix of nasos's entries.
pub const PREFIX: &str = "nasos-";
/// systemd-boot's vendor GUID for its EFI variables (LoaderBootCountPath, LoaderDevicePartUUID).
pub const LOADER_VENDOR_GUID: &str = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f";

/// Where the kernel shows the firmware's variables.
pub const EFIVARS: &str = "/sys/firmware/efi/efivars";

/// Reads a systemd-boot variable (`LoaderBootCountPath`, `LoaderDevicePartUUID`) from an efivarfs
/// directory: 4 attribute bytes, then UTF-16LE text ending in NUL. `None` when it is not there.
pub fn loader_var(efivars: &std::path::Path, name: &str) -> Option<String> {
    let raw = std::fs::read(efivars.join(format!("{name}-{LOADER_VENDOR_GUID}"))).ok()?;
    let words: Vec<u16> =
        raw.get(4..)?.chunks(2).filter(|c| c.len() == 2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
    Some(String::from_utf16_lossy(&words).trim_end_matches('\0').to_string())
}

/// Sets a systemd-boot variable (`LoaderEntryOneShot`) in an efivarfs directory: attributes
/// non-volatile, boot-service and runtime access, then the UTF-16LE text ending in NUL, in one
/// write (efivarfs takes a variable whole). An existing variable is replaced: efivarfs marks
/// variables immutable, so `clear_immutable` runs on it first (the caller's `chattr -i`).
pub fn set_loader_var(
    efivars: &std::path::Path,
    name: &str,
    value: &str,
    clear_immutable: impl FnOnce(&std::path::Path),
) -> std::io::Result<()> {
    let path = efivars.join(format!("{name}-{LOADER_VENDOR_GUID}"));
    if path.exists() {
        clear_immutable(&path);
        std::fs::remove_file(&path)?;
    }
    let mut raw = 7u32.to_le_bytes().to_vec();
    for u in value.encode_utf16().chain([0]) {
        raw.extend(u.to_le_bytes());
    }
    use std::io::Write;
    std::fs::OpenOptions::new().write(true).create_new(true).open(&path)?.write_all(&raw)
}

/// The id systemd-boot (257) gives an entry: its file name without the try counter, which is
/// what `LoaderEntryOneShot` and `LoaderEntryDefault` name.
pub fn id(name: &str) -> Option<String> {
    let e = parse(name)?;
    Some(format!("{PREFIX}{}.efi", e.version))
}

/// The kernel command line argument naming the entry a fast reboot (kexec) started, already
/// counted as systemd-boot counts a try: the firmware's variables still describe the boot before.
pub const KEXEC_ARG: &str = "nasos.kexec-entry";

/// The entry file that was started, when it carries a try counter: the one a fast reboot names
/// on the command line (`cmdline`, the running kernel's), else the one systemd-boot publishes in
/// `LoaderBootCountPath` (only for an entry on trial, after decrementing it).
pub fn booted_on_trial(efivars: &std::path::Path, cmdline: &str) -> Option<String> {
    if let Some(name) = kexec_entry(cmdline) {
        return parse(&name).and_then(|e| e.counter).map(|_| name);
    }
    let path = loader_var(efivars, "LoaderBootCountPath")?;
    Some(path.rsplit('\\').next().unwrap_or(&path).to_string())
}

/// The entry a command line says a fast reboot started.
pub fn kexec_entry(cmdline: &str) -> Option<String> {
    let prefix = format!("{KEXEC_ARG}=");
    cmdline.split_whitespace().find_map(|a| a.strip_prefix(&prefix)).map(str::to_string)
}

/// The name systemd-boot gives an entry as it starts it: one try fewer left, one more done
/// (`nasos-1.2.0+3.efi` → `nasos-1.2.0+2-1.efi`). `None` when nothing is counted: a blessed
/// entry, or one with no tries left (started only when asked for by name).
pub fn after_a_try(name: &str) -> Option<String> {
    let e = parse(name)?;
    let (left, done) = e.counter?;
    (left > 0).then(|| format!("{PREFIX}{}+{}-{}.efi", e.version, left - 1, done + 1))
}

/// A parsed entry name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub version: String,
    /// Tries left and tries done, while on trial; `None` once blessed.
    pub counter: Option<(u32, u32)>,
}

/// The file name of a new entry with `tries` tries (`nasos-1.2.0+3.efi`).
pub fn counted(version: &str, tries: u32) -> String {
    format!("{PREFIX}{version}+{tries}.efi")
}

/// Its path on the ESP.
pub fn counted_path(version: &str, tries: u32) -> String {
    format!("{DIR}/{}", counted(version, tries))
}

/// The path of a blessed entry (`EFI/Linux/nasos-1.2.0.efi`): the factory image's, which has no
/// earlier version to fall back to.
pub fn blessed_path(version: &str) -> String {
    format!("{DIR}/{PREFIX}{version}.efi")
}

/// Parses an entry's file name; `None` for a file that is not a nasos entry.
pub fn parse(name: &str) -> Option<Entry> {
    let stem = name.strip_prefix(PREFIX)?.strip_suffix(".efi")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if let Some((version, counter)) = stem.rsplit_once('+') {
        let (left, done) = counter.split_once('-').unwrap_or((counter, "0"));
        if !version.is_empty() && digits(left) && digits(done) {
            return Some(Entry {
                version: version.to_string(),
                counter: Some((left.parse().ok()?, done.parse().ok()?)),
            });
        }
        return None;
    }
    (!stem.is_empty()).then(|| Entry { version: stem.to_string(), counter: None })
}

/// The blessed name of an entry on trial, or `None` if it carries no counter (already blessed,
/// or not ours).
pub fn blessed_name(name: &str) -> Option<String> {
    let e = parse(name)?;
    e.counter.map(|_| format!("{PREFIX}{}.efi", e.version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_booted_entry_as_systemd_boot_writes_it() {
        let dir = std::env::temp_dir().join(format!("nasos-efivars-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("fixture");
        let text = "\\EFI\\Linux\\nasos-0.1.0+2-1.efi";
        let mut raw = vec![7, 0, 0, 0];
        for u in text.encode_utf16().chain([0]) {
            raw.extend(u.to_le_bytes());
        }
        std::fs::write(dir.join(format!("LoaderBootCountPath-{LOADER_VENDOR_GUID}")), raw).expect("fixture");
        assert_eq!(loader_var(&dir, "LoaderBootCountPath").as_deref(), Some(text));
        assert_eq!(booted_on_trial(&dir, "ro quiet").as_deref(), Some("nasos-0.1.0+2-1.efi"));
        // After a fast reboot the variable still names the boot before: the command line wins.
        let kexec = "quiet nasos.kexec-entry=nasos-0.2.0+1-2.efi";
        assert_eq!(booted_on_trial(&dir, kexec).as_deref(), Some("nasos-0.2.0+1-2.efi"));
        assert_eq!(booted_on_trial(&dir, "nasos.kexec-entry=nasos-0.2.0.efi"), None, "blessed: not on trial");
        assert_eq!(loader_var(&dir, "LoaderDevicePartUUID"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_variable_written_reads_back_and_replaces_the_old_one() {
        let dir = std::env::temp_dir().join(format!("nasos-efivars-set-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("fixture");
        let mut cleared = Vec::new();
        set_loader_var(&dir, "LoaderEntryOneShot", "nasos-0.2.0.efi", |p| cleared.push(p.to_path_buf()))
            .expect("write");
        assert!(cleared.is_empty(), "nothing to clear the first time");
        assert_eq!(loader_var(&dir, "LoaderEntryOneShot").as_deref(), Some("nasos-0.2.0.efi"));
        let raw = std::fs::read(dir.join(format!("LoaderEntryOneShot-{LOADER_VENDOR_GUID}"))).expect("raw");
        assert_eq!(&raw[..6], &[7, 0, 0, 0, b'n', 0], "attributes, then UTF-16LE");
        assert_eq!(&raw[raw.len() - 2..], &[0, 0], "NUL-terminated");
        set_loader_var(&dir, "LoaderEntryOneShot", "nasos-0.1.0.efi", |p| cleared.push(p.to_path_buf()))
            .expect("replace");
        assert_eq!(cleared.len(), 1);
        assert_eq!(loader_var(&dir, "LoaderEntryOneShot").as_deref(), Some("nasos-0.1.0.efi"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_try_is_counted_as_systemd_boot_counts_it() {
        assert_eq!(after_a_try("nasos-0.2.0+3.efi").as_deref(), Some("nasos-0.2.0+2-1.efi"));
        assert_eq!(after_a_try("nasos-0.2.0+2-1.efi").as_deref(), Some("nasos-0.2.0+1-2.efi"));
        assert_eq!(after_a_try("nasos-0.2.0+0-3.efi"), None, "no tries left: nothing to count");
        assert_eq!(after_a_try("nasos-0.2.0.efi"), None, "blessed");
        assert_eq!(after_a_try("grub.efi"), None);
        assert_eq!(kexec_entry("a nasos.kexec-entry=nasos-1.0+1-1.efi b").as_deref(), Some("nasos-1.0+1-1.efi"));
        assert_eq!(kexec_entry("nasos.kexec-entryx=1"), None);
    }

    #[test]
    fn an_entry_id_has_no_counter() {
        assert_eq!(id("nasos-0.2.0+1.efi").as_deref(), Some("nasos-0.2.0.efi"));
        assert_eq!(id("nasos-0.2.0+0-1.efi").as_deref(), Some("nasos-0.2.0.efi"));
        assert_eq!(id("nasos-0.2.0.efi").as_deref(), Some("nasos-0.2.0.efi"));
        assert_eq!(id("grub.efi"), None);
    }

    #[test]
    fn counters_come_off() {
        assert_eq!(blessed_name("nasos-0.1.0+3.efi").as_deref(), Some("nasos-0.1.0.efi"));
        assert_eq!(blessed_name("nasos-0.1.0+2-1.efi").as_deref(), Some("nasos-0.1.0.efi"));
        assert_eq!(blessed_name("nasos-0.1.0.efi"), None);
        assert_eq!(blessed_name("nasos-0.1.0+x.efi"), None);
        assert_eq!(blessed_name("other-0.1.0+3.efi"), None);
    }

    #[test]
    fn what_is_written_parses_back() {
        for (v, n) in [("0.1.0", 3), ("1.2.0-rc1", 1), ("2026.12.1", 10)] {
            let name = counted(v, n);
            assert_eq!(parse(&name), Some(Entry { version: v.into(), counter: Some((n, 0)) }));
            assert_eq!(counted_path(v, n), format!("EFI/Linux/{name}"));
            assert_eq!(Some(blessed_path(v)), blessed_name(&name).map(|b| format!("EFI/Linux/{b}")));
            assert_eq!(
                parse(&blessed_name(&name).expect("on trial")),
                Some(Entry { version: v.into(), counter: None })
            );
        }
        assert_eq!(parse("nasos-1.0+0-3.efi").and_then(|e| e.counter), Some((0, 3)));
    }
}
