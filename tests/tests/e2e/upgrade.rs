//! Field upgrades end to end: v1 (qemu-dev 0.1.0) boots; bundles that are forged, signed by a
//! stranger, for another board, older, larger than the slot, damaged or cut short are refused
//! with a clear message and nothing bootable changes; v2 from a USB stick boots and is blessed
//! with the pool, identity and exports unchanged; then v3 from a file on a dataset boots on the
//! other slot again (the slot contract holds across upgrades); a version that never gets ready
//! is rolled back; 0.2.0 again only with `--allow-downgrade`, and it stays once blessed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nasos_bundle::{Manifest, reader};
use nasos_qemu::{Link, Vm};
use nasos_tests::suite::{Shared, Suite};
use nasos_tests::{build_binaries, bundles_dir, dev_bundle, nasos, ok, poll, poll_until, repo};

struct Built {
    v1: PathBuf,
    v2: PathBuf,
    v3: PathBuf,
    /// 0.4.0, built so that it never gets ready (its storage hangs; a 30 s boot deadline).
    broken: PathBuf,
}

static BUILT: Shared<Built> = Shared::new("build::v1_and_signed_v2_v3_bundles");
static VM: Shared<Vm> = Shared::new("apply::v1_boots_with_one_entry");

fn dir() -> PathBuf {
    bundles_dir()
}

pub fn suite() -> Suite {
    let mut s = Suite::new("upgrade");
    s.check("build::v1_and_signed_v2_v3_bundles", build);
    s.check("bundle::minisign_checks_the_manifest_and_inspect_judges_the_key", inspect);
    s.check("apply::v1_boots_with_one_entry", boot_v1);
    s.check("apply::bad_bundles_are_refused_and_nothing_bootable_changes", bad_bundles);
    s.check("apply::v2_from_a_usb_stick_boots_and_is_blessed", v2_from_usb);
    s.check("apply::v3_from_a_file_on_a_dataset_boots_on_the_other_slot", v3_from_file);
    s.check("rollback::a_version_that_never_gets_ready_uses_up_its_tries_and_the_previous_boots", rollback);
    s.check("downgrade::an_older_version_only_with_allow_downgrade_boots_once_and_stays_once_blessed", downgrade);
    s.kill_at_end(&VM);
    s
}

fn build() {
    build_binaries();
    let v1 = dir().join("v1");
    nasos(&["build", "recipes/qemu-dev.toml", "--out", &v1.display().to_string()]);
    let v2 = dev_bundle("0.2.0", "");
    let v3 = dev_bundle("0.3.0", "");
    let broken =
        dev_bundle("0.4.0", "\n[liveness]\nready_deadline_seconds = 30\n\n[debug]\nhang_services = [\"storage\"]\n");
    BUILT.set(Built { v1, v2, v3, broken });
}

fn ensure_minisign() {
    if !Path::new("/usr/bin/minisign").exists() {
        assert!(
            nasos_tests::apt_install("minisign"),
            "installing minisign (the reference tool the manifest is checked with)"
        );
    }
}

/// The real minisign checks a bundle's manifest with the recipe's key file; `nasos bundle
/// --inspect` says the signature is good for qemu-dev's keys and bad for the product's.
fn inspect() {
    ensure_minisign();
    let v2 = BUILT.with(|b| b.v2.clone());
    let x = dir().join("extracted");
    let _ = std::fs::remove_dir_all(&x);
    std::fs::create_dir_all(&x).expect("dir");
    let st = Command::new("tar")
        .arg("xf")
        .arg(&v2)
        .args(["-C"])
        .arg(&x)
        .args(["manifest.json", "manifest.json.minisig"])
        .status()
        .expect("tar");
    assert!(st.success());
    let out = Command::new("minisign")
        .args(["-V", "-m"])
        .arg(x.join("manifest.json"))
        .arg("-p")
        .arg(repo().join("recipes/keys/nasos-dev.pub"))
        .output()
        .expect("minisign");
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "minisign -V: {said}");
    assert!(said.contains("Signature and comment signature verified"), "{said}");
    assert!(said.contains("nasos bundle qemu-dev 0.2.0 for qemu-q35"), "{said}");
    let good = nasos(&["bundle", "recipes/qemu-dev.toml", "--inspect", &v2.display().to_string()]);
    assert!(good.stdout.contains("image      qemu-dev 0.2.0 for board qemu-q35"), "{}", good.stdout);
    assert!(good.stdout.contains("signature  good, by key 916D609174D6BE94"), "{}", good.stdout);
    assert!(good.stdout.contains("payloads   match the manifest"), "{}", good.stdout);
    let bad = Command::new(nasos_tests::target_release().join("nasos"))
        .args(["bundle", "recipes/qemu-prod.toml", "--inspect"])
        .arg(&v2)
        .current_dir(repo())
        .output()
        .expect("nasos");
    let said = String::from_utf8_lossy(&bad.stdout);
    assert_eq!(bad.status.code(), Some(1), "{said}");
    assert!(
        said.contains("signature  BAD: the bundle is signed by key 916D609174D6BE94, which this box does not trust"),
        "{said}"
    );
}

