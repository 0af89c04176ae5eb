//! The `nasos` command line: exit codes, several errors at once, plan and schema output.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn nasos(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nasos")).args(args).current_dir(repo()).output().expect("run nasos")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn shipped_recipes_are_valid() {
    for r in ["recipes/ts-h1290fx.toml", "recipes/qemu-dev.toml", "recipes/qemu-client.toml"] {
        let out = nasos(&["validate", r]);
        assert!(out.status.success(), "{r}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), format!("{r}: valid\n"));
        assert!(!text(&out.stderr).contains("error:"), "{r}: {}", text(&out.stderr));
    }
}

#[test]
fn several_mistakes_are_reported_at_once() {
    let mut f = tempfile();
    write!(
        f.1,
        r#"[image]
name = "multi"
version = "1.0.0"
board = "qemu-q35"
development = true
[console]
root_login = "autologin"
[[network.links]]
name = "data0"
port = "roce9"
addresses = ["10.0.0.1"]
[[pools]]
name = "tank"
vdevs = [{{ type = "raidz2", bays = ["BAY01", "BAY02"] }}, {{ type = "mirror", bays = ["BAY02", "BAY99"] }}]
"#
    )
    .expect("write");
    let out = nasos(&["validate", "--short", f.0.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains(": error: ")).collect();
    for want in [
        ":10:8: error: unknown port `roce9`",
        ":11:14: error: invalid address `10.0.0.1`",
        ":14:36: error: a raidz2 vdev takes at least 3 disks, this one has 2",
        ":14:94: error: unknown bay `BAY99`",
        ":14:85: error: duplicate bay `BAY02`",
    ] {
        assert!(errors.iter().any(|e| e.contains(want)), "missing `{want}` in\n{stderr}");
    }
    assert_eq!(errors.len(), 5, "{stderr}");
    // Findings come in file order.
    let lines: Vec<usize> =
        errors.iter().map(|e| e.split(':').nth(1).and_then(|n| n.parse().ok()).unwrap_or(0)).collect();
    assert!(lines.windows(2).all(|w| w[0] <= w[1]), "{stderr}");
}

#[test]
fn structural_mistakes_are_all_reported_too() {
    let mut f = tempfile();
    write!(f.1, "[image]\nnam = \"x\"\nversion = 1\nboard = \"qemu-q35\"\n[consol]\n").expect("write");
    let out = nasos(&["validate", "--short", f.0.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    for want in [
        ":2:1: error: unknown key `nam` in `image` (help: did you mean `name`?)",
        ":3:11: error: `version` must be a string, not a whole number",
        ":5:2: error: unknown key `consol` in the file (help: did you mean `console`?)",
        "error: missing key `name` in `image`",
        "error: missing key `console` in the file",
    ] {
        assert!(stderr.contains(want), "missing `{want}` in\n{stderr}");
    }
}

#[test]
fn a_missing_file_is_a_clear_error() {
    let out = nasos(&["validate", "recipes/no-such-recipe.toml"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("recipes/no-such-recipe.toml:1:1: error: cannot read recipe"), "{stderr}");
}

#[test]
fn plan_refuses_an_invalid_recipe() {
    let out = nasos(&["plan", "tests/invalid/unknown-key.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(text(&out.stderr).contains("unknown key `mtuu`"));
}

#[test]
fn plan_json_is_the_plan() {
    let out = nasos(&["plan", "--json", "recipes/qemu-dev.toml"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let plan: nasos_board::Plan = serde_json::from_slice(&out.stdout).expect("plan JSON parses back into a Plan");
    assert_eq!(plan.image.board, "qemu-q35");
    assert_eq!(plan.pools[0].vdevs.len(), 2);
    assert_eq!(plan.nfs.as_ref().and_then(|n| n.rdma_port), Some(20049));
}

#[test]
fn schemas_are_json_schemas_of_both_file_kinds() {
    for (kind, keys) in
        [("recipe", ["image", "pools", "nfs", "fabric"]), ("board", ["bays", "ports", "cpu", "watchdog"])]
    {
        let out = nasos(&["schema", kind]);
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("schema is JSON");
        assert!(v["$schema"].as_str().is_some_and(|s| s.contains("json-schema.org")), "{kind}");
        for k in keys {
            assert!(v["properties"][k].is_object(), "{kind} schema lacks `{k}`");
        }
    }
}

#[test]
fn every_command_has_help() {
    for args in [vec!["--help"], vec!["validate", "--help"], vec!["plan", "--help"], vec!["schema", "--help"]] {
        let out = nasos(&args);
        assert!(out.status.success(), "{args:?}");
        assert!(text(&out.stdout).contains("Usage: nasos"), "{args:?}");
    }
}

/// A temporary recipe file, removed when dropped.
fn tempfile() -> (TempPath, std::fs::File) {
    let dir = std::env::temp_dir();
    let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let path = dir.join(format!("nasos-cli-{}-{n}.toml", std::process::id()));
    let f = std::fs::File::create(&path).expect("create temp recipe");
    (TempPath(path), f)
}

struct TempPath(PathBuf);

impl std::ops::Deref for TempPath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
