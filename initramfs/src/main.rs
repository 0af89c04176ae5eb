//! The initramfs's /init: reach the verified root and exec its nasinit. On failure, say why and
//! reboot, so the boot loader's try counter for this slot runs down. See README.md.

mod console;
mod dm;
mod root;

use std::time::Duration;

fn main() {
    let console = console::Console;
    let why = root::run(&console);
    console.say(&format!("cannot boot: {why}"));
    console.say("rebooting in 10 s");
    std::thread::sleep(Duration::from_secs(10));
    let _ = nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_AUTOBOOT);
    // PID 1 must not exit (the kernel would panic); if reboot(2) itself failed, wait.
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
