//! The upgrade agent. bless: marks the running boot entry good once the appliance is ready, by
//! removing systemd-boot's try counter from its name (`nasos-1.2.0+2-1.efi` → `nasos-1.2.0.efi`).
//! An entry that is never blessed runs out of tries and the previous one boots again. What it
//! reads of the boot loader (systemd-boot's EFI variables) goes through a directory, so tests use
//! a fixture.

use std::path::Path;

use anyhow::Context;
use nasos_layout::{entry, slot};

use crate::{run, say};

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

const EFIVARS: &str = "/sys/firmware/efi/efivars";
const ESP_MOUNT: &str = "/run/nasos/esp";

pub fn bless() -> anyhow::Result<()> {
    if !Path::new(EFIVARS).join(".").exists()
        || std::fs::read_dir(EFIVARS).map(|mut d| d.next().is_none()).unwrap_or(true)
    {
        let _ = std::fs::create_dir_all(EFIVARS);
        let _ =
            nix::mount::mount(Some("efivarfs"), EFIVARS, Some("efivarfs"), nix::mount::MsFlags::empty(), None::<&str>);
    }
    // systemd-boot publishes the counted file it booted (after decrementing) here, as
    // systemd-bless-boot reads it; no variable means the entry carries no counter.
    let Ok(path) = loader_var(Path::new(EFIVARS), "LoaderBootCountPath") else {
        say("the booted entry has no try counter: already blessed");
        return Ok(());
    };
    let booted = path.rsplit('\\').next().unwrap_or(&path).to_string();
    let Some(good) = entry::blessed_name(&booted) else {
        say(format!("{booted} is already blessed"));
        return Ok(());
    };
    let esp_uuid = loader_var(Path::new(EFIVARS), "LoaderDevicePartUUID")?.to_ascii_lowercase();
    let esp = slot::find_partition(Path::new("/sys"), Path::new("/dev"), &esp_uuid)
        .with_context(|| format!("no partition with PARTUUID {esp_uuid} (the ESP systemd-boot started from)"))?;
    std::fs::create_dir_all(ESP_MOUNT)?;
    let _ = run("modprobe", &["vfat"]);
    run("mount", &["-t", "vfat", &esp.display().to_string(), ESP_MOUNT])?;
    let dir = Path::new(ESP_MOUNT).join(entry::DIR);
    let r = std::fs::rename(dir.join(&booted), dir.join(&good)).with_context(|| format!("renaming {booted} to {good}"));
    nix::unistd::sync();
    let _ = run("umount", &[ESP_MOUNT]);
    r?;
    say(format!("blessed {booted} → {good}"));
    Ok(())
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
