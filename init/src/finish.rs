//! The end of a PID 1: after the services have stopped, kill what remains, sync, unmount, and
//! reboot(2). Never returns.

use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::reboot::{RebootMode, reboot};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::{Pid, sync};

use nasos_layout::state::{BootEnd, State};

use crate::console::Console;
use crate::supervisor::ShutdownKind;
use crate::watchdog::Watchdog;

/// Filesystems that hold no data worth unmounting before power goes.
const VIRTUAL: &[&str] = &[
    "proc",
    "sysfs",
    "devtmpfs",
    "devpts",
    "tmpfs",
    "cgroup2",
    "securityfs",
    "debugfs",
    "tracefs",
    "mqueue",
    "pstore",
    "bpf",
    "configfs",
    "efivarfs",
    "rpc_pipefs",
    "nfsd",
    "fusectl",
];

/// How long the kernel started by kexec has to load the watchdog's driver before the running
/// timer resets the box: the kernel and the initramfs take seconds on the box (tens under QEMU's
/// TCG on a busy host); a hang there otherwise waits for a hand on the power button.
pub const KEXEC_HANDOVER_S: u32 = 120;

/// `record`: the state partition and this boot's number, where how the boot ended is written.
/// `watchdog`: fed once at the start and disarmed only after everything is synced and unmounted,
/// so a shutdown that sticks still ends in a reset.
pub fn finish(
    kind: ShutdownKind,
    end: Option<BootEnd>,
    console: &Console,
    record: Option<(&State, u64)>,
    mut watchdog: Option<&mut Watchdog>,
    hang: bool,
) -> ! {
    if let Some(w) = watchdog.as_deref_mut() {
        w.feed();
    }
    console.say("sending SIGTERM to remaining processes");
    let _ = kill(Pid::from_raw(-1), Signal::SIGTERM);
    reap_until_gone(Duration::from_secs(5));
    console.say("sending SIGKILL to remaining processes");
    let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
    reap_until_gone(Duration::from_secs(2));
    if hang {
        // `nasctl debug hang-shutdown`: a sync that never returns, as on a wedged device. The
        // watchdog was fed once above and is fed no more, so it resets the box.
        console.say("debug hang-shutdown: this shutdown hangs now, before the sync; the watchdog will reset the box");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    if let Some((st, boot)) = record {
        let end = end.unwrap_or(match kind {
            ShutdownKind::Poweroff => BootEnd::Poweroff,
            ShutdownKind::Reboot => BootEnd::Reboot,
            ShutdownKind::Halt => BootEnd::Halt,
        });
        crate::state::record_end(st, boot, end);
    }
    sync();
    unmount_all(console);
    sync();
    let kexec = kind == ShutdownKind::Reboot && nasos_exec::kexec::loaded();
    if kexec && fast_reboot_allowed(end) {
        // `nasctl reboot` loaded the next boot's kernel and counted its try: start it directly,
        // without the firmware, the watchdog still running so a kernel that hangs before its
        // driver loads is reset. Should kexec fail, the firmware reboot below runs (disarmed).
        if let Some(w) = watchdog.as_deref_mut() {
            match w.hand_over(KEXEC_HANDOVER_S) {
                Ok(t) => console.say(&format!(
                    "watchdog left running for the next kernel: it resets the box unless that kernel loads the watchdog's driver within {t}s"
                )),
                Err(e) => {
                    console.say(&format!("cannot leave the watchdog running for the next kernel ({e})"));
                    w.disarm(console);
                }
            }
        }
        console.say("reboot: starting the loaded kernel (kexec), skipping the firmware");
        let Err(e) = reboot(RebootMode::RB_KEXEC);
        console.say(&format!("kexec failed ({e}); rebooting through the firmware"));
    } else if kexec {
        // A boot ended by nasinit itself (a missed deadline, a fatal condition) is a try that
        // failed: the firmware and systemd-boot count it, and a reset clears the hardware.
        let _ = nasos_exec::kexec::unload();
    }
    if let Some(w) = watchdog {
        w.disarm(console);
    }
    let mode = match kind {
        ShutdownKind::Poweroff => RebootMode::RB_POWER_OFF,
        ShutdownKind::Reboot => RebootMode::RB_AUTOBOOT,
        ShutdownKind::Halt => RebootMode::RB_HALT_SYSTEM,
    };
    console.say(&format!("{kind:?}").to_lowercase());
    let Err(e) = reboot(mode);
    console.say(&format!("reboot(2) failed: {e}"));
    // Nothing left to do but not exit (PID 1 exiting panics the kernel).
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Only a reboot someone asked for may skip the firmware; one nasinit decides on (`end` says why)
/// goes through it.
pub fn fast_reboot_allowed(end: Option<BootEnd>) -> bool {
    end.is_none()
}

fn reap_until_gone(limit: Duration) {
    let start = Instant::now();
    while start.elapsed() < limit {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Err(Errno::ECHILD) => return,
            Ok(nix::sys::wait::WaitStatus::StillAlive) => std::thread::sleep(Duration::from_millis(20)),
            _ => {}
        }
    }
}

fn unmount_all(console: &Console) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return };
    let mut mounts: Vec<(String, String, String)> = info
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mp = left.split_whitespace().nth(4)?.to_string();
            let mut r = right.split_whitespace();
            let fstype = r.next()?.to_string();
            let options = r.nth(1).unwrap_or("").to_string();
            Some((mp, fstype, options))
        })
        .collect();
    // Deepest first.
    mounts.reverse();
    let volatile = format!("upperdir={}/", crate::early::VOLATILE_OVERLAYS);
    for (mp, fstype, options) in mounts {
        if mp == "/" || VIRTUAL.contains(&fstype.as_str()) {
            continue;
        }
        // /etc and /var write into tmpfs: nothing to flush, and nasinit's own logs keep /var busy.
        if fstype == "overlay" && options.contains(&volatile) {
            continue;
        }
        if umount2(mp.as_str(), MntFlags::empty()).is_err() {
            let r =
                mount(None::<&str>, mp.as_str(), None::<&str>, MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY, None::<&str>);
            if let Err(e) = r {
                console.say(&format!("cannot unmount or remount {mp} read-only: {e}"));
            }
        }
    }
}
