//! Reaching the verified root: load the modules needed to reach it, find the root slot by the
//! partition UUID its verity root hash names, open it through dm-verity, mount it, and switch to
//! it. Every step returns why it failed instead of panicking; the caller reboots.

use std::fs;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::mount::{MsFlags, mount};

use nasos_layout::cmdline::RootArgs;
use nasos_layout::paths::{
    self,
    initramfs::{DEVELOPMENT, MODULE_LIST, NEW_ROOT},
};
use nasos_layout::slot;

use crate::console::Console;
use crate::dm;

/// The program the verified root runs unless the command line names another.
const DEFAULT_INIT: &str = paths::NASINIT;

/// Runs the initramfs. Returns only on failure, with why.
pub fn run(console: &Console) -> String {
    for (src, target, fstype) in
        [("proc", "/proc", "proc"), ("sysfs", "/sys", "sysfs"), ("devtmpfs", "/dev", "devtmpfs")]
    {
        let _ = fs::create_dir_all(target);
        let _ = mount(Some(src), target, Some(fstype), MsFlags::MS_NOSUID, None::<&str>);
    }
    let cmdline = fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let args = match RootArgs::parse(&cmdline) {
        Ok(a) => a,
        Err(e) => return e.to_string(),
    };
    let Some(partuuid) = slot::root_partuuid(&args.verity.root_hash) else {
        return format!("the root hash {} names no partition", args.verity.root_hash);
    };
    let v = &args.verity;
    let (init, ignored) = args.init_program(Path::new(DEVELOPMENT).exists(), DEFAULT_INIT);
    if let Some(why) = ignored {
        console.say(&why);
    }
    load_modules(console);
    let t = Instant::now();
    let part = loop {
        match slot::find_partition(Path::new("/sys"), Path::new("/dev"), &partuuid) {
            Some(p) => break p,
            None if t.elapsed() > Duration::from_secs(30) => {
                return format!("no root slot with partition UUID {partuuid} appeared within 30 s");
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    console.say(&format!("root is {} ({partuuid})", part.display()));
    let devnum = match fs::read_to_string(
        Path::new("/sys/class/block").join(part.file_name().unwrap_or_default()).join("dev"),
    ) {
        Ok(d) => d.trim().to_string(),
        Err(e) => return format!("cannot read the device number of {}: {e}", part.display()),
    };
    let params = dm::verity_params(&devnum, v.data_blocks, v.hash_offset, &v.root_hash, &v.salt);
    if let Err(e) = dm::create(slot::ROOT_DM_NAME, v.data_blocks * 8, "verity", &params) {
        return format!("cannot create the dm-verity device: {e}");
    }
    let Some(dev) = find_dm(slot::ROOT_DM_NAME) else { return "the dm-verity device did not appear".into() };
    let _ = fs::create_dir_all(NEW_ROOT);
    if let Err(e) = mount(Some(dev.as_str()), NEW_ROOT, Some("erofs"), MsFlags::MS_RDONLY, None::<&str>) {
        return format!(
            "ROOT FILESYSTEM VERIFICATION FAILED: mounting {} through dm-verity: {e}. The root partition does not match the root hash this boot entry was built with (tampered or corrupt); refusing to boot it",
            part.display()
        );
    }
    // Reading the init binary makes dm-verity check its blocks; a corrupt one fails here, before
    // anything of the new root runs.
    if let Err(e) =
        fs::File::open(paths::under(Path::new(NEW_ROOT), init)).and_then(|mut f| io::copy(&mut f, &mut io::sink()))
    {
        return format!(
            "ROOT FILESYSTEM VERIFICATION FAILED: reading {init}: {e}. The root partition is tampered or corrupt; refusing to boot it"
        );
    }
    console.say(&format!(
        "root verified by dm-verity (root hash {}…), switching to it",
        &v.root_hash[..16.min(v.root_hash.len())]
    ));
    switch_root(init)
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
