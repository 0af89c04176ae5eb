//! The bootable appliance, end to end: build the qemu-dev image (and the product image), prove a
//! no-op rebuild does no stage work and a clean rebuild is bit-identical, boot it through OVMF and
//! systemd-boot to nasinit's ready line, inspect it with nasctl, power it off, show that a bay
//! holding a foreign filesystem is refused untouched, and that a tampered root is refused.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nasos_qemu::{Link, Vm};
use nasos_tests::{build_binaries, nasos, overlay, repo};

fn sha256(p: &Path) -> String {
    let out = Command::new("sha256sum").arg(p).output().expect("sha256sum");
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or("").to_string()
}

fn boot(dir: &Path, disk: &Path, tag: &str) -> Vm {
    boot_with(dir, disk, tag, |_| {})
}

/// Boots the built disk with fresh bays that `prepare` may seed.
fn boot_with(dir: &Path, disk: &Path, tag: &str, prepare: impl FnOnce(&Path)) -> Vm {
    let net = dir.join(format!("net-{tag}.sock"));
    let link = Link { port: "roce0".into(), socket: net, listen: true };
    nasos_tests::boot(dir, disk, tag, 2048, link, prepare)
}

#[test]
fn appliance_builds_boots_serves_and_powers_off() {
    build_binaries();
    let dir = repo().join("build/e2e");
    std::fs::create_dir_all(&dir).expect("e2e dir");
    let out = dir.join("qemu-dev");
    let out_s = out.display().to_string();

    // Build; the command prints the paths it wrote.
    let first = nasos(&["build", "recipes/qemu-dev.toml", "--out", &out_s, "--timings"]);
    for f in ["disk.img", "disk.qcow2"] {
        assert!(first.stdout.contains(&format!("{out_s}/{f}")), "{}", first.stdout);
        assert!(out.join(f).exists());
    }
    eprintln!(
        "cold-or-warm build: {:.1}s\n{}",
        first.took.as_secs_f64(),
        first.stderr.lines().filter(|l| !l.starts_with("I: ")).collect::<Vec<_>>().join("\n")
    );

    // A rebuild with nothing changed does no stage work.
    let again = nasos(&["build", "recipes/qemu-dev.toml", "--out", &out_s, "--timings"]);
    for stage in ["rootfs", "root", "uki", "disk"] {
        assert!(
            again.stderr.contains(&format!("nasos: {stage:<10} up to date")),
            "{stage} was redone:\n{}",
            again.stderr
        );
    }
    assert!(!again.stderr.contains(" built "), "{}", again.stderr);
    eprintln!("no-op rebuild: {:.1}s", again.took.as_secs_f64());

    // A clean rebuild of every stage from the same recipe and lock gives the same bytes.
    let clean = dir.join("qemu-dev-clean");
    let rebuilt = nasos(&["build", "recipes/qemu-dev.toml", "--out", &clean.display().to_string(), "--rebuild"]);
    eprintln!("clean rebuild: {:.1}s", rebuilt.took.as_secs_f64());
    assert_eq!(sha256(&out.join("disk.img")), sha256(&clean.join("disk.img")), "two clean builds differ");
    let _ = std::fs::remove_dir_all(&clean);

    // Boot to ready, inspect, power off.
    let disk = out.join("disk.qcow2");
    let mut vm = boot(&dir, &disk, "dev");
    let t0 = Instant::now();
    let started = vm.wait_for("nasinit: started", Duration::from_secs(240)).expect("nasinit starts");
    let ready = vm.wait_for("nasinit: ready in ", Duration::from_secs(400)).expect("the appliance becomes ready");
    eprintln!("{started}\n{ready}\n(wall clock from QEMU start: {:.1}s)", t0.elapsed().as_secs_f64());
    let secs: f64 =
        ready.rsplit("ready in ").next().and_then(|s| s.trim().trim_end_matches('s').parse().ok()).expect("seconds");
    assert!(secs > 0.0);
    vm.wait_for("login: root (automatic login)", Duration::from_secs(60)).ok();
    let (json, code) = vm.run("nasctl status --json", Duration::from_secs(60)).expect("nasctl status");
    assert_eq!(code, 0, "{json}");
    let start = json.find('{').expect("JSON in the output");
    let status: serde_json::Value = serde_json::from_str(&json[start..]).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(status["state"], "ready", "{status}");
    assert_eq!(status["image"], "qemu-dev");
    assert_eq!(status["pid1"], true);
    assert_eq!(status["services_failed"], 0);
    assert_eq!(status["services_ready"], status["services"]);
    let (timeline, _) = vm.run("nasctl timeline", Duration::from_secs(60)).expect("timeline");
    eprintln!("{timeline}");
    let (services, _) = vm.run("nasctl services", Duration::from_secs(60)).expect("services");
    assert!(services.lines().any(|l| l.starts_with("bless") && l.contains("done")), "{services}");
    vm.run("nasctl poweroff", Duration::from_secs(60)).ok();
    let st = vm.wait_exit(Duration::from_secs(180)).expect("QEMU exits after poweroff");
    assert!(st.success(), "QEMU exit status {st}");
    drop(vm);

    // A bay holding another system's filesystem is named, refused, and left exactly as it was.
    let foreign = dir.join("foreign-bay07.raw");
    let _ = std::fs::remove_file(&foreign);
    let st = Command::new("qemu-img")
        .args(["create", "-q", "-f", "raw"])
        .arg(&foreign)
        .arg(nasos_qemu::BAY_SIZE)
        .status()
        .expect("qemu-img");
    assert!(st.success());
    let st =
        Command::new("mkfs.ext4").args(["-q", "-F", "-L", "oldbox-data"]).arg(&foreign).status().expect("mkfs.ext4");
    assert!(st.success());
    let mut vm = boot_with(&dir, &out.join("disk.qcow2"), "foreign", |state| {
        let st = Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "qcow2"])
            .arg(&foreign)
            .arg(state.join("bay07.qcow2"))
            .status()
            .expect("qemu-img convert");
        assert!(st.success());
    });
    vm.wait_for("nasinit: started", Duration::from_secs(240)).expect("nasinit starts");
    vm.wait_for("login: root (automatic login)", Duration::from_secs(240)).ok();
    let deadline = Instant::now() + Duration::from_secs(300);
    let refusal = loop {
        let (log, _) = vm.run("nasctl logs storage", Duration::from_secs(60)).expect("storage log");
        if let Some(l) = log.lines().find(|l| l.contains("refusing to create pool tank")) {
            break l.to_string();
        }
        assert!(Instant::now() < deadline, "storage never refused the foreign bay:\n{log}");
        std::thread::sleep(Duration::from_secs(5));
    };
    assert!(refusal.contains("BAY07 holds a ext4 signature labelled oldbox-data"), "{refusal}");
    assert!(!refusal.contains("BAY06") && !refusal.contains("BAY08"), "blank bays named: {refusal}");
    let (json, _) = vm.run("nasctl status --json", Duration::from_secs(60)).expect("status");
    let status: serde_json::Value = serde_json::from_str(&json[json.find('{').expect("JSON")..]).expect("status JSON");
    assert_ne!(status["state"], "ready", "ready without its pool: {status}");
    let (pools, _) = vm.run("zpool list -H -o name", Duration::from_secs(60)).expect("zpool list");
    assert!(!pools.contains("tank"), "a pool was created: {pools}");
    vm.kill();
    let same = Command::new("qemu-img")
        .args(["compare", "-q", "-f", "raw", "-F", "qcow2"])
        .arg(&foreign)
        .arg(dir.join("vm-foreign/bay07.qcow2"))
        .status()
        .expect("qemu-img compare");
    assert!(same.success(), "the foreign disk in BAY07 was changed");
    let _ = std::fs::remove_file(&foreign);

    // A tampered root partition is refused at boot. Root-A starts after 1 MiB of GPT and the
    // 96 MiB ESP; its first block holds the EROFS superblock, which mounting must read.
    let tampered = overlay(&out.join("disk.qcow2"), &dir.join("tampered.qcow2"));
    let st = Command::new("qemu-io")
        .args(["-f", "qcow2", "-c", &format!("write -P 0x5a {} 4096", 97 << 20)])
        .arg(&tampered)
        .output()
        .expect("qemu-io");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let mut vm = boot(&dir, &tampered, "tampered");
    let line =
        vm.wait_for("ROOT FILESYSTEM VERIFICATION FAILED", Duration::from_secs(300)).expect("verity refuses the root");
    assert!(line.contains("refusing to boot it"), "{line}");
    vm.kill();

    // The product image builds too (it is not booted here: no TS-h1290FX under QEMU).
    let product = nasos(&[
        "build",
        "recipes/ts-h1290fx.toml",
        "--out",
        &dir.join("ts-h1290fx").display().to_string(),
        "--timings",
    ]);
    assert!(product.stdout.contains("disk.img"), "{}", product.stdout);
    eprintln!("product build: {:.1}s", product.took.as_secs_f64());

    // Changing an export redoes only the stages after the plan: the rootfs stays cached.
    let recipe = std::fs::read_to_string(repo().join("recipes/qemu-dev.toml")).expect("recipe");
    let changed = recipe.replace("network = \"10.77.0.0/25\"", "network = \"10.77.0.0/26\"");
    assert_ne!(changed, recipe, "the export to change is not in qemu-dev.toml any more");
    let copy = dir.join("qemu-dev-export.toml");
    std::fs::write(&copy, changed).expect("write recipe");
    std::fs::copy(repo().join("recipes/qemu-dev.toml.lock"), dir.join("qemu-dev-export.toml.lock")).expect("copy lock");
    let redo = nasos(&["build", &copy.display().to_string(), "--out", &out_s, "--timings"]);
    assert!(redo.stderr.contains("nasos: rootfs     up to date"), "{}", redo.stderr);
    for stage in ["root", "uki", "disk"] {
        assert!(redo.stderr.contains(&format!("nasos: {stage:<10} done")), "{stage} was not redone:\n{}", redo.stderr);
    }
    eprintln!("export change rebuild: {:.1}s", redo.took.as_secs_f64());
}