fn boot_v1() {
    let link = Link { port: "roce0".into(), socket: dir().join("net.sock"), listen: true, more: Vec::new() };
    let mut vm = nasos_tests::boot(&dir(), &BUILT.with(|b| b.v1.join("disk.qcow2")), "upgrade", 2048, link, |_| {});
    vm.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("v1 ready");
    vm.wait_for_login(Duration::from_secs(60)).ok();
    let status = poll(&mut vm, "nasctl upgrade status", "blessed", Duration::from_secs(120));
    assert!(status.contains("0.1.0"), "{status}");
    assert!(status.lines().any(|l| l.starts_with("a ") && l.contains("running") && l.contains("blessed")), "{status}");
    assert!(status.lines().any(|l| l.starts_with("b ") && l.contains("no entry")), "{status}");
    ok(&mut vm, "zfs create tank/scratch/upgrade-marker && echo kept > /export/tank/scratch/upgrade-marker/file");
    VM.set(vm);
}

/// The tar bytes of a bundle's first two entries for `manifest` (signed with `sig`), followed by
/// the payload entries of `from` (which starts with a manifest and signature of its own).
fn craft(json: &[u8], sig: &str, from: &Path, payload_bytes: Option<u64>) -> Vec<u8> {
    let raw = reader::read_raw(std::fs::File::open(from).expect("bundle")).expect("raw");
    let skip = skip_of(&raw.manifest, &raw.signature);
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in [("manifest.json", json), ("manifest.json.minisig", sig.as_bytes())] {
        let mut h = tar::Header::new_ustar();
        h.set_path(name).expect("name");
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append(&h, data).expect("append");
    }
    let mut out = b.into_inner().expect("tar");
    // into_inner wrote the end-of-archive blocks: drop them, the payloads follow.
    out.truncate(skip_of(json, sig));
    let mut f = std::fs::File::open(from).expect("bundle");
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(skip as u64)).expect("seek");
    let mut rest = Vec::new();
    match payload_bytes {
        Some(n) => f.take(n).read_to_end(&mut rest),
        None => f.read_to_end(&mut rest),
    }
    .expect("read");
    out.extend(rest);
    out
}

fn skip_of(json: &[u8], sig: &str) -> usize {
    let pad = |n: usize| n.div_ceil(512) * 512;
    512 + pad(json.len()) + 512 + pad(sig.len())
}

fn sign(json: &[u8], secret: &minisign::SecretKey) -> String {
    minisign::sign(None, secret, std::io::Cursor::new(json), Some("crafted by the upgrade test"), None)
        .expect("sign")
        .to_string()
}

fn dev_key() -> minisign::SecretKey {
    let text = std::fs::read_to_string(repo().join("recipes/keys/nasos-dev.key")).expect("dev key");
    minisign::SecretKeyBox::from_string(&text).expect("box").into_unencrypted_secret_key().expect("unencrypted")
}

