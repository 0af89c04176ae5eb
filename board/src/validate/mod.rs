//! Semantic validation: everything the schema cannot say (names that must exist on the board,
//! widths a vdev type allows, CIDRs, cross references). Runs on the typed model; every finding is
//! located through the document it came from. `sections` checks a recipe section by section,
//! `board` checks board files, `names` holds the name and format predicates.

mod board;
mod names;
mod sections;

pub use board::board;
use names::*;
use sections::*;

use std::collections::{BTreeMap, HashMap};

use ipnet::IpNet;

use crate::board::{Board, DeviceMatch, Port};
use crate::diag::{Diagnostic, Severity, did_you_mean};
use crate::recipe::{Recipe, RootLogin, within};
use crate::source::{Document, Path};
use crate::units::{parse_duration, parse_size};

pub(crate) struct Checker<'d, 'a> {
    pub(crate) doc: &'d Document<'a>,
    pub(crate) out: Vec<Diagnostic>,
}

impl Checker<'_, '_> {
    pub(crate) fn error(&mut self, path: &Path, msg: impl Into<String>, help: impl Into<Option<String>>) {
        let span = self.doc.span_of(path);
        self.out.push(self.doc.diag(Severity::Error, span, msg.into(), help.into()));
    }

    pub(crate) fn warn(&mut self, path: &Path, msg: impl Into<String>, help: impl Into<Option<String>>) {
        let span = self.doc.span_of(path);
        self.out.push(self.doc.diag(Severity::Warning, span, msg.into(), help.into()));
    }

    /// Reports the second and later uses of a name. `what` says what the name is ("link name").
    pub(crate) fn unique<S: AsRef<str>>(&mut self, what: &str, items: impl IntoIterator<Item = (S, Path)>) {
        let mut seen: HashMap<String, Path> = HashMap::new();
        for (name, path) in items {
            let name = name.as_ref();
            if let Some(first) = seen.get(name) {
                let (line, _) = self.doc.file.line_col(self.doc.span_of(first).start);
                self.error(
                    &path,
                    format!("duplicate {what} `{name}`"),
                    format!("it is already used on line {line}; each {what} must be unique"),
                );
            } else {
                seen.insert(name.to_string(), path);
            }
        }
    }

    /// Reports a reference to a name that does not exist, with the closest existing name.
    pub(crate) fn unknown(&mut self, path: &Path, what: &str, name: &str, known: &[&str], whence: &str) {
        let help = match did_you_mean(name, known.iter().copied()) {
            Some(m) => format!("did you mean `{m}`?"),
            None if known.is_empty() => format!("{whence} defines none"),
            None => format!("{whence} defines: {}", known.join(", ")),
        };
        self.error(path, format!("unknown {what} `{name}`"), help);
    }

    /// The 1-based line a path was written on, to name the other side of a conflict.
    pub(crate) fn line_of(&self, path: &Path) -> usize {
        self.doc.file.line_col(self.doc.span_of(path).start).0
    }

    pub(crate) fn name(&mut self, path: &Path, what: &str, name: &str, ok: fn(&str) -> bool, rule: &str) {
        if !ok(name) {
            self.error(path, format!("invalid {what} `{name}`"), rule.to_string());
        }
    }
}

/// Validates a recipe against its board.
pub fn recipe(doc: &Document<'_>, r: &Recipe, board: &Board) -> Vec<Diagnostic> {
    let mut c = Checker { doc, out: Vec::new() };
    let root = Path::root();
    image(&mut c, r);
    packages(&mut c, &root.key("packages").key("extra"), &r.packages.extra);
    for (i, m) in r.kernel.modules.iter().enumerate() {
        c.name(
            &root.key("kernel").key("modules").index(i),
            "module name",
            m,
            is_module,
            "module names are letters, digits, `_` and `-`",
        );
    }
    console(&mut c, r);
    let ports = links(&mut c, r, board);
    fabric(&mut c, r, &ports);
    zfs(&mut c, r);
    pools(&mut c, r, board);
    datasets(&mut c, r);
    tenants(&mut c, r);
    snapshots(&mut c, r);
    replication(&mut c, r);
    nfs(&mut c, r);
    kerberos(&mut c, r);
    liveness(&mut c, r);
    health(&mut c, r);
    upgrade(&mut c, r);
    c.out
}

/// Checks the replication key files a recipe names (each peer's public key, the development
/// identity) and returns their text for the plan.
pub fn replication_keys(
    doc: &Document<'_>,
    r: &Recipe,
    peers: &[crate::KeyFile],
    identity: Option<&crate::KeyFile>,
) -> ((Vec<String>, Option<String>), Vec<Diagnostic>) {
    let mut c = Checker { doc, out: Vec::new() };
    let keys = sections::replication_keys(&mut c, r, peers, identity);
    (keys, c.out)
}

/// Checks the Secure Boot db certificate a recipe names (read beside it).
pub fn secure_boot(doc: &Document<'_>, r: &Recipe, file: Option<&crate::KeyFile>) -> Vec<Diagnostic> {
    let mut c = Checker { doc, out: Vec::new() };
    sections::secure_boot(&mut c, r, file);
    c.out
}

/// Checks the trusted upgrade keys a recipe names (their files, read beside it) and returns
/// them for the plan.
pub fn trusted_keys(
    doc: &Document<'_>,
    r: &Recipe,
    files: &[crate::KeyFile],
) -> (Vec<crate::plan::TrustedKeyPlan>, Vec<Diagnostic>) {
    let mut c = Checker { doc, out: Vec::new() };
    let keys = sections::trusted_keys(&mut c, r, files);
    (keys, c.out)
}
