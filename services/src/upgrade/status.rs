//! `nasctl upgrade status`: both slots, the version each holds (from the ESP entry whose UKI
//! names the slot's partition UUID), which one runs, tries left, and the history.

use std::path::Path;

use anyhow::Context;
use nasos_layout::cmdline::RootArgs;
use nasos_layout::entry;
use nasos_layout::state::State;
use serde::Serialize;

use super::esp::Esp;
use super::history::{self, Event};
use super::slots::{self, BootDisk};

#[derive(Debug, Clone, Serialize)]
pub struct SlotView {
    pub slot: String,
    pub device: String,
    pub partuuid: String,
    pub running: bool,
    /// The version whose entry names this slot, if any.
    pub version: Option<String>,
    pub entry: Option<String>,
    /// Blessed, on trial, or out of tries.
    pub state: String,
    pub tries_left: Option<u32>,
    pub tries_used: Option<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StatusView {
    pub running_version: String,
    pub slots: Vec<SlotView>,
    /// The entry systemd-boot starts next: the one-shot entry (a downgrade's first boot), else
    /// the newest version with tries left.
    pub boots_next: Option<String>,
    pub history: Vec<Event>,
}

/// The `nasos.verity=` root hash a UKI's `.cmdline` carries.
pub fn uki_root_hash(path: &Path) -> anyhow::Result<String> {
    use object::read::pe::PeFile64;
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let pe = PeFile64::parse(&*data).with_context(|| format!("{} is not a PE image", path.display()))?;
    let cmdline = object::Object::section_by_name(&pe, ".cmdline")
        .and_then(|s| object::ObjectSection::data(&s).ok())
        .with_context(|| format!("{} has no .cmdline", path.display()))?;
    let text = String::from_utf8_lossy(cmdline);
    Ok(RootArgs::parse(text.trim_end_matches('\0'))
        .with_context(|| format!("{}: its command line names no verified root", path.display()))?
        .verity
        .root_hash)
}

/// What systemd-boot starts next among these entries: the entry `LoaderEntryOneShot` names (by
/// its id, the name without a counter), else the newest version with tries left (an entry
/// without a counter always has).
pub fn boots_next(entries: &[(String, entry::Entry)], oneshot: Option<&str>) -> Option<String> {
    if let Some(hit) = oneshot.and_then(|id| entries.iter().find(|(n, _)| entry::id(n).as_deref() == Some(id))) {
        return Some(hit.0.clone());
    }
    entries
        .iter()
        .filter(|(_, e)| e.counter.is_none_or(|(left, _)| left > 0))
        .max_by(|a, b| version_order(&a.1.version, &b.1.version))
        .map(|(n, _)| n.clone())
}

/// Whether `id` (a one-shot entry's, without a counter) names one of nasos's entries.
pub fn is_nasos_entry(entries: &[(String, entry::Entry)], id: &str) -> bool {
    entries.iter().any(|(n, _)| entry::id(n).as_deref() == Some(id))
}

/// [`boots_next`] as `nasctl upgrade status` says it: a one-shot entry that is not one of
/// nasos's (the firmware's setup, an operator's entry) is what systemd-boot starts if it has
/// it, so it is named first, with what boots otherwise.
pub fn next_described(entries: &[(String, entry::Entry)], oneshot: Option<&str>) -> Option<String> {
    let next = boots_next(entries, oneshot);
    match oneshot {
        Some(id) if !is_nasos_entry(entries, id) => Some(format!(
            "{id} (a one-shot entry that is not nasos's; if systemd-boot has none by that name: {})",
            next.as_deref().unwrap_or("nothing")
        )),
        _ => next,
    }
}

/// Versions in semver order (text order for what is not semver).
pub fn version_order(a: &str, b: &str) -> std::cmp::Ordering {
    match (semver::Version::parse(a), semver::Version::parse(b)) {
        (Ok(x), Ok(y)) => x.cmp(&y),
        _ => a.cmp(b),
    }
}

pub fn view(disk: &BootDisk, esp: &Esp, running_version: &str, st: &State, oneshot: Option<&str>) -> StatusView {
    let entries = esp.entries();
    let named: Vec<(String, entry::Entry, Option<String>)> =
        entries.iter().map(|(n, e)| (n.clone(), e.clone(), uki_root_hash(&esp.dir().join(n)).ok())).collect();
    let slots = disk
        .slots
        .iter()
        .map(|s| {
            let hit = named.iter().find(|(_, _, h)| {
                h.as_deref().and_then(nasos_layout::slot::root_partuuid).as_deref() == Some(&s.partuuid)
            });
            let (state, left, used) = match hit.map(|h| h.1.counter) {
                None => ("no entry".to_string(), None, None),
                Some(None) => ("blessed".to_string(), None, None),
                Some(Some((0, used))) => (format!("out of tries ({used} used): failed"), Some(0), Some(used)),
                Some(Some((left, used))) => {
                    (format!("on trial: {left} tries left, {used} used"), Some(left), Some(used))
                }
            };
            SlotView {
                slot: s.name.to_string(),
                device: s.device.display().to_string(),
                partuuid: s.partuuid.clone(),
                running: s.running,
                version: hit.map(|h| h.1.version.clone()),
                entry: hit.map(|h| h.0.clone()),
                state,
                tries_left: left,
                tries_used: used,
            }
        })
        .collect();
    StatusView {
        running_version: running_version.to_string(),
        slots,
        boots_next: next_described(&entries, oneshot),
        history: history::read(st),
    }
}

/// Reads the running box's status (mounts the ESP for the time it takes).
pub fn read() -> anyhow::Result<StatusView> {
    let plan = crate::plan()?;
    let (disk, esp, oneshot) = boot_choice()?;
    Ok(view(&disk, &esp, &plan.image.version, &State::mounted(), oneshot.as_deref()))
}

/// What decides the next boot: the boot disk, its ESP (mounted while held) and the one-shot
/// entry, if the firmware has one set.
pub fn boot_choice() -> anyhow::Result<(BootDisk, Esp, Option<String>)> {
    let disk = slots::discover(Path::new("/sys"), Path::new("/dev")).map_err(anyhow::Error::msg)?;
    let esp = Esp::mount(&disk.esp)?;
    let oneshot = super::efivars()
        .ok()
        .and_then(|()| entry::loader_var(Path::new(entry::EFIVARS), super::ONESHOT))
        .filter(|v| !v.is_empty());
    Ok((disk, esp, oneshot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_version_with_tries_left_boots_next() {
        let e = |n: &str| (n.to_string(), entry::parse(n).expect("entry"));
        assert_eq!(
            boots_next(&[e("nasos-0.1.0.efi"), e("nasos-0.2.0+3.efi")], None).as_deref(),
            Some("nasos-0.2.0+3.efi")
        );
        assert_eq!(
            boots_next(&[e("nasos-0.1.0.efi"), e("nasos-0.2.0+0-3.efi")], None).as_deref(),
            Some("nasos-0.1.0.efi")
        );
        assert_eq!(
            boots_next(&[e("nasos-0.9.0.efi"), e("nasos-0.10.0+1-2.efi")], None).as_deref(),
            Some("nasos-0.10.0+1-2.efi")
        );
        assert_eq!(boots_next(&[], None), None);
        // A downgrade's first boot: the one-shot variable names the older entry by its id.
        let both = [e("nasos-0.3.0.efi"), e("nasos-0.2.0+1.efi")];
        assert_eq!(boots_next(&both, Some("nasos-0.2.0.efi")).as_deref(), Some("nasos-0.2.0+1.efi"));
        assert_eq!(boots_next(&both, Some("nasos-9.9.9.efi")).as_deref(), Some("nasos-0.3.0.efi"));
    }

    #[test]
    fn a_one_shot_entry_that_is_not_nasos_is_named_first() {
        let e = |n: &str| (n.to_string(), entry::parse(n).expect("entry"));
        let both = [e("nasos-0.3.0.efi"), e("nasos-0.2.0+1.efi")];
        assert_eq!(next_described(&both, None).as_deref(), Some("nasos-0.3.0.efi"));
        assert_eq!(next_described(&both, Some("nasos-0.2.0.efi")).as_deref(), Some("nasos-0.2.0+1.efi"));
        assert_eq!(
            next_described(&both, Some("auto-reboot-to-firmware-setup")).as_deref(),
            Some(
                "auto-reboot-to-firmware-setup (a one-shot entry that is not nasos's; if systemd-boot has \
                 none by that name: nasos-0.3.0.efi)"
            )
        );
        assert!(!is_nasos_entry(&both, "auto-reboot-to-firmware-setup"));
        assert!(is_nasos_entry(&both, "nasos-0.2.0.efi"));
    }
}
