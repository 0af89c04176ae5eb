//! The bootable appliance, end to end, one check per capability over one built image: build it
//! (and the product image); a no-op rebuild does no stage work, and a byte changed in a cached
//! output is noticed and rebuilt into the same image, bit for bit; boot it through OVMF and
//! systemd-boot to nasinit's ready line, inspect it with nasctl, power it off; a bay holding a
//! foreign filesystem is refused untouched; a tampered root is refused; an export change redoes
//! only the stages after the plan.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nasos_qemu::{Link, Vm};
use nasos_tests::suite::{Shared, Suite};
use nasos_tests::{build_binaries, nasos, ok, overlay, poll_until, repo, sha256};

/// The built qemu-dev image's output directory.
static IMAGE: Shared<PathBuf> = Shared::new("build::qemu_dev_image");
/// The booted appliance.
static DEV: Shared<Vm> = Shared::new("boot::reaches_ready_through_the_verified_root");

fn dir() -> PathBuf {
    repo().join("build/e2e")
}

fn boot(disk: &Path, tag: &str) -> Vm {
    boot_with(disk, tag, |_| {})
}

/// Boots the built disk with fresh bays that `prepare` may seed.
fn boot_with(disk: &Path, tag: &str, prepare: impl FnOnce(&Path)) -> Vm {
    let net = dir().join(format!("net-{tag}.sock"));
    let link = Link { port: "roce0".into(), socket: net, listen: true, more: Vec::new() };
    nasos_tests::boot(&dir(), disk, tag, 2048, link, prepare)
}

fn status_json(vm: &mut Vm) -> serde_json::Value {
    json(&ok(vm, "nasctl status --json"))
}

/// The JSON object a command printed (after anything the console added before it).
fn json(out: &str) -> serde_json::Value {
    nasos_tests::console_json(out)
}

pub fn suite() -> Suite {
    let mut s = Suite::new("appliance");
    s.check("build::qemu_dev_image", build_image);
    s.check("build::the_boot_chain_is_the_locked_systemd_boot", boot_chain_from_lock);
    s.check("build::noop_rebuild_does_no_stage_work", noop_rebuild);
    s.check("build::a_changed_cache_is_rebuilt_bit_identically", changed_cache);
    s.check("build::a_normal_user_builds_the_same_image_without_root", rootless_build);
    s.check("boot::reaches_ready_through_the_verified_root", boot_ready);
    s.check("boot::nasctl_reports_a_ready_appliance", nasctl_reports);
    s.check("boot::services_say_what_the_twin_board_cannot_apply", services_say);
    s.check("boot::nfs_starts_over_a_server_a_failed_start_left", nfs_after_a_half_start);
    s.check("boot::a_reboot_skips_the_firmware", fast_reboot);
    s.check("liveness::the_watchdog_resets_a_frozen_pid1", watchdog_resets_a_frozen_pid1);
    s.check("liveness::a_kernel_panic_is_recorded_from_pstore", kernel_panic);
    s.check("liveness::a_stuck_shutdown_ends_in_a_watchdog_reset", stuck_shutdown);
    s.check("liveness::a_fatal_condition_past_its_grace_ends_in_a_watchdog_reset", fatal_condition);
    s.check("boot::poweroff_ends_qemu_cleanly", poweroff);
    s.check("storage::a_foreign_bay_is_refused_and_left_untouched", foreign_bay);
    s.check("state::a_state_partition_holding_something_else_is_refused", foreign_state);
    s.check("boot::a_tampered_root_is_refused", tampered_root);
    s.check("build::product_image", product_image);
    s.check("build::an_export_change_redoes_only_later_stages", export_change);
    s.kill_at_end(&DEV);
    s
}

fn build_image() {
    build_binaries();
    std::fs::create_dir_all(dir()).expect("e2e dir");
    let out = dir().join("qemu-dev");
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
    IMAGE.set(out);
}

