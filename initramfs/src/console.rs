//! Messages on the console: the initramfs's stderr is /dev/console. Prefixed as nasinit's own,
//! since to the operator the initramfs is the first part of nasinit's boot.

use std::io::Write;

pub struct Console;

impl Console {
    /// Never fails: a console that cannot be written is no reason not to boot.
    pub fn say(&self, message: &str) {
        let _ = std::io::stderr().lock().write_all(format!("nasinit: {message}\n").as_bytes());
    }
}
