//! The upgrade agent. `apply` installs a signed bundle on the inactive slot (`nasctl upgrade
//! apply`); `status` reads both slots and the history; `bless` marks the running boot entry good
//! once the appliance has been ready and healthy for the recipe's time ([`trial`]), by removing systemd-boot's try counter from its name
//! (`nasos-1.2.0+2-1.efi` → `nasos-1.2.0.efi`), and records in the history a version that used
//! up its tries and was rolled back. An entry that is never blessed runs out of tries and the
//! previous one boots again. What it reads of the boot loader (systemd-boot's EFI variables)
//! goes through a directory, so tests use a fixture.

pub mod apply;
pub mod esp;
pub mod history;
pub mod kexec;
pub mod slots;
pub mod source;
pub mod status;
pub mod trial;

use std::path::Path;

use anyhow::Context;
use nasos_layout::entry;
use nasos_layout::paths;
use nasos_layout::state::State;

use crate::say;
use esp::Esp;
use history::Event;

use entry::EFIVARS;

/// systemd-boot's variable naming the entry to boot once, next time (deleted as it boots it).
pub const ONESHOT: &str = "LoaderEntryOneShot";

/// Mounts efivarfs when it is not (its module is loaded first: the kernel may not autoload it).
pub fn efivars() -> anyhow::Result<()> {
    let empty = |p: &str| std::fs::read_dir(p).map(|mut d| d.next().is_none()).unwrap_or(true);
    if empty(EFIVARS) {
        let _ = crate::run("modprobe", &["efivarfs"]);
        let _ = std::fs::create_dir_all(EFIVARS);
        nix::mount::mount(Some("efivarfs"), EFIVARS, Some("efivarfs"), nix::mount::MsFlags::empty(), None::<&str>)
            .with_context(|| format!("mounting efivarfs on {EFIVARS}"))?;
    }
    if empty(EFIVARS) {
        anyhow::bail!(
            "{EFIVARS} is empty: the firmware's variables cannot be read, so the boot entry cannot be judged"
        );
    }
    Ok(())
}

/// The entries systemd-boot would boot before `running` (its file `booted`) once it is blessed:
/// newer versions that are blessed or have tries left. An entry out of tries sorts last anyway.
pub fn preferred_over(entries: &[(String, entry::Entry)], booted: &str, running: &str) -> Vec<String> {
    entries
        .iter()
        .filter(|(n, e)| {
            n != booted
                && e.counter.is_none_or(|(left, _)| left > 0)
                && status::version_order(&e.version, running) == std::cmp::Ordering::Greater
        })
        .map(|(n, _)| n.clone())
        .collect()
}

pub fn bless() -> anyhow::Result<()> {
    efivars()?;
    let plan = crate::plan()?;
    let st = State::mounted();
    let disk = slots::discover(Path::new("/sys"), Path::new("/dev")).map_err(anyhow::Error::msg)?;
    let esp = Esp::mount(&disk.esp)?;
    let slot = disk.running().map_or("", |s| s.name);
    let event = |what: &str, version: &str, detail: String| Event {
        at: history::now(),
        event: what.into(),
        version: version.into(),
        from: plan.image.version.clone(),
        slot: slot.into(),
        detail,
    };
    // A version installed after this one that is now out of tries was rolled back: say so once.
    let hist = history::read(&st);
    for (name, e) in esp.entries() {
        if e.version != plan.image.version
            && matches!(e.counter, Some((0, _)))
            && hist.iter().rev().find(|h| h.version == e.version).is_some_and(|h| h.event == "installed")
        {
            let used = e.counter.map_or(0, |c| c.1);
            let why = format!(
                "{} used up its {used} boot tries without becoming ready ({name}); {} booted again",
                e.version, plan.image.version
            );
            say(format!("rolled back: {why}"));
            let _ = history::record(&st, &event("rolled-back", &e.version, why));
        }
    }
    // systemd-boot publishes the counted file it booted (after decrementing) here, as
    // systemd-bless-boot reads it; no variable means the entry carries no counter.
    let Some(booted) =
        entry::booted_on_trial(Path::new(EFIVARS), &std::fs::read_to_string("/proc/cmdline").unwrap_or_default())
    else {
        say("the booted entry has no try counter: already blessed");
        return Ok(());
    };
    let Some(good) = entry::blessed_name(&booted) else {
        say(format!("{booted} is already blessed"));
        return Ok(());
    };
    // The ESP is not held while the trial runs: status and apply mount it meanwhile.
    drop(esp);
    let after = u64::from(plan.upgrade.bless_after_seconds);
    say(format!("{booted} is on trial: blessed once the box has been ready and healthy for {after}s in a row"));
    let mut t = trial::Trial::new(after, u64::from(plan.health.check_interval_seconds));
    let healthy_for = loop {
        match t.observe(crate::unix_now(), &nasos_api::HealthVerdict::read(Path::new(paths::HEALTH_VERDICT))) {
            trial::Step::Bless { healthy_for } => break healthy_for,
            trial::Step::Wait => {}
            trial::Step::Unhealthy(why) => say(format!("{booted} is not blessed yet: {why}")),
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
    };
    let esp = Esp::mount(&disk.esp)?;
    // A downgrade (installed older than the version it replaced) booted once through the one-shot
    // variable; blessed, it must keep booting, but systemd-boot prefers the newest good entry. So
    // the newer entries systemd-boot would pick first go, before the rename: a power cut between
    // the two leaves this entry the only one, still on trial, and the next boot blesses it.
    let newer = preferred_over(&esp.entries(), &booted, &plan.image.version);
    for n in &newer {
        say(format!("removing {n}: {} was installed as a downgrade and is to keep booting", plan.image.version));
        std::fs::remove_file(esp.dir().join(n)).with_context(|| format!("removing {n}"))?;
    }
    if !newer.is_empty() {
        esp.sync()?;
    }
    std::fs::rename(esp.dir().join(&booted), esp.dir().join(&good))
        .with_context(|| format!("renaming {booted} to {good}"))?;
    esp.sync()?;
    let mut detail = format!("{booted} → {good} after {healthy_for}s ready and healthy");
    if !newer.is_empty() {
        detail.push_str(&format!("; a downgrade: the newer {} removed", newer.join(", ")));
    }
    let _ = history::record(&st, &event("blessed", &plan.image.version, detail.clone()));
    say(format!("blessed {detail}"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blessed_downgrade_removes_only_the_newer_entries_that_would_boot_first() {
        let e = |n: &str| (n.to_string(), entry::parse(n).expect("entry"));
        let esp = [e("nasos-0.3.0.efi"), e("nasos-0.2.0+0-1.efi"), e("nasos-0.4.0+0-2.efi"), e("nasos-0.1.0.efi")];
        assert_eq!(preferred_over(&esp, "nasos-0.2.0+0-1.efi", "0.2.0"), ["nasos-0.3.0.efi"]);
        // An upgrade on trial: the older entry is the fallback and stays.
        let esp = [e("nasos-0.2.0.efi"), e("nasos-0.3.0+1-1.efi")];
        assert!(preferred_over(&esp, "nasos-0.3.0+1-1.efi", "0.3.0").is_empty());
        // A newer version still on trial would boot first too.
        let esp = [e("nasos-0.10.0+2.efi"), e("nasos-0.9.0+0-1.efi")];
        assert_eq!(preferred_over(&esp, "nasos-0.9.0+0-1.efi", "0.9.0"), ["nasos-0.10.0+2.efi"]);
    }
}