/// The ESP's systemd-boot and the UKI's stub are the ones in the lock's systemd-boot-efi .deb
/// (trixie's), not the build host's: the loader is byte-identical to the .deb's file, and the
/// UKI carries the stub's version stamp. The lock itself takes trixie's security archive.
fn boot_chain_from_lock() {
    let out = IMAGE.get();
    let lock: toml::Value =
        toml::from_str(&std::fs::read_to_string(repo().join("recipes/qemu-dev.toml.lock")).expect("lock"))
            .expect("toml");
    let packages = lock["package"].as_array().expect("packages");
    assert!(
        packages.iter().any(|p| p["suite"].as_str() == Some("trixie-security")),
        "the lock has no package from trixie-security"
    );
    let efi =
        packages.iter().find(|p| p["name"].as_str() == Some("systemd-boot-efi")).expect("systemd-boot-efi locked");
    let sha = efi["sha256"].as_str().expect("sha256");
    let deb = nasos_tests::nasos_cache().join("debs").join(format!("{sha}.deb"));
    assert_eq!(sha256(&deb), sha, "the cached .deb is the locked one");
    let from_deb = |file: &str| -> Vec<u8> {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!("dpkg-deb --fsys-tarfile '{}' | tar -xOf - ./usr/lib/systemd/boot/efi/{file}", deb.display()))
            .output()
            .expect("dpkg-deb");
        assert!(o.status.success() && !o.stdout.is_empty(), "{file} in {}", deb.display());
        o.stdout
    };
    let boot = from_deb("systemd-bootx64.efi");
    let esp = format!("{}@@1048576", out.join("disk.img").display());
    for on_esp in ["::EFI/BOOT/BOOTX64.EFI", "::EFI/systemd/systemd-bootx64.efi"] {
        let o = Command::new("mcopy").args(["-n", "-i", &esp, on_esp, "-"]).output().expect("mcopy");
        assert!(o.status.success(), "{on_esp}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(o.stdout == boot, "{on_esp} is not the locked systemd-boot");
    }
    // The stub's version stamp (`#### LoaderInfo: systemd-stub 257.x ####`), found in the UKI.
    let stamp = |bytes: &[u8]| -> String {
        let at = bytes.windows(16).position(|w| w == b"#### LoaderInfo:").expect("a LoaderInfo stamp");
        let end = bytes[at + 16..].windows(4).position(|w| w == b"####").expect("its end") + at + 20;
        String::from_utf8_lossy(&bytes[at..end]).into_owned()
    };
    let stub = stamp(&from_deb("linuxx64.efi.stub"));
    assert!(stub.contains("systemd-stub"), "{stub}");
    assert_eq!(stamp(&std::fs::read(out.join("nasos.efi")).expect("uki")), stub);
    eprintln!("ESP loader = systemd-boot-efi {} ({}), UKI stub: {stub}", efi["version"], efi["suite"]);
}

fn noop_rebuild() {
    let out_s = IMAGE.get().display().to_string();
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
}

/// Cached outputs are checked before they are trusted: a byte flipped in the build's verified
/// root is noticed and the root rebuilt, and what comes out is the same image, bit for bit. (A
/// byte flipped in a cached rootfs tarball is the rootless check's: its user starts from such a
/// cache, so the tarball is rebuilt there anyway.)
fn changed_cache() {
    let out = IMAGE.get();
    let before = sha256(&out.join("disk.img"));
    let root_img = out.join("root.img");
    flip_a_byte(&root_img);
    let rebuilt = nasos(&["build", "recipes/qemu-dev.toml", "--out", &out.display().to_string()]);
    eprintln!("rebuild after the change: {:.1}s", rebuilt.took.as_secs_f64());
    assert!(noticed(&rebuilt.stderr, "root", &root_img), "root not noticed:\n{}", rebuilt.stderr);
    assert_eq!(before, sha256(&out.join("disk.img")), "the rebuilt image differs from the first build");
}

/// Whether a build said it found `file`, an output of `stage`, changed since it was made.
fn noticed(stderr: &str, stage: &str, file: &Path) -> bool {
    stderr.contains(&format!(
        "nasos: {stage:<10} cached output {} does not match the sha256 recorded when it was made",
        file.display()
    ))
}

/// The cached rootfs tarballs of qemu-dev's lock, under every name: the tarball that resolved a
/// lock answers to two keys when that build wrote the lock (one file, two hard links), and a
/// build from the lock looks up the second, so each name's copy must be the one changed.
fn cached_rootfs_of_the_lock(cache: &Path) -> Vec<PathBuf> {
    // The image's packages of the lock (a cached tarball's record lists those, not the ZFS build
    // root's).
    let packages = |text: &str| toml::from_str::<toml::Value>(text).ok().and_then(|v| v.get("package").cloned());
    let lock = packages(&std::fs::read_to_string(repo().join("recipes/qemu-dev.toml.lock")).expect("lock"));
    assert!(lock.is_some(), "qemu-dev's lock lists no packages");
    let mut tars: Vec<PathBuf> = Vec::new();
    for e in std::fs::read_dir(cache.join("rootfs")).expect("the rootfs cache").flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "lock")
            && std::fs::read_to_string(&p).is_ok_and(|t| packages(&t) == lock)
            && p.with_extension("tar").exists()
        {
            tars.push(p.with_extension("tar"));
        }
    }
    assert!(!tars.is_empty(), "no cached rootfs of qemu-dev's lock");
    tars
}

