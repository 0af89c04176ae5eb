//! The crate graph points one way (README.md, "Crate graph"). This reads the resolved graph from
//! `cargo metadata` and fails for any dependency between our crates that the README does not
//! allow, and for heavy dependencies reaching crates that must stay small.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Every normal (non-dev) dependency one of our crates may have on another of ours.
const ALLOWED: &[(&str, &[&str])] = &[
    ("nasos-layout", &[]),
    ("nasos-bundle", &["nasos-layout"]),
    ("nasos-board", &["nasos-layout", "nasos-bundle"]),
    ("nasos-exec", &[]),
    ("nasos-zfs", &["nasos-exec"]),
    ("nasos-dcbnl", &[]),
    ("nasos-dcbnl-shim", &[]),
    ("nasos-api", &["nasos-layout"]),
    ("nasos-initramfs", &["nasos-layout"]),
    ("nasos-init", &["nasos-layout", "nasos-board", "nasos-api", "nasos-exec"]),
    (
        "nasos-services",
        &["nasos-layout", "nasos-bundle", "nasos-board", "nasos-api", "nasos-exec", "nasos-zfs", "nasos-dcbnl"],
    ),
    ("nasos-ctl", &["nasos-layout", "nasos-bundle", "nasos-board", "nasos-api", "nasos-exec", "nasos-services"]),
    ("nasos-qemu", &["nasos-layout", "nasos-board"]),
    ("nasos-k8s", &["nasos-layout", "nasos-bundle", "nasos-board"]),
    ("nasos-image", &["nasos-layout", "nasos-bundle", "nasos-board", "nasos-qemu", "nasos-k8s"]),
    ("nasos-tests", &["nasos-layout", "nasos-board", "nasos-qemu"]),
];

/// Crates that must not be reached, directly or not, through normal dependencies.
const FORBIDDEN: &[(&str, &[&str])] = &[
    // The host CLI builds images; it has no business with the appliance's runtime.
    ("nasos-image", &["tokio", "zbus", "nasos-dcbnl", "nasos-zfs", "nasos-init", "nasos-services", "nasos-api"]),
    // The initramfs's init runs once with nothing around it.
    ("nasos-initramfs", &["tokio", "zbus", "clap", "serde", "nasos-board"]),
    // Kubernetes' types are for the host CLI; the box never links them.
    ("nasos-services", &["k8s-openapi", "nasos-k8s"]),
    ("nasos-ctl", &["k8s-openapi", "nasos-k8s"]),
    // PID 1 never links storage or network logic.
    ("nasos-init", &["nasos-services", "nasos-zfs", "nasos-dcbnl"]),
];

struct Graph {
    names: BTreeMap<String, String>,
    edges: BTreeMap<String, BTreeSet<String>>,
    members: BTreeSet<String>,
}

fn graph() -> Graph {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(nasos_tests::repo())
        .output()
        .expect("cargo metadata");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata json");
    let names: BTreeMap<String, String> = m["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| (p["id"].as_str().expect("id").to_string(), p["name"].as_str().expect("name").to_string()))
        .collect();
    let members = m["workspace_members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|v| names[v.as_str().expect("id")].clone())
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for node in m["resolve"]["nodes"].as_array().expect("nodes") {
        let from = names[node["id"].as_str().expect("id")].clone();
        let set = edges.entry(from).or_default();
        for dep in node["deps"].as_array().expect("deps") {
            let normal = dep["dep_kinds"].as_array().expect("kinds").iter().any(|k| k["kind"].is_null());
            if normal {
                set.insert(names[dep["pkg"].as_str().expect("pkg")].clone());
            }
        }
    }
    Graph { names, edges, members }
}

impl Graph {
    fn reachable(&self, from: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(n) = todo.pop() {
            for d in self.edges.get(&n).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
        seen
    }
}

#[test]
fn dependencies_between_our_crates_point_one_way() {
    let g = graph();
    assert!(g.names.len() > g.members.len(), "metadata lists external packages too");
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut wrong = Vec::new();
    for member in &g.members {
        let Some(ok) = allowed.get(member.as_str()) else {
            wrong.push(format!("{member} is not in the README's crate graph: add it there and here"));
            continue;
        };
        for dep in g.edges.get(member).into_iter().flatten().filter(|d| g.members.contains(*d)) {
            if !ok.contains(&dep.as_str()) {
                wrong.push(format!("{member} → {dep}"));
            }
        }
    }
    assert!(wrong.is_empty(), "dependencies outside the crate graph:\n  {}", wrong.join("\n  "));
}

#[test]
fn small_crates_stay_small() {
    let g = graph();
    let mut wrong = Vec::new();
    for (krate, banned) in FORBIDDEN {
        let reach = g.reachable(krate);
        assert!(!reach.is_empty() || *krate == "nasos-layout", "{krate} has no dependencies at all?");
        for b in *banned {
            if reach.contains(*b) {
                wrong.push(format!("{krate} reaches {b}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
