//! JSON Schemas of recipes and boards, generated from the types, and the structural check that
//! walks a TOML document against them. The schema is the single source of truth for which keys
//! exist, their types and their ranges: editors get it from `nasos schema`, and validation reports
//! every structural mistake at once, each at its line and column, before serde ever sees the file.

use serde_json::{Map, Value};
use toml::Spanned;
use toml::de::DeValue;

use crate::board::Board;
use crate::diag::{Diagnostic, Severity, did_you_mean};
use crate::recipe::Recipe;
use crate::source::{Document, Path};

/// JSON Schema of recipe files.
pub fn recipe_schema() -> Value {
    schemars::schema_for!(Recipe).to_value()
}

/// JSON Schema of board files.
pub fn board_schema() -> Value {
    schemars::schema_for!(Board).to_value()
}

/// Checks a document against a schema; returns every structural mistake found.
pub fn check(doc: &Document<'_>, schema: &Value) -> Vec<Diagnostic> {
    let defs = schema.get("$defs").and_then(Value::as_object).cloned().unwrap_or_default();
    let mut walker = Walker { doc, defs: &defs, out: Vec::new() };
    let root = doc.root.span();
    walker.table(doc.root.get_ref(), root, schema, &Path::root());
    walker.out
}

struct Walker<'d, 'a> {
    doc: &'d Document<'a>,
    defs: &'d Map<String, Value>,
    out: Vec<Diagnostic>,
}

type Span = std::ops::Range<usize>;

impl<'d, 'a> Walker<'d, 'a> {
    fn error(&mut self, span: Span, msg: String, help: Option<String>) {
        self.out.push(self.doc.diag(Severity::Error, span, msg, help));
    }

