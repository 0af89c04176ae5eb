//! `nasos sbom` for each shipped recipe: the SPDX document is valid for SPDX's own tools
//! (`pyspdxtools` from spdx-tools, installed from PyPI into a virtual environment under build/)
//! and lists every package of the recipe's lock with its version.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// pyspdxtools in a virtual environment under build/tools, made once.
fn pyspdxtools() -> PathBuf {
    let venv = repo().join("build/tools/spdx-tools-0.8.5");
    let tool = venv.join("bin/pyspdxtools");
    if !tool.exists() {
        let made = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().expect("python3 -m venv");
        assert!(made.success(), "python3 -m venv {} (Debian: python3-venv)", venv.display());
        let pip = Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", "spdx-tools==0.8.5"])
            .status()
            .expect("pip");
        assert!(pip.success() && tool.exists(), "pip install spdx-tools==0.8.5");
    }
    tool
}

#[test]
fn every_recipe_has_a_valid_sbom_listing_its_locked_packages() {
    let tool = pyspdxtools();
    let dir = repo().join("build/sbom");
    std::fs::create_dir_all(&dir).expect("dir");
    for recipe in ["qemu-dev", "qemu-client", "ts-h1290fx"] {
        let out = dir.join(format!("{recipe}.spdx.json"));
        let made = Command::new(env!("CARGO_BIN_EXE_nasos"))
            .args(["sbom", &format!("recipes/{recipe}.toml"), "--out"])
            .arg(&out)
            .current_dir(repo())
            .output()
            .expect("nasos sbom");
        assert!(made.status.success(), "{recipe}: {}", String::from_utf8_lossy(&made.stderr));
        let checked = Command::new(&tool).arg("-i").arg(&out).output().expect("pyspdxtools");
        let said = format!("{}{}", String::from_utf8_lossy(&checked.stdout), String::from_utf8_lossy(&checked.stderr));
        assert!(checked.status.success() && !said.contains("invalid"), "{recipe}: pyspdxtools says:\n{said}");
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).expect("read")).expect("JSON");
        let lock = std::fs::read_to_string(repo().join(format!("recipes/{recipe}.toml.lock"))).expect("lock");
        let names: Vec<&str> = lock.lines().filter_map(|l| l.strip_prefix("name = \"")?.strip_suffix('"')).collect();
        let pkgs = doc["packages"].as_array().expect("packages");
        for name in &names {
            assert!(pkgs.iter().any(|p| p["name"] == *name), "{recipe}: {name} is in the lock, not in the SBOM");
        }
        eprintln!("{recipe}: {} packages ({} from the lock), valid SPDX 2.3", pkgs.len(), names.len());
    }
}
