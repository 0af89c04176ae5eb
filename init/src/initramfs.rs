//! Initramfs mode (the same binary, as /init of the initramfs): load the modules needed to reach
//! the root, find the root partition by its GPT unique GUID, open it through dm-verity, mount it,
//! and switch to it. A root that fails verification is refused with a message saying so, and the
//! machine reboots so the boot loader's counter can move on to the other slot.

use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::mount::{MsFlags, mount};

use crate::console::Console;
use crate::dm;

/// The file that marks an initramfs (as systemd's convention has it).
pub const MARKER: &str = "/etc/initrd-release";
/// Modules to load, one .ko path per line, in dependency order (written at build time).
pub const MODULE_LIST: &str = "/etc/nasos/modules";
const NEW_ROOT: &str = "/sysroot";

/// What the kernel command line says about the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootSpec {
    pub partuuid: String,
    pub root_hash: String,
    pub salt: String,
    pub data_blocks: u64,
    pub hash_offset: u64,
    pub init: String,
}

impl RootSpec {
    /// Parses `nasos.root=PARTUUID=… nasos.verity=HASH:SALT:BLOCKS:OFFSET [nasos.init=PATH]`.
    pub fn from_cmdline(cmdline: &str) -> Result<RootSpec, String> {
        let arg = |k: &str| cmdline.split_whitespace().find_map(|w| w.strip_prefix(k)).map(str::to_string);
        let partuuid = arg("nasos.root=PARTUUID=").ok_or("no nasos.root=PARTUUID=… on the kernel command line")?;
        let verity = arg("nasos.verity=").ok_or("no nasos.verity=… on the kernel command line")?;
        let f: Vec<&str> = verity.split(':').collect();
        let [root_hash, salt, blocks, offset] = f[..] else {
            return Err(format!("nasos.verity={verity} is not HASH:SALT:BLOCKS:OFFSET"));
        };
        let hex = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_hexdigit());
        if !hex(root_hash) || !hex(salt) {
            return Err("nasos.verity root hash and salt must be hex".into());
        }
        Ok(RootSpec {
            partuuid: partuuid.to_ascii_lowercase(),
            root_hash: root_hash.into(),
            salt: salt.into(),
            data_blocks: blocks.parse().map_err(|_| "nasos.verity block count is not a number")?,
            hash_offset: offset.parse().map_err(|_| "nasos.verity hash offset is not a number")?,
            init: arg("nasos.init=").unwrap_or_else(|| "/usr/sbin/nasinit".into()),
        })
    }
}

