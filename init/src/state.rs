//! The box's persistent state, as PID 1 brings it up before any service: the state partition
//! (made on first boot when blank, refused when it holds anything else), this box's identity,
//! nfsd's state, and the record of each boot. What lives where is `nasos_layout::state`.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nasos_exec::{Tool, blkid};
use nasos_layout::slot;
use nasos_layout::state::{self, BootEnd, State};
use nix::mount::{MsFlags, mount, umount2};

use crate::console::Console;

/// What PID 1 found and did.
#[derive(Debug, Clone)]
pub struct Brought {
    pub state: State,
    /// The partition, or why there is none (then [`state::MOUNT`] is a tmpfs and nothing persists).
    pub device: Result<PathBuf, String>,
    /// Made this boot (first boot, or after a factory reset).
    pub created: bool,
    /// This boot's number.
    pub boot: u64,
    /// How the previous boot ended; `None` on a first boot.
    pub last_end: Option<BootEnd>,
    /// How long each step took (they run before any service, so each is on the way to serving).
    pub took: crate::laps::Laps,
}

/// Finds, checks, formats if blank, and mounts the state partition; then identity, nfsd's state
/// and this boot's record. Never fails: without a state partition the box runs on a tmpfs and
/// says so.
pub fn bring_up(console: &Console) -> Brought {
    let mut took = crate::laps::Laps::default();
    let st = State::mounted();
    let _ = fs::create_dir_all(&st.root);
    let (device, created) = match mount_partition(&st.root, console, &mut took) {
        Ok((dev, created)) => (Ok(dev), created),
        Err(why) => {
            console.say(&format!("state partition: {why}; nothing this boot does will persist"));
            let _ = mount(
                Some("tmpfs"),
                &st.root,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some("mode=0700"),
            );
            (Err(why), false)
        }
    };
    took.lap("mount");
    identity(&st, console);
    took.lap("identity");
    nfs_state(&st, console);
    took.lap("nfs state");
    let (boot, mut last_end) = record_boot(&st);
    took.lap("boot record");
    if let Some(prev) = boot.checked_sub(1).filter(|p| *p > 0 && last_end.is_some())
        && let Some(end) = pstore(&st, prev, console)
    {
        last_end = Some(end);
    }
    took.lap("pstore");
    Brought { state: st, device, created, boot, last_end, took }
}

fn mount_partition(at: &Path, console: &Console, took: &mut crate::laps::Laps) -> Result<(PathBuf, bool), String> {
    let dev = slot::state_partition(Path::new("/sys"), Path::new("/dev"))?;
    let mut created = false;
    let content = blkid::probe(&dev).map_err(|e| format!("probing {}: {e}", dev.display()))?;
    took.lap("find");
    match content {
        blkid::Content::Blank => {
            console.say(&format!("state partition {} is blank: making its filesystem (first boot)", dev.display()));
            mkfs(&dev)?;
            took.lap("mkfs");
            created = true;
        }
        blkid::Content::Found { kind, label: Some(label), .. }
            if kind == state::FS_TYPE && label == state::FS_LABEL =>
        {
            // Preen after a power loss; what it cannot fix unattended is reported and the mount
            // is still tried (the kernel refuses a filesystem it cannot use).
            let checked = Tool::new("e2fsck").args(["-p"]).arg(&dev).timeout(Duration::from_secs(120)).run();
            took.lap("e2fsck");
            if let Err(e) = checked
                && !matches!(&e, nasos_exec::Error::Failed { status, .. } if status.code() == Some(1))
            {
                console.say(&format!("state partition check: {e}"));
            }
        }
        other => {
            return Err(format!(
                "{} holds {}, not the {} filesystem labelled {} nasos makes; nasos never formats what it did not make (clear it deliberately with wipefs -a to start afresh)",
                dev.display(),
                other.describe(),
                state::FS_TYPE,
                state::FS_LABEL
            ));
        }
    }
    mount_fs(&dev, at)?;
    if at.join(state::FACTORY_RESET).exists() {
        console.say(
            "factory reset: clearing the state partition (identity, credentials, logs, NFS state); the pools are kept",
        );
        umount2(at, nix::mount::MntFlags::empty()).map_err(|e| format!("unmounting for the factory reset: {e}"))?;
        mkfs(&dev)?;
        mount_fs(&dev, at)?;
        created = true;
    }
    Ok((dev, created))
}