    /// Follows `$ref`s and strips `null` alternatives (TOML has no null: an absent key is `None`).
    fn resolve<'s>(&self, schema: &'s Value) -> &'s Value
    where
        'd: 's,
    {
        let mut s = schema;
        for _ in 0..16 {
            if let Some(r) = s.get("$ref").and_then(Value::as_str) {
                let name = r.rsplit('/').next().unwrap_or(r);
                match self.defs.get(name) {
                    Some(def) => s = def,
                    None => return s,
                }
                continue;
            }
            if let Some(alts) = alternatives(s) {
                let non_null: Vec<&Value> = alts.iter().filter(|a| !is_null_schema(a)).collect();
                if non_null.len() == 1 {
                    s = non_null[0];
                    continue;
                }
            }
            break;
        }
        s
    }

    fn value(&mut self, v: &Spanned<DeValue<'a>>, schema: &Value, path: &Path) {
        let schema = self.resolve(schema);
        let span = v.span();
        let name = path.last_key().unwrap_or("value");
        if let Some(alts) = alternatives(schema) {
            let consts: Vec<&str> = alts.iter().filter_map(|a| a.get("const").and_then(Value::as_str)).collect();
            if consts.len() == alts.len() {
                return self.enumerated(v, &consts, name);
            }
        }
        if let Some(values) = schema.get("enum").and_then(Value::as_array) {
            let consts: Vec<&str> = values.iter().filter_map(Value::as_str).collect();
            return self.enumerated(v, &consts, name);
        }
        let expected = types(schema);
        let found = found_type(v.get_ref());
        if !expected.is_empty() && !expected.iter().any(|t| accepts(t, found)) {
            let want = expected.iter().map(|t| article(t)).collect::<Vec<_>>().join(" or ");
            let help = if expected.contains(&"string") && matches!(found, "integer" | "float" | "boolean") {
                let raw = self.doc.file.text.get(span.clone()).unwrap_or("").trim();
                Some(format!("write it in quotes: {name} = \"{raw}\""))
            } else {
                description(schema).map(str::to_string)
            };
            return self.error(span, format!("`{name}` must be {want}, not {}", article(found)), help);
        }
        match v.get_ref() {
            DeValue::Table(t) => self.table(t, span, schema, path),
            DeValue::Array(items) => {
                let (lo, hi) = (schema.get("minItems"), schema.get("maxItems"));
                let (lo, hi) = (lo.and_then(Value::as_u64), hi.and_then(Value::as_u64));
                let n = items.len() as u64;
                if lo.is_some_and(|lo| n < lo) || hi.is_some_and(|hi| n > hi) {
                    let want = match (lo, hi) {
                        (Some(lo), Some(hi)) if lo == hi => format!("exactly {lo}"),
                        (Some(lo), Some(hi)) => format!("{lo} to {hi}"),
                        (Some(lo), None) => format!("at least {lo}"),
                        (None, Some(hi)) => format!("at most {hi}"),
                        (None, None) => String::new(),
                    };
                    self.error(
                        span.clone(),
                        format!("`{name}` has {n} entr{}, it needs {want}", if n == 1 { "y" } else { "ies" }),
                        description(schema).map(str::to_string),
                    );
                }
                if let Some(item_schema) = schema.get("items") {
                    for (i, item) in items.iter().enumerate() {
                        self.value(item, item_schema, &path.index(i));
                    }
                }
            }
            DeValue::Integer(i) => self.integer(i.as_str(), i.radix(), span, schema, name),
            _ => {}
        }
    }

    fn integer(&mut self, raw: &str, radix: u32, span: Span, schema: &Value, name: &str) {
        let digits = raw.replace('_', "");
        let digits = digits.trim_start_matches('+');
        let digits = ["0x", "0o", "0b"].iter().fold(digits.to_string(), |d, p| d.replacen(p, "", 1));
        let Ok(n) = i128::from_str_radix(&digits, radix) else {
            return self.error(span, format!("`{name}` = {raw} is not a whole number nasos can read"), None);
        };
        let format_max = match schema.get("format").and_then(Value::as_str) {
            Some("uint8") => Some(u8::MAX as i128),
            Some("uint16") => Some(u16::MAX as i128),
            Some("uint32") => Some(u32::MAX as i128),
            Some("uint64" | "uint") => Some(u64::MAX as i128),
            _ => None,
        };
        let lo = schema.get("minimum").and_then(Value::as_i64).map(i128::from);
        let hi = schema.get("maximum").and_then(Value::as_i64).map(i128::from).or(format_max);
        if lo.is_some_and(|lo| n < lo) || hi.is_some_and(|hi| n > hi) {
            let range = match (lo, hi) {
                (Some(lo), Some(hi)) => format!("{lo}–{hi}"),
                (Some(lo), None) => format!("{lo} or more"),
                (None, Some(hi)) => format!("at most {hi}"),
                (None, None) => String::new(),
            };
            self.error(
                span,
                format!("`{name}` = {n} is out of range: it must be {range}"),
                description(schema).map(str::to_string),
            );
        }
    }

    fn enumerated(&mut self, v: &Spanned<DeValue<'a>>, allowed: &[&str], name: &str) {
        let list = allowed.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(", ");
        let Some(s) = v.get_ref().as_str() else {
            let found = found_type(v.get_ref());
            return self.error(
                v.span(),
                format!("`{name}` must be one of {list}, not {}", article(found)),
                Some("write the value in quotes".to_string()),
            );
        };
        if allowed.contains(&s) {
            return;
        }
        let help = match did_you_mean(s, allowed.iter().copied()) {
            Some(m) => format!("did you mean \"{m}\"?"),
            None => format!("use one of {list}"),
        };
        self.error(v.span(), format!("`{name}` = \"{s}\" is not one of {list}"), Some(help));
    }

    fn table(&mut self, t: &toml::de::DeTable<'a>, span: Span, schema: &Value, path: &Path) {
        let empty = Map::new();
        let props = schema.get("properties").and_then(Value::as_object).unwrap_or(&empty);
        let additional = schema.get("additionalProperties");
        let where_ = if path.0.is_empty() { "the file".to_string() } else { format!("`{path}`") };
        for (key, value) in t.iter() {
            let k: &str = key.get_ref();
            let sub = path.key(k);
            if let Some(prop) = props.get(k) {
                self.value(value, prop, &sub);
                continue;
            }
            match additional {
                Some(Value::Bool(false)) => {
                    let names: Vec<&str> = props.keys().map(String::as_str).collect();
                    let help = match did_you_mean(k, names.iter().copied()) {
                        Some(m) => format!("did you mean `{m}`?"),
                        None => format!("the keys allowed here are: {}", names.join(", ")),
                    };
                    self.error(key.span(), format!("unknown key `{k}` in {where_}"), Some(help));
                }
                Some(extra @ Value::Object(_)) => self.value(value, extra, &sub),
                _ => {}
            }
        }
        let required = schema.get("required").and_then(Value::as_array);
        for req in required.into_iter().flatten().filter_map(Value::as_str) {
            if t.get(req).is_none() {
                let hint = props.get(req).and_then(|p| description(self.resolve(p)).or(description(p)));
                let help = match hint {
                    Some(h) => format!("add `{req}`: {h}"),
                    None => format!("add `{req}`"),
                };
                let at = self.doc.span_of(path);
                let at = if path.0.is_empty() { span.start..span.start } else { at };
                self.error(at, format!("missing key `{req}` in {where_}"), Some(help));
            }
        }
    }
}

fn alternatives(s: &Value) -> Option<&Vec<Value>> {
    s.get("oneOf").or_else(|| s.get("anyOf")).and_then(Value::as_array)
}

fn is_null_schema(s: &Value) -> bool {
    s.get("type").and_then(Value::as_str) == Some("null") || s.get("const") == Some(&Value::Null)
}

fn types(schema: &Value) -> Vec<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).filter(|t| *t != "null").collect(),
        _ => Vec::new(),
    }
}

fn found_type(v: &DeValue<'_>) -> &'static str {
    match v {
        DeValue::String(_) => "string",
        DeValue::Integer(_) => "integer",
        DeValue::Float(_) => "float",
        DeValue::Boolean(_) => "boolean",
        DeValue::Datetime(_) => "datetime",
        DeValue::Array(_) => "array",
        DeValue::Table(_) => "table",
    }
}

fn accepts(expected: &str, found: &str) -> bool {
    match expected {
        "object" => found == "table",
        "number" => matches!(found, "integer" | "float"),
        other => other == found,
    }
}

fn article(t: &str) -> &'static str {
    match t {
        "string" => "a string",
        "integer" => "a whole number",
        "float" | "number" => "a number",
        "boolean" => "true or false",
        "datetime" => "a date",
        "array" => "a list `[…]`",
        "object" | "table" => "a table",
        _ => "a value",
    }
}

fn description(schema: &Value) -> Option<&str> {
    schema.get("description").and_then(Value::as_str)
}
