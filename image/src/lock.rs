//! The lock file next to a recipe (`RECIPE.lock`): every Debian package of the image with its
//! version, the sha256 of its .deb and the archive it came from (trixie, trixie-updates or
//! trixie-security). Written on the first build, honoured afterwards: a build whose packages
//! differ from the lock stops and says which, rather than quietly changing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lock {
    /// The apt source lines the packages came from.
    pub sources: Vec<String>,
    /// Seconds since the epoch, used as SOURCE_DATE_EPOCH: the same lock gives the same image.
    pub epoch: u64,
    #[serde(rename = "package")]
    pub packages: Vec<LockedPackage>,
    /// The ZFS module's build root (compiler, kernel headers, zfs-dkms and the rest of Debian's
    /// buildd set): not in the image, but what made the module in it. Empty for an image
    /// without pools, and in locks written before it was kept.
    #[serde(rename = "build_package", default, skip_serializing_if = "Vec::is_empty")]
    pub build_packages: Vec<LockedPackage>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LockedPackage {
    pub name: String,
    pub version: String,
    pub architecture: String,
    pub sha256: String,
    /// The suite whose index lists this very .deb (by its sha256): `trixie-security` for a
    /// security fix. The first of the sources in their order when several list it.
    pub suite: String,
}

impl LockedPackage {
    /// The file name apt gives the .deb in its archive cache (`:` of an epoch is `%3a`).
    pub fn deb_name(&self) -> String {
        format!("{}_{}_{}.deb", self.name, self.version.replace(':', "%3a"), self.architecture)
    }
}