/// A user that is not root builds the same image, bit for bit: mmdebstrap in its unshare mode,
/// the root tree unpacked, indexed and packed inside a user namespace. The user starts from a
/// cache holding only the downloaded packages and the ZFS module (compiling ZFS again would
/// double the suite), so its rootfs, root, UKI and disk stages all run, and its disk must be
/// root's, byte for byte; the user then boots it with `nasos qemu` to ready. A user without
/// subordinate ids is told in one line what to change, and nothing is written.
fn rootless_build() {
    if nix::unistd::geteuid().as_raw() != 0 {
        eprintln!("the suite runs as uid {}: every build above was made without root", nix::unistd::geteuid());
        return;
    }
    let image = IMAGE.get();
    let builder = test_user("nasos-build-test", Some(2_000_000_000));
    let stranger = test_user("nasos-no-subids", None);
    // Everything the user reads is copied where it may: the checkout may sit in root's home.
    let work = std::env::temp_dir().join("nasos-rootless");
    let _ = Command::new("rm").arg("-rf").arg(&work).status();
    let bin = work.join("bin");
    let cache = work.join("cache");
    for d in [&work, &bin, &cache, &cache.join("debs"), &cache.join("zfs")] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    for e in std::fs::read_dir(nasos_tests::target_release()).expect("target").flatten() {
        use std::os::unix::fs::PermissionsExt;
        let m = e.metadata().expect("stat");
        if m.is_file() && m.permissions().mode() & 0o111 != 0 && !e.file_name().to_string_lossy().contains('.') {
            std::fs::copy(e.path(), bin.join(e.file_name())).expect("copy binary");
        }
    }
    let copied = Command::new("cp").arg("-a").arg(repo().join("recipes")).arg(&work).status().expect("cp");
    assert!(copied.success());
    // The packages (read only: hard links, still root's) and the built ZFS module.
    let root_cache = nasos_tests::nasos_cache();
    for e in std::fs::read_dir(root_cache.join("debs")).expect("debs").flatten() {
        std::fs::hard_link(e.path(), cache.join("debs").join(e.file_name())).expect("link deb");
    }
    for e in std::fs::read_dir(root_cache.join("zfs")).expect("zfs").flatten().filter(|e| e.path().is_dir()) {
        if e.path().extension().is_some_and(|x| x == "tmp") {
            continue;
        }
        let d = cache.join("zfs").join(e.file_name());
        std::fs::create_dir_all(&d).expect("mkdir");
        for f in std::fs::read_dir(e.path()).expect("zfs dir").flatten() {
            std::fs::copy(f.path(), d.join(f.file_name())).expect("copy module");
        }
    }
    // And root's rootfs tarball of this lock, with its record, a byte changed: the user's build
    // must notice and make it again (in mmdebstrap's unshare mode).
    std::fs::create_dir_all(cache.join("rootfs")).expect("mkdir");
    let mut tampered = Vec::new();
    for tar in cached_rootfs_of_the_lock(&root_cache) {
        let name = tar.file_name().expect("name").to_string_lossy().into_owned();
        let stem = name.trim_end_matches(".tar");
        for e in std::fs::read_dir(root_cache.join("rootfs")).expect("rootfs").flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with(&format!("{stem}."))
                && (n.ends_with(".tar") || n.ends_with(".lock") || n.ends_with(".record"))
            {
                std::fs::copy(e.path(), cache.join("rootfs").join(&n)).expect("copy the cached rootfs");
            }
        }
        flip_a_byte(&cache.join("rootfs").join(&name));
        tampered.push(cache.join("rootfs").join(&name));
    }
    let own = Command::new("chown")
        .arg("-R")
        .arg(format!("{0}:{0}", builder.0))
        .args([&bin, &cache.join("zfs"), &cache.join("rootfs")])
        .status();
    assert!(own.expect("chown").success());
    for d in [&work, &work.join("recipes"), &cache, &cache.join("debs")] {
        std::os::unix::fs::chown(d, Some(builder.0), Some(builder.1)).expect("chown");
    }
    // nasos as that user, in the work folder, with nothing of root's environment.
    let nasos_as = |uid: (u32, u32)| {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new(bin.join("nasos"));
        c.current_dir(&work)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .env("HOME", &work)
            .env("NASOS_CACHE", &cache)
            .uid(uid.0)
            .gid(uid.1);
        c
    };
    let build_as = |uid: (u32, u32), out: &Path| {
        let t = Instant::now();
        let o = nasos_as(uid)
            .args(["build", "recipes/qemu-dev.toml", "--out"])
            .arg(out)
            .output()
            .expect("run nasos as a user");
        (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned(), t.elapsed())
    };

    let refused_out = work.join("refused");
    let (ok, err, _) = build_as(stranger, &refused_out);
    assert!(!ok, "built without subordinate ids:\n{err}");
    let said =
        err.lines().find(|l| l.contains("user namespace")).unwrap_or_else(|| panic!("no one-line reason:\n{err}"));
    assert!(said.contains("usermod --add-subuids") && said.contains("nasos-no-subids"), "{said}");
    assert!(!refused_out.join("disk.img").exists(), "a disk was written");

    // Where `nasos qemu` looks for it, so the boot below finds it built.
    let out = work.join("build/qemu-dev");
    let (ok, err, took) = build_as(builder, &out);
    assert!(ok, "the build as a normal user failed:\n{err}");
    for stage in ["rootfs", "root", "uki", "disk"] {
        assert!(!err.contains(&format!("nasos: {stage:<10} up to date")), "{stage} was not built:\n{err}");
    }
    assert!(tampered.iter().any(|t| noticed(&err, "rootfs", t)), "the changed rootfs tarball was not noticed:\n{err}");
    // (The rootfs tarballs themselves differ, as two of root's do: package scripts write random
    // host ids, which the root stage removes.)
    assert_eq!(sha256(&out.join("disk.img")), sha256(&image.join("disk.img")), "the user's image differs from root's");
    eprintln!("build as nasos-build-test (uid {}), no root: {:.1}s, the same disk.img", builder.0, took.as_secs_f64());

    // And the same user boots it: `nasos qemu` (TCG, OVMF, blank bays in its own folder) needs no
    // root either.
    let (sock, qmp) = (work.join("console.sock"), work.join("qmp.sock"));
    let log = std::fs::File::create(work.join("nasos-qemu.log")).expect("log");
    let t = Instant::now();
    let qemu = nasos_as(builder)
        .args(["qemu", "recipes/qemu-dev.toml", "--headless", "--cpus", "2", "--serial"])
        .arg(&sock)
        .arg("--qmp")
        .arg(&qmp)
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("nasos qemu as a user");
    let mut vm = Vm::attach(&sock, &work.join("console.log"), Some(qmp), Some(qemu), Duration::from_secs(300))
        .unwrap_or_else(|e| {
            panic!("{e:#}: {}", std::fs::read_to_string(work.join("nasos-qemu.log")).unwrap_or_default())
        });
    vm.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("the user's VM reaches ready");
    eprintln!("nasos qemu as nasos-build-test: ready {:.1}s after the command", t.elapsed().as_secs_f64());
    let log = std::fs::read_to_string(work.join("nasos-qemu.log")).unwrap_or_default();
    assert!(log.contains("nasos: disk       up to date"), "nasos qemu built again what the user had built:\n{log}");
    let _ = vm.qmp("quit", serde_json::json!({}));
    assert!(vm.wait_exit(Duration::from_secs(60)).is_ok(), "nasos qemu did not end with its VM");
    vm.kill();
    let _ = Command::new("rm").arg("-rf").arg(&work).status();
}

