//! nasos-board: the typed model of boards and recipes, their validation, and the plan.
//!
//! Loading a recipe goes through four gates, each reporting every finding it can at once:
//! TOML syntax → structure against the JSON Schema (unknown keys, types, ranges) → serde into the
//! typed model → semantic validation against the board. Only a recipe that passes all four becomes
//! a [`Plan`].

pub mod board;
pub mod diag;
pub mod plan;
pub mod recipe;
pub mod schema;
pub mod source;
pub mod units;
pub mod validate;

use std::path::Path as FsPath;

use serde::de::DeserializeOwned;

pub use board::Board;
pub use diag::{Diagnostic, Report, Severity, SourceFile};
pub use plan::Plan;
pub use recipe::Recipe;

use source::{Document, Path};

/// The boards nasos knows, built in so the tool is one self-contained binary.
/// To add a board: write `board/boards/NAME.toml` and add it here.
pub const BOARDS: &[(&str, &str)] = &[
    ("ts-h1290fx", include_str!("../boards/ts-h1290fx.toml")),
    ("ts-h1290fx-cx6", include_str!("../boards/ts-h1290fx-cx6.toml")),
    ("qemu-q35", include_str!("../boards/qemu-q35.toml")),
];

/// A recipe that passed validation, with its board and any warnings.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub recipe: Recipe,
    pub board: Board,
    /// The trusted upgrade keys, read from the files the recipe names.
    pub keys: Vec<plan::TrustedKeyPlan>,
    /// The peers' public keys (in `[[peers]]` order) and the development identity, read beside
    /// the recipe.
    pub replication_keys: (Vec<String>, Option<String>),
    /// Warnings only (a report with errors is returned as `Err`).
    pub report: Report,
}

impl Loaded {
    pub fn plan(&self) -> Plan {
        let mut p = plan::resolve(&self.recipe, &self.board);
        p.upgrade.trusted_keys = self.keys.clone();
        for (peer, key) in p.replication.peers.iter_mut().zip(&self.replication_keys.0) {
            peer.key = key.clone();
        }
        p.replication.identity = self.replication_keys.1.clone();
        p
    }
}

/// A key file named by `[upgrade] trusted_keys`, as read beside the recipe.
#[derive(Debug, Clone)]
pub struct KeyFile {
    /// As the recipe names it.
    pub name: String,
    /// Its text, or why it could not be read.
    pub text: Result<String, String>,
    /// Whether a secret key (`NAME.key` for `NAME.pub`) lies beside it.
    pub secret_beside: bool,
}

/// Reads the key files a recipe names, relative to the recipe's directory.
fn read_keys(recipe_file: &str, names: &[String]) -> Vec<KeyFile> {
    let dir = FsPath::new(recipe_file).parent().unwrap_or(FsPath::new("."));
    names
        .iter()
        .map(|name| {
            let p = dir.join(name);
            KeyFile {
                name: name.clone(),
                text: std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display())),
                secret_beside: p.with_extension("key").exists(),
            }
        })
        .collect()
}

/// Reads and validates a recipe file and its board.
pub fn load_recipe_file(path: &FsPath) -> Result<Loaded, Report> {
    let name = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => load_recipe(&SourceFile::new(name, text)),
        Err(e) => {
            let file = SourceFile::new(name, String::new());
            let help = "check the path; recipes live in recipes/, e.g. recipes/qemu-dev.toml".to_string();
            let d = Diagnostic::new(Severity::Error, &file, 0..0, format!("cannot read recipe: {e}"), Some(help));
            Err(Report { files: vec![], diagnostics: vec![d] })
        }
    }
}

