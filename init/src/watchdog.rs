//! The hardware watchdog, owned by PID 1: armed as soon as its driver is loaded, fed from
//! nasinit's own event loop, so a hung PID 1 ends in a hardware reset (which the next boot
//! records). Health checks report; PID 1 decides. It is disarmed only at the very end of an
//! orderly shutdown, after services stopped, pools were exported and filesystems synced, so a
//! shutdown that sticks still ends in a reset within the timeout.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::console::Console;

nix::ioctl_readwrite!(wdioc_settimeout, b'W', 6, i32);

/// How long to look for the watchdog's device after nasinit starts (its driver is loaded by
/// the `modules` service); a board without it is said once, not polled forever.
const FIND_FOR: Duration = Duration::from_secs(180);
/// How often to look meanwhile.
const FIND_EVERY: Duration = Duration::from_secs(1);

pub struct Watchdog {
    identity: String,
    timeout_s: u32,
    sys: PathBuf,
    file: Option<File>,
    started: Instant,
    next: Option<Instant>,
    pet_every: Duration,
}

/// Sets the timer's timeout; returns the one the driver took (it may round or clamp).
fn set_timeout(f: &File, seconds: i32) -> std::io::Result<i32> {
    let mut timeout = seconds;
    // SAFETY: WDIOC_SETTIMEOUT reads and writes one int through the pointer, which lives for the
    // call.
    unsafe { wdioc_settimeout(f.as_raw_fd(), &mut timeout) }.map_err(std::io::Error::from)?;
    Ok(timeout)
}

/// Whether a watchdog's boot status says it reset the machine (WDIOF_CARDRESET).
pub fn reset_by_watchdog(class_dir: &Path) -> bool {
    const WDIOF_CARDRESET: u32 = 0x0020;
    std::fs::read_to_string(class_dir.join("bootstatus"))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .is_some_and(|b| b & WDIOF_CARDRESET != 0)
}

/// The device of the watchdog whose driver reports `identity`, found by what it is, never by
/// its number.
pub fn find(sys: &Path, identity: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(sys.join("class/watchdog")).ok()?.flatten() {
        if std::fs::read_to_string(e.path().join("identity")).is_ok_and(|i| i.trim() == identity) {
            return Some(PathBuf::from("/dev").join(e.file_name()));
        }
    }
    None
}

impl Watchdog {
    /// A watchdog to arm (`identity` from the board, `timeout_s` from the recipe); `None` when
    /// the plan names none.
    pub fn new(identity: &str, timeout_s: u32, now: Instant) -> Option<Watchdog> {
        (!identity.is_empty()).then(|| Watchdog {
            identity: identity.to_string(),
            timeout_s,
            sys: PathBuf::from("/sys"),
            file: None,
            started: now,
            next: Some(now),
            pet_every: Duration::from_secs(u64::from(timeout_s / 4).max(1)),
        })
    }

    /// When [`Watchdog::tick`] wants to run next; `None` once there is nothing left to do.
    pub fn next(&self) -> Option<Instant> {
        self.next
    }

    pub fn armed(&self) -> bool {
        self.file.is_some()
    }

    /// Arms the watchdog once its device appears, then feeds it. Returns, on the tick that arms
    /// it, whether the watchdog says it reset the machine before this boot (its boot status has
    /// WDIOF_CARDRESET; the driver reads that from the hardware when it loads).
    pub fn tick(&mut self, now: Instant, console: &Console) -> Option<bool> {
        match &mut self.file {
            Some(f) => {
                if let Err(e) = f.write_all(b"\0") {
                    console.say(&format!("cannot feed the watchdog: {e}"));
                }
                self.next = Some(now + self.pet_every);
            }
            None => match find(&self.sys, &self.identity) {
                Some(dev) => match self.arm(&dev) {
                    Ok(t) => {
                        console.say(&format!("watchdog {} armed, timeout {t}s, fed by nasinit", dev.display()));
                        self.next = Some(now + self.pet_every);
                        let name = dev.file_name().map(|n| n.to_owned()).unwrap_or_default();
                        return Some(reset_by_watchdog(&self.sys.join("class/watchdog").join(name)));
                    }
                    Err(e) => {
                        console.say(&format!("cannot arm the watchdog {}: {e}", dev.display()));
                        self.next = None;
                    }
                },
                None if now.duration_since(self.started) > FIND_FOR => {
                    console.say(&format!(
                        "no watchdog with identity \"{}\" appeared: this box is not protected against a hang",
                        self.identity
                    ));
                    self.next = None;
                }
                None => self.next = Some(now + FIND_EVERY),
            },
        }
        None
    }