/// A user for the rootless check (made once): its uid and gid. With `subids`, it has 65536
/// subordinate uids and gids from there (mmdebstrap's unshare mode needs a full range).
fn test_user(name: &str, subids: Option<u32>) -> (u32, u32) {
    let exists = |n: &str| nix::unistd::User::from_name(n).ok().flatten();
    if exists(name).is_none() {
        let st = Command::new("useradd")
            .args([
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                "-K",
                "SUB_UID_COUNT=0",
                "-K",
                "SUB_GID_COUNT=0",
            ])
            .arg(name)
            .status()
            .expect("useradd");
        assert!(st.success(), "useradd {name}");
    }
    let listed = |file: &str| {
        std::fs::read_to_string(file).unwrap_or_default().lines().any(|l| l.starts_with(&format!("{name}:")))
    };
    if let Some(first) = subids
        && !(listed("/etc/subuid") && listed("/etc/subgid"))
    {
        let range = format!("{first}-{}", first + 65535);
        let st = Command::new("usermod")
            .args(["--add-subuids", &range, "--add-subgids", &range, name])
            .status()
            .expect("usermod");
        assert!(st.success(), "usermod --add-subuids {range} {name}");
    }
    let u = exists(name).expect("the user exists");
    (u.uid.as_raw(), u.gid.as_raw())
}

/// Flips one byte in the middle of a file, in place (its size and name unchanged).
fn flip_a_byte(path: &Path) {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(path).expect("open");
    let at = f.metadata().expect("size").len() / 2;
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(at)).and_then(|_| f.read_exact(&mut b)).expect("read");
    b[0] ^= 0x20;
    f.seek(SeekFrom::Start(at)).and_then(|_| f.write_all(&b)).expect("write");
}

fn boot_ready() {
    let mut vm = boot(&IMAGE.get().join("disk.qcow2"), "dev");
    let t0 = Instant::now();
    let started = vm.wait_for("nasinit: started", Duration::from_secs(240)).expect("nasinit starts");
    // The image ships its state partition blank: the first boot makes its filesystem.
    let made = vm.wait_for("nasinit: state partition ", Duration::from_secs(60)).expect("the state partition");
    assert!(made.contains("is blank: making its filesystem (first boot)"), "{made}");
    let state = vm.wait_for("nasinit: state on ", Duration::from_secs(60)).expect("the state partition mounted");
    assert!(state.ends_with(", boot 1 (first boot)"), "{state}");
    let ready = vm.wait_for("nasinit: ready in ", Duration::from_secs(400)).expect("the appliance becomes ready");
    eprintln!("{started}\n{ready}\n(wall clock from QEMU start: {:.1}s)", t0.elapsed().as_secs_f64());
    let secs: f64 =
        ready.rsplit("ready in ").next().and_then(|s| s.trim().trim_end_matches('s').parse().ok()).expect("seconds");
    assert!(secs > 0.0);
    vm.wait_for_login(Duration::from_secs(60)).ok();
    DEV.set(vm);
}

