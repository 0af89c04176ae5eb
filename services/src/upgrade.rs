//! What the upgrade agent reads of the boot loader: systemd-boot's EFI variables, through a
//! directory (`/sys/firmware/efi/efivars` on the box, a fixture in tests).

use std::path::Path;

use anyhow::Context;
use nasos_layout::entry;

/// Reads a systemd-boot variable (`LoaderBootCountPath`, `LoaderDevicePartUUID`): 4 attribute
/// bytes, then UTF-16LE text ending in NUL.
pub fn loader_var(efivars: &Path, name: &str) -> anyhow::Result<String> {
    let p = efivars.join(format!("{name}-{}", entry::LOADER_VENDOR_GUID));
    let raw = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
    let words: Vec<u16> = raw
        .get(4..)
        .unwrap_or(&[])
        .chunks(2)
        .filter(|c| c.len() == 2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    Ok(String::from_utf16_lossy(&words).trim_end_matches('\0').to_string())
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
        std::fs::write(dir.join(format!("LoaderBootCountPath-{}", entry::LOADER_VENDOR_GUID)), raw).expect("fixture");
        let got = loader_var(&dir, "LoaderBootCountPath").expect("reads");
        assert_eq!(got, text);
        assert_eq!(entry::blessed_name(got.rsplit('\\').next().unwrap_or("")).as_deref(), Some("nasos-0.1.0.efi"));
        assert!(loader_var(&dir, "LoaderDevicePartUUID").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
