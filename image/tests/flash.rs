//! `nasos flash` on loop devices: it writes and verifies a whole disk, and it refuses a regular
//! file, a disk with a mounted filesystem, the disk the running system is on, a swap area, and a
//! ZFS pool member — before writing a byte (what device-mapper or md holds is refused from
//! sysfs: a unit test, as this machine's kernel has no device-mapper). Needs root (losetup,
//! mount), as `nasos flash` itself does: as anyone else each test says so and does nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn nasos(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nasos")).args(args).output().expect("run nasos")
}

/// Whether the tests can make loop devices; says why not when they cannot.
fn as_root(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("{test}: needs root (loop devices, as `nasos flash` does): not run");
    }
    root
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A loop device over a fresh file, detached on drop.
struct Loop {
    dev: String,
    file: PathBuf,
}

impl Loop {
    fn new(tag: &str, mib: u64) -> Loop {
        let file = std::env::temp_dir().join(format!("nasos-flash-{tag}-{}.img", std::process::id()));
        std::fs::File::create(&file).expect("file").set_len(mib << 20).expect("size");
        let out = Command::new("losetup").args(["--find", "--show"]).arg(&file).output().expect("losetup");
        assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
        Loop { dev: String::from_utf8_lossy(&out.stdout).trim().to_string(), file }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        let _ = std::fs::remove_file(&self.file);
    }
}

fn image(tag: &str, mib: usize) -> PathBuf {
    let p = std::env::temp_dir().join(format!("nasos-flash-image-{tag}-{}.img", std::process::id()));
    // Bytes that differ everywhere, so a short or misplaced write cannot pass verification.
    let data: Vec<u8> = (0..mib << 20).map(|i| (i * 31 % 251) as u8).collect();
    std::fs::write(&p, data).expect("image");
    p
}

#[test]
fn writes_and_verifies_a_whole_disk_only_with_yes() {
    if !as_root("writes_and_verifies_a_whole_disk_only_with_yes") {
        return;
    }
    let l = Loop::new("ok", 16);
    let img = image("ok", 8);
    let dry = nasos(&["flash", img.to_str().expect("utf8"), &l.dev]);
    assert_eq!(dry.status.code(), Some(1), "{}", text(&dry));
    assert!(text(&dry).contains("run again with --yes"), "{}", text(&dry));
    assert!(std::fs::read(&l.file).expect("read").iter().all(|&b| b == 0), "a dry run wrote something");
    let out = nasos(&["flash", img.to_str().expect("utf8"), &l.dev, "--yes"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("verified (sha256 "), "{}", text(&out));
    let written = std::fs::read(&l.file).expect("read back");
    assert!(written[..8 << 20] == std::fs::read(&img).expect("image")[..], "the device does not hold the image");
    let _ = std::fs::remove_file(img);
}

#[test]
fn refuses_what_must_not_be_written() {
    if !as_root("refuses_what_must_not_be_written") {
        return;
    }
    let img = image("refuse", 1);
    let img_s = img.to_str().expect("utf8");
    // A regular file.
    let out = nasos(&["flash", img_s, img_s, "--yes"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("is not a block device"), "{}", text(&out));
    // A disk with a mounted filesystem.
    let l = Loop::new("mounted", 32);
    assert!(Command::new("mkfs.ext4").args(["-q", &l.dev]).status().expect("mkfs").success());
    let mnt = std::env::temp_dir().join(format!("nasos-flash-mnt-{}", std::process::id()));
    std::fs::create_dir_all(&mnt).expect("mnt");
    assert!(Command::new("mount").arg(&l.dev).arg(&mnt).status().expect("mount").success());
    let out = nasos(&["flash", img_s, &l.dev, "--yes"]);
    let _ = Command::new("umount").arg(&mnt).status();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("has mounted filesystems") && text(&out).contains("unmount them first"),
        "{}",
        text(&out)
    );
    // (Mounting changes the superblock itself, so compare against the image's bytes instead.)
    let disk = std::fs::read(&l.file).expect("read");
    let pattern = std::fs::read(&img).expect("image");
    assert!(disk[..4096] != pattern[..4096], "the mounted disk was overwritten");
    // The disk of the running system.
    let root = root_disk();
    let out = nasos(&["flash", img_s, root.to_str().expect("utf8"), "--yes"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("holds the running system"), "{}", text(&out));
    let _ = std::fs::remove_file(img);
    let _ = std::fs::remove_dir(mnt);
}

/// The block device `/` is mounted from, as a /dev path (made if the container lacks the node).
fn root_disk() -> PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let line = info.lines().find(|l| l.split_whitespace().nth(4) == Some("/")).expect("root mount");
    let devno = line.split_whitespace().nth(2).expect("devno");
    let sys = std::fs::canonicalize(format!("/sys/dev/block/{devno}")).expect("root in sysfs");
    let disk = if sys.join("partition").exists() { sys.parent().expect("disk").to_path_buf() } else { sys };
    let name = disk.file_name().expect("name").to_string_lossy().into_owned();
    let dev = Path::new("/dev").join(&name);
    assert!(dev.exists(), "/dev/{name} missing");
    dev
}

/// Runs `nasos flash --yes` onto `l` and expects a refusal that says `says`, with the disk's
/// bytes as they were; returns what nasos said.
fn refused_untouched(l: &Loop, says: &str) -> String {
    let img = image(&format!("member-{}", l.dev.replace('/', "-")), 1);
    let before = std::fs::read(&l.file).expect("read");
    let out = nasos(&["flash", img.to_str().expect("utf8"), &l.dev, "--yes"]);
    let _ = std::fs::remove_file(&img);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains(says), "{}", text(&out));
    assert!(std::fs::read(&l.file).expect("read") == before, "the refused disk was written");
    text(&out)
}

#[test]
fn refuses_a_swap_area_and_a_pool_member_even_when_nothing_uses_them() {
    if !as_root("refuses_a_swap_area_and_a_pool_member_even_when_nothing_uses_them") {
        return;
    }
    let swap = Loop::new("swap", 16);
    assert!(Command::new("mkswap").arg(&swap.dev).output().expect("mkswap").status.success());
    refused_untouched(&swap, "is a swap area, per blkid");
    // The two front labels of a real vdev (partition 1 of a bay of a pool `tank` the appliance
    // made), as blkid finds them on an exported pool's disk.
    let member = Loop::new("zfs", 64);
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/zfs-member-labels.bin.gz");
    let labels = Command::new("gzip").arg("-dc").arg(&fixture).output().expect("gzip");
    assert!(labels.status.success() && labels.stdout.len() == 512 << 10, "fixture");
    let mut f = std::fs::OpenOptions::new().write(true).open(&member.dev).expect("open");
    std::io::Write::write_all(&mut f, &labels.stdout).expect("labels");
    f.sync_all().expect("sync");
    drop(f);
    let said = refused_untouched(&member, "is a ZFS pool member (label tank), per blkid");
    assert!(said.contains(&format!("zpool labelclear -f {}", member.dev)), "how to clear it: {said}");
}