/// Runs the initramfs. Returns only on failure, with why.
pub fn run(console: &Console) -> String {
    for (src, target, fstype) in
        [("proc", "/proc", "proc"), ("sysfs", "/sys", "sysfs"), ("devtmpfs", "/dev", "devtmpfs")]
    {
        let _ = fs::create_dir_all(target);
        let _ = mount(Some(src), target, Some(fstype), MsFlags::MS_NOSUID, None::<&str>);
    }
    let cmdline = fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let spec = match RootSpec::from_cmdline(&cmdline) {
        Ok(s) => s,
        Err(e) => return e,
    };
    load_modules(console);
    let t = Instant::now();
    let part = loop {
        match find_partition(&spec.partuuid) {
            Some(p) => break p,
            None if t.elapsed() > Duration::from_secs(30) => {
                return format!("no partition with PARTUUID {} appeared within 30 s", spec.partuuid);
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    console.say(&format!("root is {} ({})", part.display(), spec.partuuid));
    let devnum = match fs::read_to_string(
        Path::new("/sys/class/block").join(part.file_name().unwrap_or_default()).join("dev"),
    ) {
        Ok(d) => d.trim().to_string(),
        Err(e) => return format!("cannot read the device number of {}: {e}", part.display()),
    };
    let params = dm::verity_params(&devnum, spec.data_blocks, spec.hash_offset, &spec.root_hash, &spec.salt);
    if let Err(e) = dm::create("nasos-root", spec.data_blocks * 8, "verity", &params) {
        return format!("cannot create the dm-verity device: {e}");
    }
    let Some(dev) = find_dm("nasos-root") else { return "the dm-verity device did not appear".into() };
    let _ = fs::create_dir_all(NEW_ROOT);
    if let Err(e) = mount(Some(dev.as_str()), NEW_ROOT, Some("erofs"), MsFlags::MS_RDONLY, None::<&str>) {
        return format!(
            "ROOT FILESYSTEM VERIFICATION FAILED: mounting {} through dm-verity: {e}. The root partition does not match the root hash this boot entry was built with (tampered or corrupt); refusing to boot it",
            part.display()
        );
    }
    // Reading the init binary makes dm-verity check its blocks; a corrupt one fails here, before
    // anything of the new root runs.
    let init = Path::new(NEW_ROOT).join(spec.init.trim_start_matches('/'));
    if let Err(e) = fs::File::open(&init).and_then(|mut f| io::copy(&mut f, &mut io::sink())) {
        return format!(
            "ROOT FILESYSTEM VERIFICATION FAILED: reading {}: {e}. The root partition is tampered or corrupt; refusing to boot it",
            spec.init
        );
    }
    console.say(&format!(
        "root verified by dm-verity (root hash {}…), switching to it",
        &spec.root_hash[..16.min(spec.root_hash.len())]
    ));
    switch_root(&spec.init)
}

/// Loads the listed modules in order; "already loaded" is fine, anything else is reported.
fn load_modules(console: &Console) {
    let list = fs::read_to_string(MODULE_LIST).unwrap_or_default();
    for path in list.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let r = fs::File::open(path)
            .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(nix::libc::EIO)))
            .and_then(|f| nix::kmod::finit_module(&f, c"", nix::kmod::ModuleInitFlags::empty()));
        match r {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => console.say(&format!("cannot load {path}: {e}")),
        }
    }
}

/// Finds the partition whose GPT unique GUID is `partuuid`, reading each disk's GPT.
pub fn find_partition(partuuid: &str) -> Option<PathBuf> {
    let mut disks: Vec<String> = fs::read_dir("/sys/block")
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|d| !d.starts_with("loop") && !d.starts_with("dm-") && !d.starts_with("ram"))
        .collect();
    disks.sort();
    for disk in disks {
        let Ok(mut f) = fs::File::open(Path::new("/dev").join(&disk)) else { continue };
        let Some(n) = gpt_partition_number(&mut f, partuuid) else { continue };
        // The partition's own name (sda2, nvme0n1p2, vda2) comes from sysfs.
        for e in fs::read_dir(Path::new("/sys/block").join(&disk)).into_iter().flatten().flatten() {
            let p = e.path().join("partition");
            if fs::read_to_string(&p).is_ok_and(|s| s.trim() == n.to_string()) {
                return Some(Path::new("/dev").join(e.file_name()));
            }
        }
    }
    None
}

/// Reads a GPT (512-byte sectors) and returns the 1-based number of the partition with this
/// unique GUID.
pub fn gpt_partition_number(disk: &mut (impl Read + Seek), partuuid: &str) -> Option<u32> {
    let mut header = [0u8; 92];
    disk.seek(SeekFrom::Start(512)).ok()?;
    disk.read_exact(&mut header).ok()?;
    if &header[0..8] != b"EFI PART" {
        return None;
    }
    let entries_lba = u64::from_le_bytes(header[72..80].try_into().ok()?);
    let count = u32::from_le_bytes(header[80..84].try_into().ok()?).min(1024);
    let size = u32::from_le_bytes(header[84..88].try_into().ok()?) as usize;
    if !(128..=4096).contains(&size) {
        return None;
    }
    let mut table = vec![0u8; count as usize * size];
    disk.seek(SeekFrom::Start(entries_lba * 512)).ok()?;
    disk.read_exact(&mut table).ok()?;
    table.chunks(size).position(|e| guid_string(&e[16..32]) == partuuid).map(|i| i as u32 + 1)
}

