//! Diagnostics: what is wrong, where (file, line, column), and how to fix it.

use std::fmt;
use std::ops::Range;

use codespan_reporting::diagnostic::{Diagnostic as CsDiagnostic, Label};
use codespan_reporting::files::SimpleFiles;
use codespan_reporting::term;
use serde::Serialize;

/// A source file diagnostics point into.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// The name shown to the user (the path as given).
    pub name: String,
    pub text: String,
}

impl SourceFile {
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> Self {
        SourceFile { name: name.into(), text: text.into() }
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        // Clamp to a char boundary so a span from a recovering parser never splits a character.
        let offset = (0..=offset).rev().find(|&o| self.text.is_char_boundary(o)).unwrap_or(0);
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = before[line_start..].chars().count() + 1;
        (line, col)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// One finding about one place in one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    /// The file's name as shown to the user.
    pub file: String,
    pub line: usize,
    pub column: usize,
    #[serde(skip)]
    pub span: Range<usize>,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn new(
        severity: Severity,
        file: &SourceFile,
        span: Range<usize>,
        message: impl Into<String>,
        help: Option<String>,
    ) -> Self {
        let (line, column) = file.line_col(span.start);
        Diagnostic { severity, file: file.name.clone(), line, column, span, message: message.into(), help }
    }

    /// `file:line:col`, the form editors and terminals jump to.
    pub fn location(&self) -> String {
        format!("{}:{}:{}", self.file, self.line, self.column)
    }
}

impl fmt::Display for Diagnostic {
    /// The one-line form: `file:line:col: error: message (help: …)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{}: {sev}: {}", self.location(), self.message)?;
        if let Some(help) = &self.help {
            write!(f, " (help: {help})")?;
        }
        Ok(())
    }
}

/// Diagnostics together with the files they point into, so they can be rendered with context.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub files: Vec<SourceFile>,
    pub diagnostics: Vec<Diagnostic>,
}

impl Report {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(|d| d.severity == Severity::Error)
    }

    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics.iter().filter(|d| d.severity == Severity::Error)
    }

    pub fn add_file(&mut self, file: &SourceFile) {
        if !self.files.iter().any(|f| f.name == file.name) {
            self.files.push(file.clone());
        }
    }

    /// Orders diagnostics by file, then position, and drops exact repeats.
    pub fn sort(&mut self) {
        let order: Vec<String> = self.files.iter().map(|f| f.name.clone()).collect();
        let rank = |name: &str| order.iter().position(|n| n == name).unwrap_or(usize::MAX);
        self.diagnostics
            .sort_by(|a, b| (rank(&a.file), a.span.start, &a.message).cmp(&(rank(&b.file), b.span.start, &b.message)));
        self.diagnostics.dedup();
    }

    /// Renders every diagnostic with the source line it points at, as rustc does.
    pub fn render(&self) -> String {
        let mut files = SimpleFiles::new();
        let ids: Vec<(String, usize)> =
            self.files.iter().map(|f| (f.name.clone(), files.add(f.name.clone(), f.text.clone()))).collect();
        let config = term::Config::default();
        let mut out = String::new();
        for d in &self.diagnostics {
            let Some(&(_, id)) = ids.iter().find(|(n, _)| *n == d.file) else {
                out.push_str(&format!("{d}\n"));
                continue;
            };
            let cs = match d.severity {
                Severity::Error => CsDiagnostic::error(),
                Severity::Warning => CsDiagnostic::warning(),
            };
            let span = d.span.clone();
            let mut cs = cs.with_message(&d.message).with_labels(vec![Label::primary(id, span)]);
            if let Some(help) = &d.help {
                cs = cs.with_notes(vec![format!("help: {help}")]);
            }
            match term::emit_into_string(&config, &files, &cs) {
                Ok(text) => out.push_str(&text),
                // A span the renderer cannot place still gets the one-line form.
                Err(_) => out.push_str(&format!("{d}\n")),
            }
        }
        let errors = self.errors().count();
        let warnings = self.diagnostics.len() - errors;
        if errors + warnings > 0 {
            out.push_str(&format!("{errors} error{}, {warnings} warning{}\n", plural(errors), plural(warnings)));
        }
        out
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// "did you mean" for a misspelt word among the ones that exist.
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let lower = word.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(&lower, &c.to_ascii_lowercase()), c))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_are_one_based_and_count_characters() {
        let f = SourceFile::new("x.toml", "a = 1\nbé = 2\n");
        assert_eq!(f.line_col(0), (1, 1));
        assert_eq!(f.line_col(6), (2, 1));
        // 'é' is two bytes but one column.
        assert_eq!(f.line_col(9), (2, 3));
        // Offsets past the end clamp instead of panicking.
        assert_eq!(f.line_col(1000), (3, 1));
    }

    #[test]
    fn suggestions_only_for_close_words() {
        assert_eq!(did_you_mean("mtuu", ["mtu", "name", "port"]), Some("mtu"));
        assert_eq!(did_you_mean("lossles_priority", ["lossless_priority", "ecn"]), Some("lossless_priority"));
        assert_eq!(did_you_mean("zzz", ["mtu", "name"]), None);
    }
}
