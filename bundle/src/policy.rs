//! Whether a verified bundle may replace what runs: pure decisions over the manifest and the
//! running box, made before a byte is written.

use crate::manifest::{Kind, Manifest};

/// What the running box is and can hold.
#[derive(Debug, Clone)]
pub struct Running {
    pub image: String,
    pub version: String,
    pub board: String,
    /// The size of the inactive root slot, in bytes.
    pub slot_bytes: u64,
    /// Room for the UKI on the ESP, in bytes (free space plus what the entry it replaces frees).
    pub esp_free_bytes: u64,
    /// The operator asked for an older version (`--allow-downgrade`).
    pub allow_downgrade: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("the bundle is for board {bundle}, this box is a {running}")]
    Board { bundle: String, running: String },
    #[error("the bundle is image {bundle}, this box runs {running}")]
    Image { bundle: String, running: String },
    #[error(
        "the bundle's version {bundle} is older than the running {running}; add --allow-downgrade to install it anyway"
    )]
    Older { bundle: String, running: String },
    #[error("the bundle's version {0} is the version already running")]
    Same(String),
    #[error("the bundle {bundle} may only replace {min} or later, and this box runs {running}: upgrade to {min} first")]
    TooOld { bundle: String, min: String, running: String },
    #[error("the bundle's root needs {need} bytes but the inactive slot holds {have}")]
    SlotTooSmall { need: u64, have: u64 },
    #[error("the bundle's kernel image needs {need} bytes on the ESP but {have} are free")]
    EspTooSmall { need: u64, have: u64 },
}

fn version(v: &str) -> semver::Version {
    semver::Version::parse(v).unwrap_or_else(|_| semver::Version::new(0, 0, 0))
}

/// Checks a manifest (already verified and shape-checked) against the running box.
pub fn check(m: &Manifest, r: &Running) -> Result<(), Refusal> {
    if m.board != r.board {
        return Err(Refusal::Board { bundle: m.board.clone(), running: r.board.clone() });
    }
    if m.image != r.image {
        return Err(Refusal::Image { bundle: m.image.clone(), running: r.image.clone() });
    }
    let (new, now) = (version(&m.version), version(&r.version));
    if new == now {
        return Err(Refusal::Same(m.version.clone()));
    }
    if new < now && !r.allow_downgrade {
        return Err(Refusal::Older { bundle: m.version.clone(), running: r.version.clone() });
    }
    if now < version(&m.min_version) {
        return Err(Refusal::TooOld {
            bundle: m.version.clone(),
            min: m.min_version.clone(),
            running: r.version.clone(),
        });
    }
    if m.slot_bytes() > r.slot_bytes {
        return Err(Refusal::SlotTooSmall { need: m.slot_bytes(), have: r.slot_bytes });
    }
    let uki = m.payload(Kind::Uki).map_or(0, |p| p.size);
    if uki > r.esp_free_bytes {
        return Err(Refusal::EspTooSmall { need: uki, have: r.esp_free_bytes });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::tests::sample;

    fn running() -> Running {
        Running {
            image: "qemu-dev".into(),
            version: "0.1.0".into(),
            board: "qemu-q35".into(),
            slot_bytes: 1 << 20,
            esp_free_bytes: 1 << 20,
            allow_downgrade: false,
        }
    }

    #[test]
    fn board_version_and_room_are_checked() {
        let m = sample();
        assert_eq!(check(&m, &running()), Ok(()));
        let r = Running { board: "ts-h1290fx".into(), ..running() };
        assert!(matches!(check(&m, &r), Err(Refusal::Board { .. })));
        let r = Running { image: "other".into(), ..running() };
        assert!(matches!(check(&m, &r), Err(Refusal::Image { .. })));
        let r = Running { version: "0.2.0".into(), ..running() };
        assert_eq!(check(&m, &r), Err(Refusal::Same("0.2.0".into())));
        let r = Running { version: "0.3.0".into(), ..running() };
        assert!(matches!(check(&m, &r), Err(Refusal::Older { .. })));
        let r = Running { version: "0.3.0".into(), allow_downgrade: true, ..running() };
        assert_eq!(check(&m, &r), Ok(()));
        let r = Running { version: "0.0.9".into(), ..running() };
        assert!(matches!(check(&m, &r), Err(Refusal::TooOld { .. })));
        // Semantic, not textual, order: 0.10.0 is newer than 0.9.0.
        let mut m10 = sample();
        m10.version = "0.10.0".into();
        let r = Running { version: "0.9.0".into(), ..running() };
        assert_eq!(check(&m10, &r), Ok(()));
        let r = Running { slot_bytes: 20479, ..running() };
        assert_eq!(check(&m, &r), Err(Refusal::SlotTooSmall { need: 20480, have: 20479 }));
        let r = Running { esp_free_bytes: 9, ..running() };
        assert_eq!(check(&m, &r), Err(Refusal::EspTooSmall { need: 10, have: 9 }));
    }
}