/// A GPT GUID as text: the first three fields are little-endian on disk.
pub fn guid_string(b: &[u8]) -> String {
    format!(
        "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
        b[3], b[2], b[1], b[0], b[5], b[4], b[7], b[6], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]
    )
}

fn find_dm(name: &str) -> Option<String> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        for e in fs::read_dir("/sys/block").into_iter().flatten().flatten() {
            if fs::read_to_string(e.path().join("dm/name")).is_ok_and(|n| n.trim() == name) {
                return Some(format!("/dev/{}", e.file_name().to_string_lossy()));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Moves the API filesystems into the new root, makes it `/`, and execs its init.
fn switch_root(init: &str) -> String {
    for m in ["/dev", "/proc", "/sys"] {
        let target = format!("{NEW_ROOT}{m}");
        if let Err(e) = mount(Some(m), target.as_str(), None::<&str>, MsFlags::MS_MOVE, None::<&str>) {
            return format!("cannot move {m} into the new root: {e}");
        }
    }
    if let Err(e) = nix::unistd::chdir(NEW_ROOT) {
        return format!("cannot enter the new root: {e}");
    }
    if let Err(e) = mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>) {
        return format!("cannot move the new root to /: {e}");
    }
    if let Err(e) = nix::unistd::chroot(".") {
        return format!("cannot chroot into the new root: {e}");
    }
    let _ = nix::unistd::chdir("/");
    let Ok(path) = std::ffi::CString::new(init) else { return "invalid init path".into() };
    let e = nix::unistd::execv(&path, std::slice::from_ref(&path));
    format!("cannot exec {init} in the new root: {e:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline() {
        let s = RootSpec::from_cmdline(
            "console=ttyS0 nasos.root=PARTUUID=ABCDEF01-0000-4000-8000-000000000001 nasos.verity=aa11:bb22:100:409600 quiet",
        )
        .expect("parse");
        assert_eq!(s.partuuid, "abcdef01-0000-4000-8000-000000000001");
        assert_eq!(
            (s.root_hash.as_str(), s.salt.as_str(), s.data_blocks, s.hash_offset),
            ("aa11", "bb22", 100, 409600)
        );
        assert_eq!(s.init, "/usr/sbin/nasinit");
        assert!(RootSpec::from_cmdline("nasos.verity=a:b:1:2").expect_err("no root").contains("PARTUUID"));
        assert!(RootSpec::from_cmdline("nasos.root=PARTUUID=x nasos.verity=zz:b:1:2").is_err());
    }

    #[test]
    fn finds_a_partition_by_unique_guid_in_a_gpt() {
        // A GPT written by the `gpt` crate's layout rules, built by hand here: header at LBA 1,
        // entries at LBA 2, 128 bytes each.
        let mut disk = vec![0u8; 512 * 40];
        disk[512..520].copy_from_slice(b"EFI PART");
        disk[512 + 72..512 + 80].copy_from_slice(&2u64.to_le_bytes());
        disk[512 + 80..512 + 84].copy_from_slice(&4u32.to_le_bytes());
        disk[512 + 84..512 + 88].copy_from_slice(&128u32.to_le_bytes());
        let guid: [u8; 16] = [0x01, 0xef, 0xcd, 0xab, 0x00, 0x00, 0x00, 0x40, 0x80, 0, 0, 0, 0, 0, 0, 0x02];
        let entry = 1024 + 2 * 128; // third entry
        disk[entry + 16..entry + 32].copy_from_slice(&guid);
        assert_eq!(guid_string(&guid), "abcdef01-0000-4000-8000-000000000002");
        let mut cur = std::io::Cursor::new(disk);
        assert_eq!(gpt_partition_number(&mut cur, "abcdef01-0000-4000-8000-000000000002"), Some(3));
        assert_eq!(gpt_partition_number(&mut cur, "abcdef01-0000-4000-8000-000000000009"), None);
        let mut blank = std::io::Cursor::new(vec![0u8; 4096]);
        assert_eq!(gpt_partition_number(&mut blank, "x"), None);
    }
}