/// Writes the bad bundles; returns (file name, what the refusal must say, written before refused).
fn bad_set(v2: &Path, into: &Path) -> Vec<(&'static str, &'static str, bool)> {
    std::fs::create_dir_all(into).expect("dir");
    let raw = reader::read_raw(std::fs::File::open(v2).expect("v2")).expect("raw");
    let good = Manifest::parse(&raw.manifest).expect("manifest");
    let uki = good.payloads[0].size + 512;
    let with = |edit: &dyn Fn(&mut Manifest)| {
        let mut m = good.clone();
        edit(&mut m);
        m.to_json()
    };
    let dev = dev_key();
    let stranger = minisign::KeyPair::generate_unencrypted_keypair().expect("keygen").sk;
    let mut cases = Vec::new();
    let mut put = |name: &'static str, bytes: Vec<u8>, says: &'static str, writes: bool| {
        std::fs::write(into.join(name), bytes).expect("write");
        cases.push((name, says, writes));
    };
    // The manifest changed after it was signed (a later minimum version slipped in).
    let forged = with(&|m| m.min_version = "0.0.1".into());
    put("forged.nasos", craft(&forged, &raw.signature, v2, Some(uki)), "does not verify with key", false);
    let j = raw.manifest.clone();
    put("stranger.nasos", craft(&j, &sign(&j, &stranger), v2, Some(uki)), "which this box does not trust", false);
    let j = with(&|m| m.board = "ts-h1290fx".into());
    put(
        "board.nasos",
        craft(&j, &sign(&j, &dev), v2, Some(uki)),
        "the bundle is for board ts-h1290fx, this box is a qemu-q35",
        false,
    );
    let j = with(&|m| m.version = "0.0.9".into());
    put("older.nasos", craft(&j, &sign(&j, &dev), v2, Some(uki)), "older than the running 0.1.0", false);
    let j = with(&|m| {
        let big = 4u64 << 30;
        m.payloads[1].size = big;
        m.verity = m.verity.replace(&format!(":{}", good.hash_offset().expect("offset")), &format!(":{big}"));
    });
    put("oversized.nasos", craft(&j, &sign(&j, &dev), v2, Some(uki)), "but the inactive slot holds", false);
    // A damaged root payload: one flipped byte in the middle.
    let mut bytes = std::fs::read(v2).expect("v2");
    let root_at = skip_of(&raw.manifest, &raw.signature) as u64 + uki + 512;
    let mid = (root_at + good.payloads[1].size / 2) as usize;
    bytes[mid] ^= 0x20;
    put("flipped.nasos", bytes.clone(), "the root payload's sha256 is", true);
    bytes[mid] ^= 0x20;
    bytes.truncate(mid);
    put("truncated.nasos", bytes, "cut short", true);
    cases
}

/// What must not change when a bundle is refused: every ESP file, and the inactive slot when
/// the refusal came before writing.
fn esp_digest(vm: &mut Vm) -> String {
    ok(
        vm,
        "mkdir -p /tmp/esp && mount -o ro /dev/vda1 /tmp/esp && (cd /tmp/esp && find . -type f | sort | xargs sha256sum); umount /tmp/esp",
    )
}

fn bad_bundles() {
    let v2 = BUILT.with(|b| b.v2.clone());
    let files = dir().join("bad");
    let _ = std::fs::remove_dir_all(&files);
    let cases = bad_set(&v2, &files);
    // One stick holding them all, mounted by path (`usb:` takes a stick with one bundle).
    let stick = dir().join("bad-stick.img");
    let list: Vec<PathBuf> = cases.iter().map(|c| files.join(c.0)).collect();
    fat_with(&list, &stick);
    VM.with(|vm| {
        plug(vm, &stick);
        ok(vm, "mkdir -p /tmp/stick && mount -o ro -L NASOS-USB /tmp/stick");
        let esp_before = esp_digest(vm);
        let slot_before = ok(vm, "sha256sum /dev/vda3");
        // The cases refused before writing come first; one hash of the whole slot after the
        // last of them proves none wrote a byte.
        let before_writing = cases.iter().take_while(|c| !c.2).count();
        for (i, (name, says, writes)) in cases.iter().enumerate() {
            if i == before_writing {
                assert_eq!(
                    ok(vm, "sha256sum /dev/vda3"),
                    slot_before,
                    "a bundle refused before writing changed the slot"
                );
            }
            let (out, code) =
                vm.run(&format!("nasctl upgrade apply /tmp/stick/{name}"), Duration::from_secs(600)).expect("apply");
            assert_ne!(code, 0, "{name} was accepted:\n{out}");
            assert!(out.contains(says), "{name}: the refusal does not say `{says}`:\n{out}");
            assert!(
                out.contains(if *writes {
                    "the running version stays the one that boots"
                } else {
                    "nothing was written"
                }),
                "{name}:\n{out}"
            );
            assert_eq!(esp_digest(vm), esp_before, "{name} changed the ESP");
            let status = ok(vm, "nasctl upgrade status");
            assert!(status.contains("boots next: nasos-0.1.0.efi"), "{name}: {status}");
        }
        let hist = ok(vm, "nasctl upgrade status --json");
        assert!(hist.matches("\"refused\"").count() >= 5, "{hist}");
        ok(vm, "umount /tmp/stick");
        vm.unplug_usb().expect("unplug");
    });
}