fn nasctl_reports() {
    DEV.with(|vm| {
        let status = status_json(vm);
        assert_eq!(status["state"], "ready", "{status}");
        assert_eq!(status["image"], "qemu-dev");
        assert_eq!(status["pid1"], true);
        assert_eq!(status["services_failed"], 0);
        assert_eq!(status["services_ready"], status["services"]);
        eprintln!("{}", ok(vm, "nasctl timeline"));
        // The factory image is blessed already: the bless service finds so and is done.
        let bless_done = |s: &str| s.lines().any(|l| l.starts_with("bless") && l.contains("done"));
        let services = poll_until(vm, "nasctl services", bless_done, Duration::from_secs(30));
        assert!(bless_done(&services), "{services}");
        // ZFS's udev rules that ran a program for every drive and partition are masked (they
        // held up the naming of the bays at boot); udev still names the bays.
        let rules =
            ok(vm, "udevadm test /sys/class/block/$(basename $(readlink -f /dev/disk/by-bay/BAY01-part1)) 2>&1");
        assert!(rules.contains("disk/by-bay/BAY01-part1"), "{rules}");
        assert!(!rules.contains("vdev_id") && !rules.contains("modprobe zfs"), "{rules}");
        // While the pool was made and imported, udev skipped blkid's probe of the drives (the
        // import waits for udev to finish each member): the disk has no partition table in
        // udev's database. Once the box served, drive-ids replayed the members' partitions, which
        // now carry the vdev GUID zed matches a pulled drive by; and drives get the full rules
        // from the import on.
        let disk = ok(vm, "udevadm info /dev/disk/by-bay/BAY01");
        assert!(disk.contains("disk/by-id/nvme-") && !disk.contains("ID_PART_TABLE_TYPE="), "{disk}");
        let guid = ok(vm, "zdb -l /dev/disk/by-bay/BAY01-part1 | awk '/^    guid:/ {print $2; exit}'");
        let part = ok(vm, "udevadm info /dev/disk/by-bay/BAY01-part1");
        assert!(!guid.trim().is_empty(), "no vdev GUID in BAY01's label");
        assert!(part.contains(&format!("ID_FS_UUID_SUB={}", guid.trim())), "{part}");
        assert!(rules.contains("ID_FS_TYPE=zfs_member"), "{rules}");
        // nfs-common's readahead program for NFS client mounts no longer runs for every disk.
        let bdi = ok(
            vm,
            "udevadm test /sys/class/bdi/$(cat /sys/class/block/$(basename $(readlink -f /dev/disk/by-bay/BAY01))/dev) 2>&1",
        );
        assert!(bdi.contains("Properties:") && !bdi.contains("nfsrahead"), "{bdi}");
        // udev never renames a link fabric named, however late it handles the NIC's add event
        // (it renamed data0 to enp0s14 while up, and RDMA lost its device).
        ok(vm, "udevadm trigger --action=add /sys/class/net/data0 && udevadm settle");
        let link = ok(vm, "ip -br link show data0 && rdma link show");
        assert!(link.contains("data0") && link.contains("rxe_data0"), "{link}");
        // Service niceness counts: nasinit turned off the kernel's per-session CPU sharing.
        assert_eq!(ok(vm, "cat /proc/sys/kernel/sched_autogroup_enabled").trim(), "0");
    });
}

/// A start of the nfs service that failed half-way (a listener nfsd could not bind) leaves an
/// nfsd server with listeners and no threads, on which the kernel refuses the grace time
/// (EBUSY): the next start clears it instead of failing on it until its restarts are used up.
fn nfs_after_a_half_start() {
    DEV.with(|vm| {
        ok(vm, "nasctl stop nfs && nfsdctl listener +tcp:10.77.0.1:2049");
        let left = ok(vm, "cat /proc/fs/nfsd/threads /proc/fs/nfsd/portlist");
        assert_eq!(left.split_whitespace().collect::<Vec<_>>(), ["0", "tcp", "2049"], "{left}");
        ok(vm, "nasctl start nfs");
        let serving = |s: &str| s.lines().any(|l| l.starts_with("nfs ") && l.contains("running"));
        let services = poll_until(vm, "nasctl services", serving, Duration::from_secs(60));
        assert!(serving(&services), "{services}");
        let log = ok(vm, "nasctl logs nfs | tail -n 5");
        assert!(log.contains("nfsd has a server with no threads, left by a start that failed: clearing it"), "{log}");
        assert!(log.contains("nfsd listening: rdma 10.77.0.1:20049, tcp 10.77.0.1:2049"), "{log}");
    });
}

/// What QEMU's twin cannot do is said, not pretended: virtio reports no link speed, the board
/// has no DCB on its ports, no CPU sensor or EDAC, drives that report no spare; every bay's
/// SMART log is read (its temperature among it).
fn services_say() {
    DEV.with(|vm| {
        let fabric = ok(vm, "nasctl logs fabric");
        assert!(fabric.contains("data0: the NIC reports no negotiated speed (expected"), "{fabric}");
        assert!(fabric.contains("data0: PFC/ETS/DSCP not applied: the board says this port has no DCB"), "{fabric}");
        let health = ok(vm, "nasctl logs health");
        for said in [
            "not checked: link data0 speed: the NIC reports none",
            "not checked: CPU temperature: no k10temp sensor on this machine",
            "not checked: memory ECC: no EDAC memory controller on this machine",
        ] {
            assert!(health.contains(said), "{health}");
        }
        let report = json(&ok(vm, "nasctl health --json"));
        let bays = report["report"]["observation"]["bays"].as_array().expect("bays").clone();
        assert_eq!(bays.len(), 12, "{report}");
        for b in &bays {
            let kelvin = b["smart"]["Ok"]["temperature_kelvin"].as_u64().unwrap_or(0);
            assert!(kelvin > 273, "{}: no SMART temperature: {b}", b["bay"]);
        }
    });
}

