//! nasos-upgrade bless: marks the running boot entry good once the appliance is ready, by
//! removing systemd-boot's try counter from its name (`nasos-1.2.0+2-1.efi` → `nasos-1.2.0.efi`).
//! An entry that is never blessed runs out of tries and the previous one boots again.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use nasos_layout::{entry, slot};
use nasos_services::upgrade::loader_var;
use nasos_services::{run, say};

const EFIVARS: &str = "/sys/firmware/efi/efivars";
const ESP_MOUNT: &str = "/run/nasos/esp";

fn main() -> ExitCode {
    nasos_services::main("upgrade", &["bless"], |_| bless())
}

fn bless() -> anyhow::Result<()> {
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