/// A USB stick image holding one bundle, as an operator carries it.
fn bundle_stick(bundle: &Path, tag: &str) -> PathBuf {
    let stick = dir().join(format!("{tag}-stick.img"));
    nasos_qemu::usb_stick(bundle, &stick).expect("stick");
    stick
}

/// Plugs a stick into the box and waits until its filesystem is seen.
fn plug(vm: &mut Vm, stick: &Path) {
    vm.plug_usb(stick).expect("plug the stick");
    poll(vm, "blkid -L NASOS-USB || true", "/dev/", Duration::from_secs(60));
}

fn machine_id(vm: &mut Vm) -> String {
    ok(vm, "cat /etc/machine-id").trim().to_string()
}

fn fat_with(files: &[PathBuf], out: &Path) {
    let total: u64 = files.iter().map(|f| std::fs::metadata(f).expect("file").len()).sum();
    let _ = std::fs::remove_file(out);
    let kib = ((total >> 20) + (total >> 24) + 32) * 1024;
    let st = Command::new("mkfs.vfat")
        .args(["-C", "-n", "NASOS-USB"])
        .arg(out)
        .arg(kib.to_string())
        .output()
        .expect("mkfs.vfat");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    for f in files {
        let st = Command::new("mcopy").arg("-i").arg(out).arg(f).arg("::").output().expect("mcopy");
        assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    }
}

