//! The Debian archives an image's packages come from, and which of them a given .deb belongs to.
//!
//! An image takes trixie with its stable updates and its security fixes: the release alone would
//! ship every vulnerability fixed since. Which archive a package came from is read from apt's own
//! `Packages` indexes of the build, matched by the .deb's sha256, so the lock says exactly which
//! packages are security fixes (and a .deb no index lists is an error, not a guess).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, bail};

pub const SUITE: &str = "trixie";

/// The apt source lines of every image, in order of preference: the release, its updates, the
/// security archive.
pub const SOURCES: &[&str] = &[
    "deb http://deb.debian.org/debian trixie main contrib",
    "deb http://deb.debian.org/debian trixie-updates main contrib",
    "deb http://deb.debian.org/debian-security trixie-security main contrib",
];

/// The suite of an apt source line (`deb URI SUITE COMPONENTS…`).
pub fn suite_of(source: &str) -> Option<&str> {
    source.split_whitespace().nth(2)
}

/// The suite an apt list file belongs to, from its name
/// (`deb.debian.org_debian-security_dists_trixie-security_main_binary-amd64_Packages`).
pub fn suite_of_list(file_name: &str) -> Option<&str> {
    let rest = file_name.split_once("_dists_")?.1;
    rest.split('_').next().filter(|s| !s.is_empty())
}

/// Which suite lists each .deb, by the .deb's sha256. Where several list the same .deb, the one
/// earliest in `sources` wins (a fix folded into a point release counts as the release's).
#[derive(Debug, Default)]
pub struct Origins {
    by_sha: HashMap<String, (usize, String)>,
}

impl Origins {
    /// Adds one `Packages` index of `suite`.
    pub fn add_index(&mut self, suite: &str, text: &str, sources: &[&str]) {
        let rank = sources.iter().position(|s| suite_of(s) == Some(suite)).unwrap_or(usize::MAX);
        for stanza in text.split("\n\n") {
            let Some(sha) = stanza.lines().find_map(|l| l.strip_prefix("SHA256: ")) else { continue };
            let entry = self.by_sha.entry(sha.trim().to_string()).or_insert((rank, suite.to_string()));
            if rank < entry.0 {
                *entry = (rank, suite.to_string());
            }
        }
    }

    /// Reads every `*_Packages` file in `dir` (the build's copy of apt's lists).
    pub fn read_lists(dir: &Path, sources: &[&str]) -> anyhow::Result<Origins> {
        let mut o = Origins::default();
        let mut found = 0;
        for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.ends_with("_Packages") {
                continue;
            }
            let Some(suite) = suite_of_list(&name) else { continue };
            let text = std::fs::read_to_string(e.path())
                .with_context(|| format!("reading apt's index {}", e.path().display()))?;
            o.add_index(suite, &text, sources);
            found += 1;
        }
        if found == 0 {
            bail!("apt kept no package index in {}", dir.display());
        }
        Ok(o)
    }

    /// The suite that lists the .deb with this sha256.
    pub fn suite(&self, sha256: &str) -> Option<&str> {
        self.by_sha.get(sha256).map(|(_, s)| s.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_names_and_source_lines_give_their_suites() {
        assert_eq!(
            suite_of_list("deb.debian.org_debian-security_dists_trixie-security_main_binary-amd64_Packages"),
            Some("trixie-security")
        );
        assert_eq!(suite_of_list("deb.debian.org_debian_dists_trixie_contrib_binary-amd64_Packages"), Some("trixie"));
        assert_eq!(suite_of_list("lock"), None);
        let suites: Vec<_> = SOURCES.iter().filter_map(|s| suite_of(s)).collect();
        assert_eq!(suites, ["trixie", "trixie-updates", "trixie-security"]);
    }

    #[test]
    fn a_deb_belongs_to_the_earliest_source_that_lists_its_hash() {
        let stanza = |name: &str, v: &str, sha: &str| {
            format!("Package: {name}\nVersion: {v}\nArchitecture: amd64\nFilename: pool/x.deb\nSHA256: {sha}\n")
        };
        let mut o = Origins::default();
        let release = [stanza("libc6", "2.41-12", "aa"), stanza("curl", "8.14-1", "bb")].join("\n");
        let security = [stanza("curl", "8.14-1+deb13u1", "cc"), stanza("libc6", "2.41-12", "aa")].join("\n");
        // The security index read first: the order of reading does not decide.
        o.add_index("trixie-security", &security, SOURCES);
        o.add_index("trixie", &release, SOURCES);
        assert_eq!(o.suite("cc"), Some("trixie-security"));
        assert_eq!(o.suite("aa"), Some("trixie"), "in both: the release's");
        assert_eq!(o.suite("bb"), Some("trixie"));
        assert_eq!(o.suite("dd"), None);
    }
}