    fn arm(&mut self, dev: &Path) -> std::io::Result<i32> {
        let f = File::options().write(true).open(dev)?;
        let timeout = set_timeout(&f, i32::try_from(self.timeout_s).unwrap_or(60))?;
        (&f).write_all(b"\0")?;
        self.pet_every = Duration::from_secs(u64::try_from(timeout / 4).unwrap_or(1).max(1));
        self.file = Some(f);
        Ok(timeout)
    }

    /// Stops feeding without closing the device (closing without the magic character leaves the
    /// timer running too, but an open device keeps anything else from feeding it): the board
    /// resets within the timeout.
    pub fn starve(&mut self) {
        self.next = None;
    }

    /// Feeds it once more: the rest of a shutdown gets a whole timeout.
    pub fn feed(&mut self) {
        if let Some(f) = &mut self.file {
            let _ = f.write_all(b"\0");
        }
    }

    /// Leaves the timer running into the kernel that kexec starts next, with `seconds` to get as
    /// far as loading the watchdog's driver (whose probe stops the timer; the next nasinit then
    /// arms it again). A kernel that hangs before that is reset through the firmware, as a
    /// firmware reboot's hang would need a hand on the power button to end. The kernel's own
    /// stop-on-reboot is off (`options watchdog stop_on_reboot=0` in the image), so only this
    /// decides. Returns the timeout the driver took, or why it could not.
    pub fn hand_over(&mut self, seconds: u32) -> std::io::Result<i32> {
        let Some(f) = &self.file else {
            return Err(std::io::Error::other("the watchdog is not armed"));
        };
        let timeout = set_timeout(f, i32::try_from(seconds).unwrap_or(i32::MAX))?;
        (&*f).write_all(b"\0")?;
        self.next = None;
        Ok(timeout)
    }

    /// The magic close: the driver stops the timer. Only at the very end of an orderly shutdown.
    pub fn disarm(&mut self, console: &Console) {
        if let Some(mut f) = self.file.take() {
            match f.write_all(b"V") {
                Ok(()) => console.say("watchdog disarmed"),
                Err(e) => console.say(&format!("cannot disarm the watchdog: {e}")),
            }
        }
        self.next = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn found_by_identity_not_number() {
        let t = std::env::temp_dir().join(format!("nasinit-wd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        for (n, id) in [("watchdog0", "iTCO_wdt"), ("watchdog1", "i6300ESB timer")] {
            std::fs::create_dir_all(t.join("class/watchdog").join(n)).expect("fixture");
            std::fs::write(t.join("class/watchdog").join(n).join("identity"), format!("{id}\n")).expect("fixture");
        }
        assert_eq!(find(&t, "i6300ESB timer"), Some(PathBuf::from("/dev/watchdog1")));
        assert_eq!(find(&t, "SP5100 TCO timer"), None);
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn a_watchdog_reset_is_read_from_the_boot_status() {
        let t = std::env::temp_dir().join(format!("nasinit-wd-boot-{}", std::process::id()));
        std::fs::create_dir_all(&t).expect("fixture");
        std::fs::write(t.join("bootstatus"), "32\n").expect("fixture");
        assert!(reset_by_watchdog(&t));
        std::fs::write(t.join("bootstatus"), "0\n").expect("fixture");
        assert!(!reset_by_watchdog(&t));
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn looks_for_its_device_for_a_while_then_says_so_once() {
        let t0 = Instant::now();
        let mut w = Watchdog::new("nothing here", 60, t0).expect("named");
        w.sys = std::env::temp_dir().join("nasinit-wd-none");
        let c = Console::new(false);
        w.tick(t0, &c);
        assert_eq!(w.next(), Some(t0 + FIND_EVERY));
        w.tick(t0 + FIND_FOR + Duration::from_secs(1), &c);
        assert_eq!(w.next(), None);
        assert!(!w.armed());
        assert!(Watchdog::new("", 60, t0).is_none());
    }
}