/// After a reboot into `version`: it runs, on `slot`, blessed; the pool and what was on it,
/// the identity and the exports are as before.
fn check_running(vm: &mut Vm, version: &str, slot: &str, machine_id: &str) {
    vm.expect_new_shell();
    vm.wait_for("nasinit: started", Duration::from_secs(300)).expect("the new version starts");
    vm.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("the new version is ready");
    vm.wait_for_login(Duration::from_secs(60)).ok();
    let s = ok(vm, "nasctl status");
    assert!(s.contains(&format!("qemu-dev {version} on nasos-dev")), "{s}");
    assert!(s.contains("last boot ended: clean reboot"), "{s}");
    // The bless service watches the new version once the box is ready, and blesses it only
    // after the recipe's time (qemu-dev: 15 s) ready and healthy.
    let log = poll(vm, "nasctl logs bless", "s ready and healthy", Duration::from_secs(120));
    assert!(log.contains("is on trial: blessed once the box has been ready and healthy for 15s in a row"), "{log}");
    let blessed = log.lines().find(|l| l.contains("blessed nasos-")).unwrap_or_else(|| panic!("{log}"));
    let waited: u64 = blessed
        .split(" after ")
        .nth(1)
        .and_then(|r| r.split('s').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no time in {blessed}"));
    assert!(waited >= 15, "blessed after {waited}s, before the recipe's 15s: {blessed}");
    let mine = |s: &str| {
        s.lines().any(|l| {
            l.starts_with(&format!("{slot} ")) && l.contains(version) && l.contains("running") && l.contains("blessed")
        })
    };
    let status = poll_until(vm, "nasctl upgrade status", mine, Duration::from_secs(120));
    assert!(mine(&status), "{version} is not running blessed on slot {slot}: {status}");
    assert_eq!(ok(vm, "cat /export/tank/scratch/upgrade-marker/file").trim(), "kept");
    assert_eq!(ok(vm, "cat /etc/machine-id").trim(), machine_id, "the identity changed");
    let storage = ok(vm, "nasctl logs storage");
    assert!(storage.contains("tank: imported from its bays"), "{storage}");
    let exports = poll(vm, "exportfs -v", "/export/tank/train", Duration::from_secs(60));
    assert!(exports.contains("/export/tank/train"), "{exports}");
}

fn v2_from_usb() {
    let stick = bundle_stick(&BUILT.with(|b| b.v2.clone()), "v2");
    VM.with(|vm| {
        let id = machine_id(vm);
        plug(vm, &stick);
        // The reference for the apply's write rate: the same bytes from the same stick, written
        // plainly to the same slot until durable.
        let dd = ok(vm, "mkdir -p /tmp/stick && mount -o ro -L NASOS-USB /tmp/stick && dd if=/tmp/stick/qemu-dev-0.2.0.nasos of=/dev/vda3 bs=4M conv=fsync 2>&1 | tail -1; umount /tmp/stick");
        let (out, code) = vm.run("nasctl upgrade apply usb:", Duration::from_secs(900)).expect("apply");
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("signed by key 916D609174D6BE94"), "{out}");
        assert!(out.contains("installed on slot b (entry nasos-0.2.0+2.efi"), "{out}");
        let rate = |text: &str, unit: &str| -> Option<f64> {
            let l = text.lines().rev().find(|l| l.contains(unit))?;
            let before = l[..l.find(unit)?].trim_end();
            before.rsplit([' ', '(']).next()?.parse::<f64>().ok()
        };
        let (plain, applied) = (rate(&dd, "MB/s").map(|r| r / 1.048576), rate(&out, "MiB/s); checking"));
        eprintln!("apply writes the slot at {applied:?} MiB/s; plain dd of the same bundle to the same slot {plain:?} MiB/s ({dd})");
        if let (Some(p), Some(a)) = (plain, applied) {
            eprintln!("apply / plain write: {:.2}x", a / p);
        }
        let status = ok(vm, "nasctl upgrade status");
        assert!(status.contains("boots next: nasos-0.2.0+2.efi"), "{status}");
        vm.unplug_usb().expect("unplug");
        // Through the firmware: systemd-boot's own LoaderEntryOneShot starts the downgrade here
        // (the fast reboot's choice of it is a host test, `kexec::target`); the reboot after
        // this one is a fast one.
        vm.send_line("nasctl reboot --firmware").expect("reboot");
        check_running(vm, "0.2.0", "b", &id);
    });
}

fn v3_from_file() {
    let stick = bundle_stick(&BUILT.with(|b| b.v3.clone()), "v3");
    VM.with(|vm| {
        let id = machine_id(vm);
        plug(vm, &stick);
        // As an operator copies it onto a dataset (over NFS, here from the stick).
        ok(vm, "mkdir -p /tmp/stick && mount -o ro -L NASOS-USB /tmp/stick && cp /tmp/stick/qemu-dev-0.3.0.nasos /export/tank/scratch/ && umount /tmp/stick");
        vm.unplug_usb().expect("unplug");
        let (out, code) = vm.run("nasctl upgrade apply /export/tank/scratch/qemu-dev-0.3.0.nasos", Duration::from_secs(900)).expect("apply");
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("removing the old entry nasos-0.1.0.efi"), "{out}");
        assert!(out.contains("installed on slot a"), "{out}");
        vm.send_line("nasctl reboot").expect("reboot");
        check_running(vm, "0.3.0", "a", &id);
        let hist = ok(vm, "nasctl upgrade status");
        for want in ["installed   0.2.0", "blessed     0.2.0", "installed   0.3.0", "blessed     0.3.0"] {
            assert!(hist.contains(want), "history lacks `{want}`: {hist}");
        }
    });
}