/// `nasctl reboot` starts the next boot's kernel directly (kexec): the new kernel is told which
/// entry it came from, and the box comes back as from any clean reboot. (`--firmware` is the
/// data-path suite's reboot; reboots nasinit decides on are the upgrade suite's rollback.)
fn fast_reboot() {
    DEV.with(|vm| {
        let boot_before = status_json(vm)["boot"].as_u64().expect("boot");
        vm.send_line("nasctl reboot").expect("reboot");
        let said = vm.wait_for("reboot: ", Duration::from_secs(120)).expect("nasctl says which reboot");
        assert!(said.contains("reboot: fast (kexec) into nasos 0.1.0 (nasos-0.1.0.efi)"), "{said}");
        let t = Instant::now();
        vm.expect_new_shell();
        // The watchdog keeps running into the next kernel (a hang there ends in a reset), and
        // that kernel's nasinit arms it again.
        let handed = vm.wait_for("nasinit: watchdog ", Duration::from_secs(120)).expect("the watchdog is handed over");
        assert!(
            handed.contains("watchdog left running for the next kernel") && handed.contains("within 120s"),
            "{handed}"
        );
        let kexec = vm.wait_for("nasinit: reboot: ", Duration::from_secs(120)).expect("nasinit reboots");
        assert!(kexec.contains("starting the loaded kernel (kexec)"), "{kexec}");
        vm.wait_for("nasinit: started", Duration::from_secs(300)).expect("nasinit starts again");
        vm.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("ready again");
        eprintln!("reboot to ready, fast (kexec): {:.1}s", t.elapsed().as_secs_f64());
        vm.wait_for_login(Duration::from_secs(60)).ok();
        let st = status_json(vm);
        assert_eq!(st["boot"].as_u64(), Some(boot_before + 1), "{st}");
        assert_eq!(st["last_boot"], "clean reboot", "{st}");
        let cmdline = ok(vm, "cat /proc/cmdline");
        assert!(cmdline.contains("nasos.kexec-entry=nasos-0.1.0.efi"), "{cmdline}");
        let armed = ok(vm, "dmesg | grep 'nasinit: watchdog' || true");
        assert!(armed.contains("armed, timeout 30s, fed by nasinit"), "{armed}");
        // What made the handover possible: the watchdog core does not stop the timer on a reboot.
        let stop = ok(vm, "cat /sys/module/watchdog/parameters/stop_on_reboot");
        assert_eq!(stop.trim(), "0", "{stop}");
        // The modules are stored uncompressed (EROFS compresses them already).
        let zfs = ok(vm, "modinfo -n zfs");
        assert!(zfs.trim().ends_with("/zfs.ko"), "{zfs}");
    });
}

/// PID 1 owns the hardware watchdog: when its loop stops (a development-only fault injection),
/// the watchdog resets the VM, and the next boot knows why the last one ended.
fn watchdog_resets_a_frozen_pid1() {
    DEV.with(|vm| {
        let armed = ok(vm, "dmesg | grep 'nasinit: watchdog' || true");
        assert!(armed.contains("armed, timeout 30s, fed by nasinit"), "{armed}");
        let boot_before = status_json(vm)["boot"].as_u64().expect("boot");
        let events = vm.qmp_events().expect("QMP");
        vm.send_line("nasctl debug freeze").expect("freeze");
        vm.expect_new_shell();
        watchdog_reset_and_back(vm, events, "the freeze", "hardware watchdog reset");
        let status = status_json(vm);
        assert_eq!(status["last_boot"], "hardware watchdog reset", "{status}");
        assert_eq!(status["boot"].as_u64(), Some(boot_before + 1), "{status}");
    });
}

/// A kernel panic leaves its log in pstore (EFI variables under OVMF); the boot after the
/// reboot (panic=10) says the last one ended in a panic and keeps the log.
fn kernel_panic() {
    DEV.with(|vm| {
        vm.send_line("echo 1 > /proc/sys/kernel/sysrq; echo c > /proc/sysrq-trigger").expect("panic");
        vm.expect_new_shell();
        vm.wait_for("Kernel panic", Duration::from_secs(60)).expect("the kernel panics");
        vm.wait_for("nasinit: started", Duration::from_secs(300)).expect("the next boot");
        let said = vm.wait_for("nasinit: state on ", Duration::from_secs(60)).expect("the state partition");
        assert!(said.contains("the last boot ended: kernel panic"), "{said}");
        vm.wait_for("nasinit: ready in ", Duration::from_secs(400)).expect("ready again");
        vm.wait_for_login(Duration::from_secs(60)).ok();
        let kept = ok(vm, "cat /var/lib/nasos/boots/*/pstore/* 2>/dev/null | grep -c 'sysrq' || true");
        assert!(kept.trim().parse::<u32>().unwrap_or(0) > 0, "the panic's log was not kept: {kept}");
    });
}

/// A shutdown that hangs after the services stopped (a development-only fault: the sync never
/// returns, as on a wedged device) ends in a reset within the watchdog's timeout, because PID 1
/// feeds it once as the shutdown begins and disarms it only after the sync.
fn stuck_shutdown() {
    DEV.with(|vm| {
        let events = vm.qmp_events().expect("QMP");
        vm.send_line("nasctl debug hang-shutdown").expect("hang");
        vm.expect_new_shell();
        vm.wait_for("nasinit: debug hang-shutdown: this shutdown hangs now", Duration::from_secs(120))
            .expect("the shutdown hangs");
        let after = watchdog_reset_and_back(vm, events, "the shutdown hung", "hardware watchdog reset");
        assert!(after < 45.0, "the stuck shutdown lasted {after:.1}s, past the 30 s watchdog");
    });
}

