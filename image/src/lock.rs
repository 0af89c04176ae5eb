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
        let body = toml::to_string(&sorted).context("serializing the lock")?;
        Ok(format!("# Written by `nasos build`; refresh with `nasos build --update-lock`. Do not edit.\n{body}"))
    }

    pub fn version_of(&self, name: &str) -> Option<&str> {
        self.packages.iter().find(|p| p.name == name).map(|p| p.version.as_str())
    }

    /// Compares what a build resolved with the lock; an error lists every difference.
    pub fn check(&self, resolved: &Lock) -> anyhow::Result<()> {
        let want: BTreeMap<&str, &LockedPackage> = self.packages.iter().map(|p| (p.name.as_str(), p)).collect();
        let got: BTreeMap<&str, &LockedPackage> = resolved.packages.iter().map(|p| (p.name.as_str(), p)).collect();
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
        if !diffs.is_empty() {
            bail!(
                "the packages resolved now differ from the lock file:\n{}\nrun `nasos build --update-lock` to accept them (and commit the new lock)",
                diffs.join("\n")
            );
        }
        Ok(())
    }
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
        };
        let text = lock.to_toml().expect("toml");
        assert!(text.starts_with("# Written by `nasos build`"));
        let back: Lock = toml::from_str(&text).expect("parse");
        assert_eq!(back.packages[0].name, "a", "sorted");
        assert_eq!(back.packages[1].deb_name(), "b_1%3a2.0-1_amd64.deb");
    }

    #[test]
    fn check_names_every_difference() {
        let lock = Lock {
            sources: vec!["s".into()],
            epoch: 1,
            packages: vec![pkg("a", "1", "x"), pkg("b", "1", "y"), pkg("c", "1", "z")],
        };
        let now = Lock {
            sources: vec!["s".into()],
            epoch: 1,
            packages: vec![pkg("a", "2", "x"), pkg("b", "1", "q"), pkg("d", "1", "w")],
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
    }
}