fn mkfs(dev: &Path) -> Result<(), String> {
    Tool::new("mkfs.ext4")
        .args(["-q", "-F", "-L", state::FS_LABEL])
        .arg(dev)
        .timeout(Duration::from_secs(120))
        .run()
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn mount_fs(dev: &Path, at: &Path) -> Result<(), String> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_NOATIME;
    mount(Some(dev), at, Some(state::FS_TYPE), flags, Some("errors=remount-ro"))
        .map_err(|e| format!("mounting {} on {}: {e}", dev.display(), at.display()))
}

/// Writes a file through a temporary name and a rename, so a power cut leaves the old or the
/// new content, never half of one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, path)
}

fn random_hex(bytes: usize) -> std::io::Result<String> {
    let mut b = vec![0u8; bytes];
    std::io::Read::read_exact(&mut fs::File::open("/dev/urandom")?, &mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// A per-box value: read from the state partition, or made once and kept there.
fn kept(
    st: &State,
    rel: &str,
    valid: impl Fn(&str) -> bool,
    make: impl FnOnce() -> std::io::Result<String>,
) -> Option<String> {
    let path = st.path(rel);
    if let Ok(v) = fs::read_to_string(&path)
        && valid(v.trim())
    {
        return Some(v.trim().to_string());
    }
    let v = make().ok()?;
    write_atomic(&path, format!("{v}\n").as_bytes()).ok()?;
    Some(v)
}

/// This box's identity, made on first boot and kept: machine-id, and the NVMe host NQN and host
/// id (nvme-cli made them at build time, which gave every box the same). ZFS's host id stays
/// unset on purpose: a pool then carries no owner, so it imports after a crash and in a
/// replacement chassis without `-f` (see the storage service).
pub fn identity(st: &State, console: &Console) {
    let is_hex = |n: usize| move |s: &str| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    match kept(st, state::MACHINE_ID, is_hex(32), || random_hex(16)) {
        Some(id) => {
            let _ = fs::write("/etc/machine-id", format!("{id}\n"));
        }
        None => console.say("cannot keep a machine-id on the state partition"),
    }
    let uuid = |s: &str| s.len() == 36 && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    let hostid = kept(st, state::HOSTID, uuid, || {
        let h = random_hex(16)?;
        // A version 4 UUID.
        let v = format!("4{}", &h[13..16]);
        let var = format!("{:x}{}", (u8::from_str_radix(&h[16..17], 16).unwrap_or(8) & 0x3) | 0x8, &h[17..20]);
        Ok(format!("{}-{}-{v}-{var}-{}", &h[0..8], &h[8..12], &h[20..32]))
    });
    if let Some(hostid) = hostid {
        let nqn = kept(
            st,
            state::HOSTNQN,
            |s| s.starts_with("nqn."),
            || Ok(format!("nqn.2014-08.org.nvmexpress:uuid:{hostid}")),
        );
        let _ = fs::create_dir_all("/etc/nvme");
        let _ = fs::write("/etc/nvme/hostid", format!("{hostid}\n"));
        if let Some(nqn) = nqn {
            let _ = fs::write("/etc/nvme/hostnqn", format!("{nqn}\n"));
        }
    }
}

/// nfsd's state directory (`/var/lib/nfs`, where the kernel keeps NFSv4 client tracking in
/// `v4recovery`) lives on the state partition, so clients reclaim their opens and locks in the
/// grace period after a reboot or an upgrade. The image's initial content seeds it once.
pub fn nfs_state(st: &State, console: &Console) {
    let keep = st.path(state::NFS);
    if !keep.exists() {
        let seeded = fs::create_dir_all(&keep)
            .map_err(|e| e.to_string())
            .and_then(|_| Tool::new("cp").args(["-a", "/var/lib/nfs/."]).arg(&keep).run().map_err(|e| e.to_string()));
        if let Err(e) = seeded {
            console.say(&format!("cannot seed NFS state on the state partition: {e}"));
        }
    }
    let _ = fs::create_dir_all(keep.join("v4recovery"));
    let _ = fs::create_dir_all("/var/lib/nfs");
    if let Err(e) = mount(Some(&keep), "/var/lib/nfs", None::<&str>, MsFlags::MS_BIND, None::<&str>) {
        console.say(&format!(
            "cannot put NFS state on the state partition ({e}): clients cannot reclaim locks after a reboot"
        ));
    }
}

/// Opens this boot's record (`boots/N/`, its end marked unclean until a clean shutdown says
/// otherwise), keeps the last [`state::BOOTS_KEPT`], and reads how the previous boot ended.
pub fn record_boot(st: &State) -> (u64, Option<BootEnd>) {
    let boots = st.boots();
    let prev = boots.last().copied();
    // A boot that never said how it ended was cut short: power loss, reset, panic. (When the
    // watchdog's driver loads it may say it was the watchdog; nasinit then settles the record.)
    let last_end = prev.map(|p| st.boot_end(p).unwrap_or(BootEnd::Unclean));
    let seq = prev.map_or(1, |p| p + 1);
    let _ = fs::create_dir_all(st.boot_dir(seq).join("log"));
    let _ = write_atomic(&st.end_file(seq), format!("{}\n", BootEnd::Unclean.as_str()).as_bytes());
    if let (Some(p), Some(e)) = (prev, last_end) {
        // Settle the previous boot's record with what is now known about it.
        let _ = write_atomic(&st.end_file(p), format!("{}\n", e.as_str()).as_bytes());
    }
    let all = st.boots();
    for old in all.iter().take(all.len().saturating_sub(state::BOOTS_KEPT)) {
        let _ = fs::remove_dir_all(st.boot_dir(*old));
    }
    (seq, last_end)
}

/// Where the kernel leaves its last words across a reset.
const PSTORE: &str = "/sys/fs/pstore";

/// Reads what the kernel left in pstore (EFI variables here; ramoops elsewhere): a panic's log
/// means the previous boot ended in a kernel panic. The records move to that boot's directory on
/// the state partition (and out of the firmware's small store).
fn pstore(st: &State, prev: u64, console: &Console) -> Option<BootEnd> {
    // The EFI backend is a module; the pstore filesystem lists what the backends found.
    let _ = Tool::new("modprobe").arg("efi_pstore").timeout(Duration::from_secs(20)).run();
    let _ = fs::create_dir_all(PSTORE);
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let _ = mount(Some("pstore"), PSTORE, Some("pstore"), flags, None::<&str>);
    let records: Vec<PathBuf> = fs::read_dir(PSTORE).ok()?.flatten().map(|e| e.path()).collect();
    if records.is_empty() {
        return None;
    }
    let keep = st.boot_dir(prev).join("pstore");
    let _ = fs::create_dir_all(&keep);
    let mut panicked = false;
    for r in &records {
        let text = fs::read_to_string(r).unwrap_or_default();
        panicked |= text.contains("Kernel panic") || text.contains("Oops");
        if let Some(name) = r.file_name() {
            let _ = fs::write(keep.join(name), &text);
        }
        let _ = fs::remove_file(r);
    }
    console.say(&format!("the kernel left {} record(s) in pstore; kept in {}", records.len(), keep.display()));
    panicked.then(|| {
        record_end(st, prev, BootEnd::Panic);
        BootEnd::Panic
    })
}

/// Marks how this boot ends, just before reboot(2).
pub fn record_end(st: &State, boot: u64, end: BootEnd) {
    let _ = write_atomic(&st.end_file(boot), format!("{}\n", end.as_str()).as_bytes());
}

/// The watchdog reset the machine before this boot: what that says about the previous boot
/// (whose recorded end is `prev_end`; `fatal_why` is its fatal file), as an operator reads it,
/// and the end to record for it (`None`: its record stands).
/// - It recorded a fatal condition: it let the watchdog reset it, and why is the better answer.
/// - It recorded a clean reboot: it left the watchdog running for the kernel it started with
///   kexec, and that kernel hung before nasinit (after a firmware reboot the watchdog is off
///   until nasinit arms it).
/// - Anything else (no end: it hung): the watchdog ended it.
pub fn after_watchdog_reset(prev_end: Option<BootEnd>, fatal_why: &str) -> (String, Option<BootEnd>) {
    match prev_end {
        Some(BootEnd::Fatal) => (format!("{}: {}", BootEnd::Fatal.describe(), fatal_why.trim()), None),
        Some(BootEnd::Reboot) => (
            format!(
                "{}; the kernel it started with kexec hung, and the hardware watchdog reset the box",
                BootEnd::Reboot.describe()
            ),
            None,
        ),
        _ => (BootEnd::Watchdog.describe().to_string(), Some(BootEnd::Watchdog)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watchdog_reset_is_told_by_what_the_previous_boot_recorded() {
        let (said, record) = after_watchdog_reset(Some(BootEnd::Fatal), "pool tank: suspended\n");
        assert_eq!(said, format!("{}: pool tank: suspended", BootEnd::Fatal.describe()));
        assert_eq!(record, None);
        // A clean reboot handed the running watchdog to a kexec'd kernel, which hung.
        let (said, record) = after_watchdog_reset(Some(BootEnd::Reboot), "");
        assert!(said.starts_with("clean reboot; the kernel it started with kexec hung"), "{said}");
        assert_eq!(record, None);
        for prev in [None, Some(BootEnd::Unclean), Some(BootEnd::Poweroff)] {
            assert_eq!(
                after_watchdog_reset(prev, ""),
                (BootEnd::Watchdog.describe().to_string(), Some(BootEnd::Watchdog)),
                "{prev:?}"
            );
        }
    }

    fn fixture(name: &str) -> PathBuf {
        let t = std::env::temp_dir().join(format!("nasinit-state-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&t);
        fs::create_dir_all(&t).expect("fixture");
        t
    }

    #[test]
    fn each_boot_is_recorded_and_the_previous_end_read() {
        let t = fixture("boots");
        let st = State::at(t.join("state"));
        assert_eq!(record_boot(&st), (1, None));
        record_end(&st, 1, BootEnd::Reboot);
        assert_eq!(record_boot(&st), (2, Some(BootEnd::Reboot)));
        // Boot 2 never said how it ended: a power loss.
        assert_eq!(record_boot(&st), (3, Some(BootEnd::Unclean)));
        assert_eq!(st.boot_end(2), Some(BootEnd::Unclean));
        for _ in 0..21 {
            record_boot(&st);
        }
        assert_eq!(st.boots().len(), state::BOOTS_KEPT);
        assert_eq!(st.boots().last(), Some(&24));
        let _ = fs::remove_dir_all(&t);
    }

    #[test]
    fn values_are_made_once_and_kept() {
        let t = fixture("kept");
        let st = State::at(&t);
        let a = kept(&st, "identity/x", |s| s.len() == 4, || Ok("abcd".into()));
        let b = kept(&st, "identity/x", |s| s.len() == 4, || Ok("zzzz".into()));
        assert_eq!((a.as_deref(), b.as_deref()), (Some("abcd"), Some("abcd")));
        fs::write(st.path("identity/x"), "bad\n").expect("fixture");
        assert_eq!(kept(&st, "identity/x", |s| s.len() == 4, || Ok("efgh".into())).as_deref(), Some("efgh"));
        let _ = fs::remove_dir_all(&t);
    }
}
