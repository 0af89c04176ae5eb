//! A parsed TOML document that remembers where everything is, so that findings about the typed
//! model (a path such as `pools[0].vdevs[1].bays[3]`) can be reported at a line and column.

use std::fmt;
use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::diag::{Diagnostic, Severity, SourceFile};

/// One step of a path into a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

/// A path into a document: `network.links[0].mtu`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Path(pub Vec<Seg>);

impl Path {
    pub fn root() -> Self {
        Path(Vec::new())
    }

    pub fn key(&self, key: &str) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Key(key.to_string()));
        p
    }

    pub fn index(&self, i: usize) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Index(i));
        p
    }

    /// The last key of the path, for messages ("`mtu` must be …").
    pub fn last_key(&self) -> Option<&str> {
        self.0.iter().rev().find_map(|s| match s {
            Seg::Key(k) => Some(k.as_str()),
            Seg::Index(_) => None,
        })
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return write!(f, "(top level)");
        }
        let mut first = true;
        for seg in &self.0 {
            match seg {
                Seg::Key(k) if first => write!(f, "{k}")?,
                Seg::Key(k) => write!(f, ".{k}")?,
                Seg::Index(i) => write!(f, "[{i}]")?,
            }
            first = false;
        }
        Ok(())
    }
}

/// A parsed document and its source.
pub struct Document<'a> {
    pub file: &'a SourceFile,
    pub root: Spanned<DeTable<'a>>,
}

impl<'a> Document<'a> {
    /// Parses the file; syntax errors come back as diagnostics (the parser recovers, so several at once).
    pub fn parse(file: &'a SourceFile) -> Result<Self, Vec<Diagnostic>> {
        let (root, errors) = DeTable::parse_recoverable(&file.text);
        if errors.is_empty() {
            return Ok(Document { file, root });
        }
        Err(errors
            .into_iter()
            .map(|e| {
                let span = e.span().unwrap_or(0..0);
                Diagnostic::new(
                    Severity::Error,
                    file,
                    span,
                    format!("TOML syntax error: {}", e.message().trim()),
                    Some("see https://toml.io for the syntax; strings need quotes, tables `[name]`".into()),
                )
            })
            .collect())
    }

    /// The span that best locates `path`: the value at the path, or the closest parent that exists
    /// (a missing key is reported where it should have been written).
    pub fn span_of(&self, path: &Path) -> Range<usize> {
        let mut span = self.root.span();
        let mut table: Option<&DeTable<'a>> = Some(self.root.get_ref());
        let mut array: Option<&[Spanned<DeValue<'a>>]> = None;
        for seg in &path.0 {
            let next: Option<&Spanned<DeValue<'a>>> = match seg {
                Seg::Key(k) => table.and_then(|t| t.get(k.as_str())),
                Seg::Index(i) => array.and_then(|a| a.get(*i)),
            };
            let Some(value) = next else { break };
            span = value.span();
            table = value.get_ref().as_table();
            array = value.get_ref().as_array().map(|a| &a[..]);
        }
        trim_header_span(&self.file.text, span)
    }

    /// The span of the key that ends `path` (for "unknown key" or "duplicate" at the key itself).
    pub fn key_span_of(&self, path: &Path) -> Range<usize> {
        let Some(Seg::Key(last)) = path.0.last() else { return self.span_of(path) };
        let parent = Path(path.0[..path.0.len() - 1].to_vec());
        let Some(table) = self.table_at(&parent) else { return self.span_of(path) };
        match table.get_key_value(last.as_str()) {
            Some((k, _)) => k.span(),
            None => self.span_of(path),
        }
    }

    fn table_at(&self, path: &Path) -> Option<&DeTable<'a>> {
        let mut table: &DeTable<'a> = self.root.get_ref();
        let mut value: Option<&Spanned<DeValue<'a>>> = None;
        for seg in &path.0 {
            let next = match seg {
                Seg::Key(k) => match value {
                    None => table.get(k.as_str()),
                    Some(v) => v.get_ref().as_table()?.get(k.as_str()),
                },
                Seg::Index(i) => value?.get_ref().as_array()?.get(*i),
            };
            value = Some(next?);
            if let Some(t) = value.and_then(|v| v.get_ref().as_table()) {
                table = t;
            }
        }
        match value {
            None => Some(table),
            Some(v) => v.get_ref().as_table(),
        }
    }

    pub fn diag(&self, severity: Severity, span: Range<usize>, msg: String, help: Option<String>) -> Diagnostic {
        Diagnostic::new(severity, self.file, span, msg, help)
    }
}

/// A table written as `[name]` or `[[name]]` spans its whole body; point at its header line only.
fn trim_header_span(text: &str, span: Range<usize>) -> Range<usize> {
    let Some(body) = text.get(span.clone()) else { return span };
    match body.find('\n') {
        Some(nl) if body.starts_with('[') => span.start..span.start + nl,
        _ => span,
    }
}
