//! Snapshots of `nasos plan` for the shipped recipes, human and JSON. A change to the plan shows up
//! here as a diff to review (`cargo insta review`, or INSTA_UPDATE=always to accept).

use std::path::Path;
use std::process::Command;

fn plan(recipe: &str, json: bool) -> String {
    let mut args = vec!["plan", recipe];
    if json {
        args.push("--json");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_nasos"))
        .args(&args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .expect("run nasos");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf8")
}

#[test]
fn product_plan() {
    insta::assert_snapshot!("ts-h1290fx.plan", plan("recipes/ts-h1290fx.toml", false));
    insta::assert_snapshot!("ts-h1290fx.plan.json", plan("recipes/ts-h1290fx.toml", true));
}

#[test]
fn qemu_dev_plan() {
    insta::assert_snapshot!("qemu-dev.plan", plan("recipes/qemu-dev.toml", false));
    insta::assert_snapshot!("qemu-dev.plan.json", plan("recipes/qemu-dev.toml", true));
}

#[test]
fn qemu_client_plan() {
    insta::assert_snapshot!("qemu-client.plan", plan("recipes/qemu-client.toml", false));
    insta::assert_snapshot!("qemu-client.plan.json", plan("recipes/qemu-client.toml", true));
}
