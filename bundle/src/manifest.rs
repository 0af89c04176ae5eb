//! What a bundle says it holds. The manifest is the signed part: everything the appliance
//! decides before writing a byte comes from here.

use serde::{Deserialize, Serialize};

/// One payload, in the order it follows the manifest in the bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Payload {
    pub kind: Kind,
    /// Bytes.
    pub size: u64,
    /// Lower-case hex.
    pub sha256: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// The unified kernel image, put on the ESP.
    Uki,
    /// The root filesystem, written at the start of the inactive slot.
    Root,
    /// Its dm-verity hash tree, written right after it.
    Verity,
}

impl Kind {
    /// Every kind, in the order a bundle carries them.
    pub const ORDER: [Kind; 3] = [Kind::Uki, Kind::Root, Kind::Verity];

    /// Its tar entry name.
    pub fn entry(self) -> &'static str {
        match self {
            Kind::Uki => "uki.efi",
            Kind::Root => "root.erofs",
            Kind::Verity => "root.verity",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Uki => "uki",
            Kind::Root => "root",
            Kind::Verity => "verity",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The bundle format ([`crate::FORMAT`]).
    pub format: u32,
    /// The image name (the recipe's `[image] name`).
    pub image: String,
    /// Its version, `MAJOR.MINOR.PATCH`.
    pub version: String,
    /// The board it was built for.
    pub board: String,
    /// The oldest running version this bundle may replace.
    pub min_version: String,
    /// The verity parameters of the root, as the UKI's `nasos.verity=` carries them
    /// (`ROOTHASH:SALT:DATABLOCKS:HASHOFFSET`); the slot's partition UUID follows from the hash.
    pub verity: String,
    /// The payloads, in bundle order.
    pub payloads: Vec<Payload>,
}

/// A manifest that is not one this crate can apply.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("the manifest is not valid JSON of the bundle format: {0}")]
    Json(String),
    #[error("bundle format {0} is not understood here (this build reads format {f})", f = crate::FORMAT)]
    Format(u32),
    #[error("the manifest's {field} `{value}` is not a MAJOR.MINOR.PATCH version")]
    Version { field: &'static str, value: String },
    #[error("the manifest lists payloads {found}, but a bundle carries exactly uki, root, verity in that order")]
    Payloads { found: String },
    #[error("the {kind} payload's sha256 `{value}` is not 64 lower-case hex digits")]
    Digest { kind: &'static str, value: String },
    #[error("the manifest's verity parameters `{0}` are not ROOTHASH:SALT:DATABLOCKS:HASHOFFSET")]
    Verity(String),
    #[error("the root payload is {root} bytes but the verity tree starts at {offset}: they must meet")]
    Offset { root: u64, offset: u64 },
}

impl Manifest {
    /// Parses and checks a manifest's shape (what any bundle must be, before any policy).
    pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let m: Manifest = serde_json::from_slice(bytes).map_err(|e| ManifestError::Json(e.to_string()))?;
        m.check()?;
        Ok(m)
    }

    pub fn to_json(&self) -> Vec<u8> {
        // A manifest of strings and numbers always serialises.
        let mut v = serde_json::to_vec_pretty(self).unwrap_or_default();
        v.push(b'\n');
        v
    }

    pub fn check(&self) -> Result<(), ManifestError> {
        if self.format != crate::FORMAT {
            return Err(ManifestError::Format(self.format));
        }
        for (field, value) in [("version", &self.version), ("min_version", &self.min_version)] {
            semver::Version::parse(value).map_err(|_| ManifestError::Version { field, value: value.clone() })?;
        }
        let kinds: Vec<Kind> = self.payloads.iter().map(|p| p.kind).collect();
        if kinds != Kind::ORDER {
            let found = kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ");
            return Err(ManifestError::Payloads { found: if found.is_empty() { "none".into() } else { found } });
        }
        for p in &self.payloads {
            if p.sha256.len() != 64 || !p.sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                return Err(ManifestError::Digest { kind: p.kind.as_str(), value: p.sha256.clone() });
            }
        }
        let offset = self.hash_offset()?;
        let root = self.payload(Kind::Root).map_or(0, |p| p.size);
        if root != offset {
            return Err(ManifestError::Offset { root, offset });
        }
        Ok(())
    }

    pub fn payload(&self, kind: Kind) -> Option<&Payload> {
        self.payloads.iter().find(|p| p.kind == kind)
    }

    /// The verity root hash (the first field of [`Manifest::verity`]).
    pub fn root_hash(&self) -> &str {
        self.verity.split(':').next().unwrap_or_default()
    }

    /// The verity parameters, through the one parser of `nasos.verity=` values.
    pub fn verity(&self) -> Result<nasos_layout::cmdline::Verity, ManifestError> {
        nasos_layout::cmdline::Verity::parse_value(&self.verity).map_err(|_| ManifestError::Verity(self.verity.clone()))
    }

    /// Where the verity tree starts in the slot, in bytes.
    pub fn hash_offset(&self) -> Result<u64, ManifestError> {
        Ok(self.verity()?.hash_offset)
    }

    /// Bytes the root slot must hold: the filesystem and its hash tree.
    pub fn slot_bytes(&self) -> u64 {
        self.payloads.iter().filter(|p| p.kind != Kind::Uki).map(|p| p.size).sum()
    }

    pub fn semver(&self) -> semver::Version {
        semver::Version::parse(&self.version).unwrap_or_else(|_| semver::Version::new(0, 0, 0))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> Manifest {
        Manifest {
            format: 1,
            image: "qemu-dev".into(),
            version: "0.2.0".into(),
            board: "qemu-q35".into(),
            min_version: "0.1.0".into(),
            verity: format!("{}:{}:4:16384", "ab".repeat(32), "cd".repeat(32)),
            payloads: vec![
                Payload { kind: Kind::Uki, size: 10, sha256: "0".repeat(64) },
                Payload { kind: Kind::Root, size: 16384, sha256: "1".repeat(64) },
                Payload { kind: Kind::Verity, size: 4096, sha256: "2".repeat(64) },
            ],
        }
    }

    #[test]
    fn a_manifest_round_trips_and_is_checked() {
        let m = sample();
        assert_eq!(Manifest::parse(&m.to_json()), Ok(m.clone()));
        assert_eq!(m.root_hash(), "ab".repeat(32));
        assert_eq!(m.slot_bytes(), 16384 + 4096);

        let mut bad = m.clone();
        bad.format = 2;
        assert_eq!(bad.check(), Err(ManifestError::Format(2)));
        let mut bad = m.clone();
        bad.version = "2".into();
        assert!(matches!(bad.check(), Err(ManifestError::Version { field: "version", .. })));
        let mut bad = m.clone();
        bad.payloads.swap(1, 2);
        assert_eq!(bad.check(), Err(ManifestError::Payloads { found: "uki, verity, root".into() }));
        let mut bad = m.clone();
        bad.payloads[1].sha256 = "A".repeat(64);
        assert!(matches!(bad.check(), Err(ManifestError::Digest { kind: "root", .. })));
        let mut bad = m.clone();
        bad.payloads[1].size = 100;
        assert_eq!(bad.check(), Err(ManifestError::Offset { root: 100, offset: 16384 }));
        let mut bad = m;
        bad.verity = "x:y".into();
        assert!(matches!(bad.check(), Err(ManifestError::Verity(_))));
        assert!(matches!(Manifest::parse(b"{\"format\":1}"), Err(ManifestError::Json(_))));
    }
}