pub fn path_for(recipe: &Path) -> PathBuf {
    let mut p = recipe.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

impl Lock {
    pub fn read(path: &Path) -> anyhow::Result<Option<Lock>> {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let lock: Lock = toml::from_str(&text).with_context(|| {
                    format!(
                        "{} is not a lock file this nasos reads (an older nasos wrote one source and no suites); \
                         run `nasos build RECIPE --update-lock` and commit the new lock",
                        path.display()
                    )
                })?;
                Ok(Some(lock))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    pub fn to_toml(&self) -> anyhow::Result<String> {
        let mut sorted = self.clone();
        sorted.packages.sort();
        sorted.build_packages.sort();
        let body = toml::to_string(&sorted).context("serializing the lock")?;
        Ok(format!("# Written by `nasos build`; refresh with `nasos build --update-lock`. Do not edit.\n{body}"))
    }

    pub fn version_of(&self, name: &str) -> Option<&str> {
        self.packages.iter().find(|p| p.name == name).map(|p| p.version.as_str())
    }

    /// The image's part of the lock: what its root filesystem is made of (the build root's
    /// packages do not change the image's packages).
    pub fn image_part(&self) -> Lock {
        Lock { build_packages: Vec::new(), ..self.clone() }
    }

    /// Compares what a build resolved with the lock; an error lists every difference.
    pub fn check(&self, resolved: &Lock) -> anyhow::Result<()> {
        let diffs = differences(&self.packages, &resolved.packages);
        if !diffs.is_empty() {
            bail!(
                "the packages resolved now differ from the lock file:\n{}\nrun `nasos build --update-lock` to accept them (and commit the new lock)",
                diffs.join("\n")
            );
        }
        Ok(())
    }

    /// Compares the ZFS build root a build resolved with the lock's; an error lists every
    /// difference.
    pub fn check_build(&self, resolved: &[LockedPackage]) -> anyhow::Result<()> {
        let diffs = differences(&self.build_packages, resolved);
        if !diffs.is_empty() {
            bail!(
                "the ZFS module's build root resolved now differs from the lock file:\n{}\nrun `nasos build --update-lock` to accept it (and commit the new lock)",
                diffs.join("\n")
            );
        }
        Ok(())
    }
}

/// Every difference between a locked package set and a resolved one, a line each.
fn differences(locked: &[LockedPackage], resolved: &[LockedPackage]) -> Vec<String> {
    let want: BTreeMap<&str, &LockedPackage> = locked.iter().map(|p| (p.name.as_str(), p)).collect();
    let got: BTreeMap<&str, &LockedPackage> = resolved.iter().map(|p| (p.name.as_str(), p)).collect();
    let mut diffs = Vec::new();
    for (name, w) in &want {
        match got.get(name) {
            None => diffs.push(format!("  {name}: locked {} but no longer installed", w.version)),
            Some(g) if g.version != w.version => {
                diffs.push(format!("  {name}: locked {}, the mirror now has {}", w.version, g.version))
            }
            Some(g) if g.sha256 != w.sha256 => diffs.push(format!(
                "  {name} {}: the .deb's sha256 differs from the lock ({} ≠ {})",
                w.version, g.sha256, w.sha256
            )),
            Some(_) => {}
        }
    }
    for (name, g) in &got {
        if !want.contains_key(name) {
            diffs.push(format!("  {name}: {} is installed but not in the lock", g.version));
        }
    }
    diffs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkg(name: &str, version: &str, sha: &str) -> LockedPackage {
        LockedPackage {
            name: name.into(),
            version: version.into(),
            architecture: "amd64".into(),
            sha256: sha.into(),
            suite: "trixie".into(),
        }
    }

    #[test]
    fn round_trips_and_names_debs_as_apt_does() {
        let lock = Lock {
            sources: vec!["deb x trixie main".into()],
            epoch: 1,
            packages: vec![pkg("b", "1:2.0-1", "bb"), pkg("a", "1.0", "aa")],
            build_packages: vec![pkg("gcc-14", "14.2.0-19", "cc"), pkg("cpp-14", "14.2.0-19", "dd")],
        };
        let text = lock.to_toml().expect("toml");
        assert!(text.starts_with("# Written by `nasos build`"));
        let back: Lock = toml::from_str(&text).expect("parse");
        assert_eq!(back.packages[0].name, "a", "sorted");
        assert_eq!(back.packages[1].deb_name(), "b_1%3a2.0-1_amd64.deb");
        assert_eq!(back.build_packages[0].name, "cpp-14", "sorted");
        assert!(text.find("[[package]]") < text.find("[[build_package]]"), "{text}");
        // The image's part is the lock an image-only build writes, byte for byte; a lock from
        // before build roots were kept reads, with none.
        let image = lock.image_part().to_toml().expect("toml");
        assert!(!image.contains("build_package"), "{image}");
        let old: Lock = toml::from_str(&image).expect("an image-only lock parses");
        assert!(old.build_packages.is_empty());
        assert_eq!(old.packages, back.packages);
    }

    #[test]
    fn check_names_every_difference() {
        let lock = Lock {
            sources: vec!["s".into()],
            epoch: 1,
            packages: vec![pkg("a", "1", "x"), pkg("b", "1", "y"), pkg("c", "1", "z")],
            build_packages: vec![pkg("gcc-14", "14.2.0-19", "g")],
        };
        let now = Lock {
            sources: vec!["s".into()],
            epoch: 1,
            packages: vec![pkg("a", "2", "x"), pkg("b", "1", "q"), pkg("d", "1", "w")],
            build_packages: Vec::new(),
        };
        let e = lock.check(&now).expect_err("differs").to_string();
        for want in [
            "a: locked 1, the mirror now has 2",
            "b 1: the .deb's sha256 differs",
            "c: locked 1 but no longer installed",
            "d: 1 is installed but not in the lock",
            "--update-lock",
        ] {
            assert!(e.contains(want), "missing `{want}` in {e}");
        }
        assert!(lock.check(&lock.clone()).is_ok());
        // The image's packages alone decide `check`; the build root is checked on its own.
        assert!(lock.check(&lock.image_part()).is_ok());
        let e = lock.check_build(&[pkg("gcc-14", "14.2.0-20", "h")]).expect_err("differs").to_string();
        assert!(
            e.contains("ZFS module's build root")
                && e.contains("gcc-14: locked 14.2.0-19, the mirror now has 14.2.0-20"),
            "{e}"
        );
        assert!(lock.check_build(&lock.build_packages).is_ok());
    }
}