/// Validates a recipe given as text. Never panics, whatever the text.
pub fn load_recipe(file: &SourceFile) -> Result<Loaded, Report> {
    let mut report = Report::default();
    report.add_file(file);
    let finish = |mut report: Report| {
        report.sort();
        report
    };
    let (recipe, doc) = match parse_typed::<Recipe>(file, &schema::recipe_schema()) {
        Ok(v) => v,
        Err(diags) => {
            report.diagnostics = diags;
            return Err(finish(report));
        }
    };
    let board = match find_board(&recipe.image.board) {
        Some((board_file, text)) => {
            let board_file = SourceFile::new(board_file, text);
            match load_board(&board_file) {
                Ok((board, warnings)) => {
                    report.diagnostics.extend(warnings);
                    board
                }
                Err(diags) => {
                    report.add_file(&board_file);
                    report.diagnostics.extend(diags);
                    return Err(finish(report));
                }
            }
        }
        None => {
            let names: Vec<&str> = BOARDS.iter().map(|(n, _)| *n).collect();
            let help = match diag::did_you_mean(&recipe.image.board, names.iter().copied()) {
                Some(m) => format!("did you mean `{m}`?"),
                None => format!("known boards: {}", names.join(", ")),
            };
            let span = doc.span_of(&Path::root().key("image").key("board"));
            let msg = format!("unknown board `{}`", recipe.image.board);
            report.diagnostics.push(doc.diag(Severity::Error, span, msg, Some(help)));
            return Err(finish(report));
        }
    };
    let key_files = read_keys(&file.name, &recipe.upgrade.trusted_keys);
    let db_file = read_keys(&file.name, &recipe.secure_boot.iter().map(|s| s.db.clone()).collect::<Vec<_>>());
    report.diagnostics.extend(validate::secure_boot(&doc, &recipe, db_file.first()));
    report.diagnostics.extend(validate::recipe(&doc, &recipe, &board));
    let (keys, diags) = validate::trusted_keys(&doc, &recipe, &key_files);
    report.diagnostics.extend(diags);
    let peer_files = read_keys(&file.name, &recipe.peers.iter().map(|p| p.key.clone()).collect::<Vec<_>>());
    let identity_file = read_keys(&file.name, &recipe.replication.identity.iter().cloned().collect::<Vec<_>>());
    let (replication_keys, diags) = validate::replication_keys(&doc, &recipe, &peer_files, identity_file.first());
    report.diagnostics.extend(diags);
    let report = finish(report);
    if report.has_errors() { Err(report) } else { Ok(Loaded { recipe, board, keys, replication_keys, report }) }
}

/// The text of a built-in board, with the file name diagnostics should show.
pub fn find_board(name: &str) -> Option<(String, String)> {
    BOARDS.iter().find(|(n, _)| *n == name).map(|(n, text)| (format!("board/boards/{n}.toml"), text.to_string()))
}

/// Validates a board file; returns the board and its warnings, or every error.
pub fn load_board(file: &SourceFile) -> Result<(Board, Vec<Diagnostic>), Vec<Diagnostic>> {
    let (board, doc) = parse_typed::<Board>(file, &schema::board_schema())?;
    let diags = validate::board(&doc, &board);
    if diags.iter().any(|d| d.severity == Severity::Error) { Err(diags) } else { Ok((board, diags)) }
}

/// Syntax, then structure, then serde. Each stage reports all it finds; later stages run only on
/// input the earlier ones accepted, so serde's single error is a backstop, not the usual path.
fn parse_typed<'a, T: DeserializeOwned>(
    file: &'a SourceFile,
    schema: &serde_json::Value,
) -> Result<(T, Document<'a>), Vec<Diagnostic>> {
    let doc = Document::parse(file)?;
    let structural = schema::check(&doc, schema);
    if !structural.is_empty() {
        return Err(structural);
    }
    match toml::from_str::<T>(&file.text) {
        Ok(v) => Ok((v, doc)),
        Err(e) => {
            let span = e.span().unwrap_or(0..0);
            Err(vec![doc.diag(Severity::Error, span, e.message().trim().to_string(), None)])
        }
    }
}