/// nfsd stopped and made unable to start (its programs bind-mounted over by /bin/false): the nfs
/// service uses up its restarts, health reports NFS serving nothing as fatal, and once that
/// outlasts qemu-dev's 20 s grace nasinit stops feeding the watchdog. The next boot says why,
/// and health's history (on the state partition) has the alert that announced the reset.
fn fatal_condition() {
    DEV.with(|vm| {
        // Both ways the nfs service starts nfsd: nfsdctl (bound to the data addresses) and
        // rpc.nfsd (everywhere, when no data link has an address).
        ok(vm, "rpc.nfsd 0 && mount --bind /bin/false /usr/sbin/nfsdctl && mount --bind /bin/false /usr/sbin/rpc.nfsd");
        let events = vm.qmp_events().expect("QMP");
        vm.send_line("nasctl restart nfs").expect("restart nfs");
        let t = Instant::now();
        vm.wait_for("health: CRITICAL service nfs: failed", Duration::from_secs(120))
            .expect("nfs uses up its restarts");
        eprintln!("nfs failed {:.1}s after the restart", t.elapsed().as_secs_f64());
        let said = vm
            .wait_for("no longer feeding the watchdog", Duration::from_secs(90))
            .expect("nasinit stops feeding the watchdog");
        assert!(said.contains("nasinit: health: NFS serves nothing"), "{said}");
        eprintln!("watchdog starved {:.1}s after the restart", t.elapsed().as_secs_f64());
        vm.expect_new_shell();
        let after = watchdog_reset_and_back(
            vm,
            events,
            "nfs was restarted into a failure",
            "reset by the watchdog for a fatal condition health reported: NFS serves nothing",
        );
        eprintln!("the watchdog fired {after:.1}s after it was starved");
        let status = status_json(vm);
        assert!(
            status["last_boot"]
                .as_str()
                .is_some_and(|s| s.contains("fatal condition") && s.contains("NFS serves nothing")),
            "{status}"
        );
        let health = ok(vm, "nasctl health -n 50");
        assert!(health.contains("nasinit stops feeding the watchdog and the box resets"), "{health}");
        let exports = ok(vm, "cat /proc/fs/nfsd/portlist");
        assert!(exports.contains("tcp 2049"), "NFS is back after the reset: {exports}");
    });
}

/// Waits for QMP's WATCHDOG event (a reset), then for the next boot to say `why` and be ready;
/// returns the seconds from the call to the event.
fn watchdog_reset_and_back(vm: &mut Vm, mut events: nasos_qemu::QmpEvents, since: &str, why: &str) -> f64 {
    let t = Instant::now();
    let fired = events.wait("WATCHDOG", Duration::from_secs(240)).expect("the watchdog fires");
    let after = t.elapsed().as_secs_f64();
    eprintln!("watchdog fired {after:.1}s after {since}: {fired}");
    assert_eq!(fired["data"]["action"], "reset", "{fired}");
    drop(events);
    let said = vm.wait_for("nasinit: the last boot ended: ", Duration::from_secs(300)).expect("the next boot says why");
    assert!(said.contains(why), "{said}");
    vm.wait_for("nasinit: ready in ", Duration::from_secs(400)).expect("ready again");
    vm.wait_for_login(Duration::from_secs(60)).ok();
    after
}

fn poweroff() {
    let mut vm =
        DEV.take().expect("not run: the appliance did not boot (see boot::reaches_ready_through_the_verified_root)");
    vm.run("nasctl poweroff", Duration::from_secs(60)).ok();
    let st = vm.wait_exit(Duration::from_secs(180)).expect("QEMU exits after poweroff");
    assert!(st.success(), "QEMU exit status {st}");
}

fn foreign_bay() {
    let out = IMAGE.get();
    let foreign = dir().join("foreign-bay07.raw");
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
    let mut vm = boot_with(&out.join("disk.qcow2"), "foreign", |state| {
        let st = Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "qcow2"])
            .arg(&foreign)
            .arg(state.join("bay07.qcow2"))
            .status()
            .expect("qemu-img convert");
        assert!(st.success());
    });
    vm.wait_for("nasinit: started", Duration::from_secs(240)).expect("nasinit starts");
    vm.wait_for_login(Duration::from_secs(240)).ok();
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
    let status = status_json(&mut vm);
    assert_ne!(status["state"], "ready", "ready without its pool: {status}");
    let (pools, _) = vm.run("zpool list -H -o name", Duration::from_secs(60)).expect("zpool list");
    assert!(!pools.contains("tank"), "a pool was created: {pools}");
    vm.kill();
    let same = Command::new("qemu-img")
        .args(["compare", "-q", "-f", "raw", "-F", "qcow2"])
        .arg(&foreign)
        .arg(dir().join("vm-foreign/bay07.qcow2"))
        .status()
        .expect("qemu-img compare");
    assert!(same.success(), "the foreign disk in BAY07 was changed");
    let _ = std::fs::remove_file(&foreign);
}