/// 0.4.0 never gets ready: each of its boots misses the deadline and reboots (a version on trial
/// always does, whatever the reboot-loop guard says), systemd-boot counts its tries down, and
/// then 0.3.0 boots again, says it was rolled back and why, and serves as before.
fn rollback() {
    let stick = bundle_stick(&BUILT.with(|b| b.broken.clone()), "v4");
    VM.with(|vm| {
        plug(vm, &stick);
        let (out, code) = vm.run("nasctl upgrade apply usb:", Duration::from_secs(900)).expect("apply");
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("installed on slot b (entry nasos-0.4.0+2.efi"), "{out}");
        vm.unplug_usb().expect("unplug");
        vm.send_line("nasctl reboot").expect("reboot");
        vm.expect_new_shell();
        for n in 1..=2 {
            vm.wait_for("nasinit: started", Duration::from_secs(300))
                .unwrap_or_else(|e| panic!("try {n} of 0.4.0: {e}"));
            let missed =
                vm.wait_for("nasinit: missed the boot deadline (30s)", Duration::from_secs(300)).expect("the deadline");
            // Storage is what hangs; on a slow host the modules it waits for may still be
            // loading at the deadline and be listed first, so look for it anywhere in the list.
            let listed = missed.split("not ready: ").nth(1).unwrap_or_default();
            assert!(listed.split(", ").any(|s| s.starts_with("storage (")), "{missed}");
            let reboot = vm.wait_for("nasinit: rebooting", Duration::from_secs(60)).expect("a reboot");
            assert!(reboot.contains("is on trial: its boot tries, not the guard, end this"), "try {n}: {reboot}");
        }
        vm.wait_for("nasinit: started", Duration::from_secs(300)).expect("0.3.0 starts again");
        vm.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("0.3.0 is ready again");
        vm.wait_for_login(Duration::from_secs(60)).ok();
        let s = ok(vm, "nasctl status");
        assert!(s.contains("qemu-dev 0.3.0 on nasos-dev"), "{s}");
        let status = poll(vm, "nasctl upgrade status", "rolled-back", Duration::from_secs(120));
        assert!(status.contains("0.4.0 used up its 2 boot tries without becoming ready"), "{status}");
        assert!(
            status.lines().any(|l| l.starts_with("b ") && l.contains("0.4.0") && l.contains("out of tries")),
            "{status}"
        );
        assert!(status.contains("boots next: nasos-0.3.0.efi"), "{status}");
        assert_eq!(ok(vm, "cat /export/tank/scratch/upgrade-marker/file").trim(), "kept");
    });
}

/// Back from 0.3.0 to 0.2.0: refused without `--allow-downgrade`; with it, 0.2.0 goes onto the
/// other slot with one try and boots once through systemd-boot's one-shot variable (the newest
/// good entry, 0.3.0, would boot otherwise), is blessed after its healthy time, and the newer
/// entry is then removed, so the next reboot starts 0.2.0 again.
fn downgrade() {
    let stick = bundle_stick(&BUILT.with(|b| b.v2.clone()), "v2");
    VM.with(|vm| {
        let id = machine_id(vm);
        plug(vm, &stick);
        let (out, code) = vm.run("nasctl upgrade apply usb:", Duration::from_secs(600)).expect("apply");
        assert_ne!(code, 0, "{out}");
        assert!(out.contains("older than the running 0.3.0; add --allow-downgrade"), "{out}");
        let (out, code) =
            vm.run("nasctl upgrade apply usb: --allow-downgrade", Duration::from_secs(900)).expect("apply");
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains("installed on slot b (entry nasos-0.2.0+1.efi): a downgrade, it boots once next"),
            "{out}"
        );
        let status = ok(vm, "nasctl upgrade status");
        assert!(status.contains("boots next: nasos-0.2.0+1.efi"), "{status}");
        vm.unplug_usb().expect("unplug");
        vm.send_line("nasctl reboot").expect("reboot");
        check_running(vm, "0.2.0", "b", &id);
        let log = ok(vm, "nasctl logs bless");
        assert!(log.contains("a downgrade: the newer nasos-0.3.0.efi removed"), "{log}");
        let status = ok(vm, "nasctl upgrade status");
        assert!(status.contains("boots next: nasos-0.2.0.efi"), "{status}");
        assert!(status.lines().any(|l| l.starts_with("a ") && l.contains("no entry")), "{status}");
        // And it stays: the next boot is 0.2.0 again, by systemd-boot's own choice.
        vm.send_line("nasctl reboot").expect("reboot");
        vm.expect_new_shell();
        vm.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("ready again");
        vm.wait_for_login(Duration::from_secs(60)).ok();
        let s = ok(vm, "nasctl status");
        assert!(s.contains("qemu-dev 0.2.0 on nasos-dev"), "{s}");
    });
}
