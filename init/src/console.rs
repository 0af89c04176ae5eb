//! nasinit's own messages: on the console (its stderr, which the kernel points at /dev/console
//! for PID 1) and, as PID 1, in the kernel log so `dmesg` shows them with the kernel's.

use std::fs::File;
use std::io::Write;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
pub struct Console {
    kmsg: Option<Arc<Mutex<File>>>,
}

impl Console {
    pub fn new(use_kmsg: bool) -> Self {
        let kmsg = if use_kmsg {
            std::fs::OpenOptions::new().write(true).open("/dev/kmsg").ok().map(|f| Arc::new(Mutex::new(f)))
        } else {
            None
        };
        Console { kmsg }
    }

    /// Prints `nasinit: MESSAGE`. Never fails: a console that cannot be written is not a reason
    /// to stop supervising.
    pub fn say(&self, message: &str) {
        let line = format!("nasinit: {message}\n");
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        if let Some(k) = &self.kmsg
            && let Ok(mut f) = k.lock()
        {
            // Level 7 (debug): recorded in the kernel log, not echoed a second time on the console.
            let _ = f.write_all(format!("<7>{line}").as_bytes());
        }
    }
}
