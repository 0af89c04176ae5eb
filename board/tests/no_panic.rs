//! No input, however broken, makes validation panic; whatever passes validation resolves to a plan.

use nasos_board::{SourceFile, load_recipe};
use proptest::prelude::*;

const RECIPES: &[&str] = &[
    include_str!("../../recipes/ts-h1290fx.toml"),
    include_str!("../../recipes/qemu-dev.toml"),
    include_str!("../../recipes/qemu-client.toml"),
];

/// Validates, and when valid, plans and round-trips the plan through JSON: none of it may panic.
fn exercise(text: &str) {
    if let Ok(loaded) = load_recipe(&SourceFile::new("fuzz.toml", text)) {
        let plan = loaded.plan();
        let json = serde_json::to_string(&plan).expect("plan serializes");
        let back: nasos_board::Plan = serde_json::from_str(&json).expect("plan parses back");
        assert_eq!(back, plan);
        let _ = plan.to_string();
    } else if let Err(report) = load_recipe(&SourceFile::new("fuzz.toml", text)) {
        let _ = report.render();
        assert!(report.has_errors());
    }
}

#[derive(Debug, Clone)]
enum Edit {
    Delete(usize, usize),
    Insert(usize, String),
    DuplicateLine(usize),
    SwapLines(usize, usize),
    ReplaceNumber(usize, i128),
}

fn apply(text: &str, edit: &Edit) -> String {
    let clamp = |i: usize| {
        let i = i % (text.len() + 1);
        (0..=i).rev().find(|&j| text.is_char_boundary(j)).unwrap_or(0)
    };
    match edit {
        Edit::Delete(a, len) => {
            let a = clamp(*a);
            let b = clamp(a + len % 64).max(a);
            format!("{}{}", &text[..a], &text[b..])
        }
        Edit::Insert(a, s) => {
            let a = clamp(*a);
            format!("{}{s}{}", &text[..a], &text[a..])
        }
        Edit::DuplicateLine(i) => {
            let mut lines: Vec<&str> = text.lines().collect();
            if !lines.is_empty() {
                let i = i % lines.len();
                lines.insert(i, lines[i]);
            }
            lines.join("\n")
        }
        Edit::SwapLines(i, j) => {
            let mut lines: Vec<&str> = text.lines().collect();
            if !lines.is_empty() {
                let (i, j) = (i % lines.len(), j % lines.len());
                lines.swap(i, j);
            }
            lines.join("\n")
        }
        Edit::ReplaceNumber(k, n) => {
            // Replace the k-th run of digits with an arbitrary (possibly huge or negative) number.
            let runs: Vec<(usize, usize)> = {
                let b = text.as_bytes();
                let mut v = Vec::new();
                let mut i = 0;
                while i < b.len() {
                    if b[i].is_ascii_digit() {
                        let s = i;
                        while i < b.len() && b[i].is_ascii_digit() {
                            i += 1;
                        }
                        v.push((s, i));
                    } else {
                        i += 1;
                    }
                }
                v
            };
            if runs.is_empty() {
                return text.to_string();
            }
            let (s, e) = runs[k % runs.len()];
            format!("{}{n}{}", &text[..s], &text[e..])
        }
    }
}

fn edit() -> impl Strategy<Value = Edit> {
    let toml_bits = prop::string::string_regex(r#"[\[\]{}=",.\n a-z0-9_#'-]{0,12}"#).expect("regex");
    prop_oneof![
        (any::<usize>(), any::<usize>()).prop_map(|(a, l)| Edit::Delete(a, l)),
        (any::<usize>(), toml_bits).prop_map(|(a, s)| Edit::Insert(a, s)),
        any::<usize>().prop_map(Edit::DuplicateLine),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::SwapLines(a, b)),
        (any::<usize>(), any::<i128>()).prop_map(|(k, n)| Edit::ReplaceNumber(k, n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        exercise(&text);
    }

    #[test]
    fn toml_like_text_never_panics(text in prop::string::string_regex(r#"(\[{1,2}[a-z._]{1,12}\]{1,2}\n|[a-z_]{1,10} = ("[^"\n]{0,8}"|-?[0-9]{1,22}|true|\[[0-9, "a-z]{0,20}\]|\{[a-z =0-9",]{0,20}\})\n){0,20}"#).expect("regex")) {
        exercise(&text);
    }

    #[test]
    fn mutated_recipes_never_panic(which in 0..RECIPES.len(), edits in prop::collection::vec(edit(), 1..6)) {
        let mut text = RECIPES[which].to_string();
        for e in &edits {
            text = apply(&text, e);
        }
        exercise(&text);
    }
}