/// A state partition that holds another filesystem (a disk from elsewhere) is never formatted:
/// the boot says what blkid saw and runs without persistence; the filesystem is still there.
fn foreign_state() {
    let raw = IMAGE.get().join("disk.img");
    let out = Command::new("partx").args(["-g", "-o", "START", "-n", "4"]).arg(&raw).output().expect("partx");
    let start: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("partition 4's start sector");
    let fs = dir().join("oldbox-state.ext4");
    let _ = std::fs::remove_file(&fs);
    std::fs::File::create(&fs).and_then(|f| f.set_len(8 << 20)).expect("fs image");
    let st = Command::new("mkfs.ext4").args(["-q", "-F", "-L", "oldbox-state"]).arg(&fs).status().expect("mkfs.ext4");
    assert!(st.success());
    let disk = overlay(&IMAGE.get().join("disk.qcow2"), &dir().join("foreign-state.qcow2"));
    let st = Command::new("qemu-io")
        .args(["-f", "qcow2", "-c", &format!("write -s {} {} {}", fs.display(), start * 512, 8 << 20)])
        .arg(&disk)
        .output()
        .expect("qemu-io");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let mut vm = boot(&disk, "foreign-state");
    vm.wait_for("nasinit: started", Duration::from_secs(240)).expect("nasinit starts");
    let refused = vm.wait_for("nasinit: state partition: ", Duration::from_secs(60)).expect("the refusal");
    assert!(refused.contains("holds a ext4 signature labelled oldbox-state"), "{refused}");
    assert!(refused.contains("never formats what it did not make"), "{refused}");
    vm.wait_for_login(Duration::from_secs(240)).ok();
    let status = status_json(&mut vm);
    assert!(status["state_partition"].as_str().is_some_and(|s| s.starts_with("none: ")), "{status}");
    let label = ok(&mut vm, "blkid -p -o value -s LABEL /dev/vda4");
    assert_eq!(label.trim(), "oldbox-state", "the foreign filesystem was changed");
    vm.kill();
    let _ = std::fs::remove_file(&fs);
}

/// Root-A starts after 1 MiB of GPT and the 96 MiB ESP; its first block holds the EROFS
/// superblock, which mounting must read.
fn tampered_root() {
    let tampered = overlay(&IMAGE.get().join("disk.qcow2"), &dir().join("tampered.qcow2"));
    let st = Command::new("qemu-io")
        .args(["-f", "qcow2", "-c", &format!("write -P 0x5a {} 4096", 97 << 20)])
        .arg(&tampered)
        .output()
        .expect("qemu-io");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let mut vm = boot(&tampered, "tampered");
    let line =
        vm.wait_for("ROOT FILESYSTEM VERIFICATION FAILED", Duration::from_secs(300)).expect("verity refuses the root");
    assert!(line.contains("refusing to boot it"), "{line}");
    vm.kill();
}

/// The product image builds too (it is not booted here: no TS-h1290FX under QEMU). It is signed
/// for the product's db, whose key is not here: without it the build stops before writing
/// anything, saying how to give it; it is built signed for the test db instead.
fn product_image() {
    build_binaries();
    let out = dir().join("ts-h1290fx-unsigned");
    let _ = std::fs::remove_dir_all(&out);
    let refused = nasos_tests::nasos_status(&["build", "recipes/ts-h1290fx.toml", "--out", &out.display().to_string()]);
    assert!(!refused.0, "built without the product's Secure Boot key");
    assert!(refused.1.contains("nasos-product-db.key") && refused.1.contains("--secure-boot-key"), "{}", refused.1);
    assert!(!out.join("disk.img").exists(), "a disk was written without its key");
    let db = nasos_tests::secure_boot_test_keys().join("db.crt");
    let recipe = nasos_tests::recipe_variant(&dir(), "ts-h1290fx", "ts-h1290fx-test-db", |r| {
        r.replace(&format!("{}/keys/nasos-product-db.crt", repo().join("recipes").display()), &db.display().to_string())
    });
    let product = nasos(&[
        "build",
        &recipe.display().to_string(),
        "--out",
        &dir().join("ts-h1290fx").display().to_string(),
        "--timings",
    ]);
    assert!(product.stdout.contains("disk.img"), "{}", product.stdout);
    eprintln!("product build: {:.1}s", product.took.as_secs_f64());
}

/// Changing an export redoes only the stages after the plan: the rootfs stays cached.
fn export_change() {
    let out_s = IMAGE.get().display().to_string();
    let copy = nasos_tests::recipe_variant(&dir(), "qemu-dev", "qemu-dev-export", |r| {
        r.replace("network = \"10.77.0.0/25\"", "network = \"10.77.0.0/26\"")
    });
    let redo = nasos(&["build", &copy.display().to_string(), "--out", &out_s, "--timings"]);
    assert!(redo.stderr.contains("nasos: rootfs     up to date"), "{}", redo.stderr);
    for stage in ["root", "uki", "disk"] {
        assert!(redo.stderr.contains(&format!("nasos: {stage:<10} done")), "{stage} was not redone:\n{}", redo.stderr);
    }
    eprintln!("export change rebuild: {:.1}s", redo.took.as_secs_f64());
}
