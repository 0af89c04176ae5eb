//! The invalid-recipe corpus (tests/invalid/): every file holds one mistake, and `nasos validate`
//! must exit 1 and report exactly the expected errors, at exactly the expected places, each with a fix.

use std::path::{Path, PathBuf};
use std::process::Command;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/invalid")
}

struct Case {
    file: String,
    expect: Vec<String>,
    help: Vec<String>,
}

fn cases() -> Vec<Case> {
    let mut cases: Vec<Case> = std::fs::read_dir(corpus_dir())
        .expect("corpus directory")
        .map(|e| e.expect("corpus entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("corpus file");
            let header = |tag: &str| -> Vec<String> {
                text.lines().filter_map(|l| l.strip_prefix(tag)).map(|s| s.trim().to_string()).collect()
            };
            Case {
                file: p.file_name().expect("name").to_string_lossy().into_owned(),
                expect: header("# expect:"),
                help: header("# help:"),
            }
        })
        .collect();
    cases.sort_by(|a, b| a.file.cmp(&b.file));
    cases
}

#[test]
fn corpus_is_large_enough() {
    let cases = cases();
    assert!(cases.len() >= 30, "the corpus must hold at least 30 invalid recipes, has {}", cases.len());
    for c in &cases {
        assert!(!c.expect.is_empty(), "{} has no `# expect:` line", c.file);
    }
}

#[test]
fn every_invalid_recipe_is_refused_where_and_why_expected() {
    let mut failures = Vec::new();
    for case in cases() {
        let out = Command::new(env!("CARGO_BIN_EXE_nasos"))
            .args(["validate", "--short", &case.file])
            .current_dir(corpus_dir())
            .output()
            .expect("run nasos");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() != Some(1) {
            failures.push(format!("{}: exit code {:?}, expected 1\n{stderr}", case.file, out.status.code()));
            continue;
        }
        let prefix = format!("{}:", case.file);
        let errors: Vec<&str> = stderr.lines().filter(|l| l.contains(": error: ")).collect();
        let mut got: Vec<String> = Vec::new();
        for line in &errors {
            let Some(rest) = line.strip_prefix(&prefix) else {
                failures.push(format!("{}: error does not start with the file name: {line}", case.file));
                continue;
            };
            let Some((loc, msg)) = rest.split_once(": error: ") else { continue };
            let msg = msg.split(" (help: ").next().unwrap_or(msg);
            got.push(format!("{loc}: {msg}"));
            if !line.contains(" (help: ") {
                failures.push(format!("{}: error without a fix-it hint: {line}", case.file));
            }
        }
        if got != case.expect {
            failures.push(format!("{}:\n  expected {:#?}\n  got      {:#?}", case.file, case.expect, got));
        }
        for h in &case.help {
            if !stderr.contains(h.as_str()) {
                failures.push(format!("{}: hint `{h}` missing from\n{stderr}", case.file));
            }
        }
    }
    assert!(failures.is_empty(), "{} corpus failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn rich_output_shows_location_and_source_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_nasos"))
        .args(["validate", "unknown-key.toml"])
        .current_dir(corpus_dir())
        .output()
        .expect("run nasos");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("error: unknown key `mtuu` in `network.links[0]`"), "{stderr}");
    assert!(stderr.contains("unknown-key.toml:16:1"), "{stderr}");
    assert!(stderr.contains("16 │ mtuu = 9000"), "{stderr}");
    assert!(stderr.contains("help: did you mean `mtu`?"), "{stderr}");
    assert!(stderr.contains("1 error, 0 warnings"), "{stderr}");
}
