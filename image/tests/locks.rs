//! Every shipped recipe's lock: read by this nasos, made from the release, its updates and its
//! security archive, with security fixes among its packages and the boot chain (systemd-boot
//! and the UKI stub) locked like every other package.

use std::path::{Path, PathBuf};

use nasos_image::archive::{SOURCES, suite_of};
use nasos_image::lock::Lock;

fn locks() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes");
    let mut locks: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("recipes")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".toml.lock"))
        .collect();
    locks.sort();
    assert!(locks.len() >= 4, "{locks:?}");
    locks
}

#[test]
fn every_lock_takes_security_fixes_and_locks_the_boot_chain() {
    let suites: Vec<&str> = SOURCES.iter().filter_map(|s| suite_of(s)).collect();
    for path in locks() {
        let lock = Lock::read(&path).expect("readable").expect("present");
        let name = path.display();
        assert_eq!(lock.sources, SOURCES, "{name}: made from other archives");
        for p in &lock.packages {
            assert!(suites.contains(&p.suite.as_str()), "{name}: {} from {:?}", p.name, p.suite);
            assert_eq!(p.sha256.len(), 64, "{name}: {}", p.name);
        }
        let security: Vec<&str> =
            lock.packages.iter().filter(|p| p.suite == "trixie-security").map(|p| p.name.as_str()).collect();
        assert!(!security.is_empty(), "{name}: no package from trixie-security");
        assert!(lock.version_of("systemd-boot-efi").is_some(), "{name}: systemd-boot-efi is not locked");
        eprintln!("{name}: {} packages, {} from trixie-security", lock.packages.len(), security.len());
    }
}
