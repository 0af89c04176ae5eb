//! `nasinit console DEVICE -- GETTY…`: the console service of an image that ships no password.
//! On the first boot it asks the operator on the serial console to set root's password (the
//! standard `passwd` prompts and checks), keeps the hash on the state partition, and only then
//! offers a login; on later boots it puts the kept hash in place and goes straight to the getty.

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use nasos_layout::state::{self, State};

/// Puts `hash` as root's password in `shadow` (the tmpfs-backed /etc: the image's is locked).
pub fn set_root_hash(shadow: &Path, hash: &str) -> std::io::Result<()> {
    let text = fs::read_to_string(shadow)?;
    let out: Vec<String> = text
        .lines()
        .map(|l| match l.split_once(':') {
            Some(("root", rest)) => {
                let tail = rest.split_once(':').map_or("", |(_, t)| t);
                format!("root:{hash}:{tail}")
            }
            _ => l.to_string(),
        })
        .collect();
    crate::state::write_atomic(shadow, format!("{}\n", out.join("\n")).as_bytes())?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(shadow, fs::Permissions::from_mode(0o640))
}

/// Root's password hash in `shadow`, if it has a usable one (not locked, not empty).
pub fn root_hash(shadow: &Path) -> Option<String> {
    let text = fs::read_to_string(shadow).ok()?;
    let field = text.lines().find_map(|l| l.strip_prefix("root:"))?.split(':').next()?.to_string();
    field.starts_with('$').then_some(field)
}

/// The console service's entry: never returns (it becomes the getty) unless exec fails.
pub fn console(device: &str, getty: &[String]) -> std::io::Error {
    let st = State::mounted();
    let kept = st.path(state::ROOT_PASSWORD_HASH);
    let shadow = Path::new("/etc/shadow");
    match fs::read_to_string(&kept).ok().map(|h| h.trim().to_string()).filter(|h| h.starts_with('$')) {
        Some(hash) => {
            if let Err(e) = set_root_hash(shadow, &hash) {
                eprintln!("nasinit console: cannot put root's kept password in place: {e}");
            }
        }
        None => ask(device, shadow, &kept),
    }
    let Some((program, args)) = getty.split_first() else {
        return std::io::Error::other("no getty to run");
    };
    Command::new(program).args(args).exec()
}

/// Takes the serial console, has `passwd` ask for root's password until it is set, and keeps the
/// hash. The service runs in its own session, so opening the tty makes it the controlling one.
fn ask(device: &str, shadow: &Path, kept: &Path) {
    let path = Path::new("/dev").join(device);
    let tty = match fs::OpenOptions::new().read(true).write(true).open(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("nasinit console: cannot open {}: {e}", path.display());
            return;
        }
    };
    for fd in 0..3 {
        // SAFETY: dup2 onto the standard descriptors of this process, which owns them.
        unsafe {
            nix::libc::dup2(tty.as_raw_fd(), fd);
        }
    }
    println!();
    println!("This box has no root password yet, and nasos ships none. Set it now: it is kept on");
    println!("this box only (the state partition), for every later boot and upgrade.");
    loop {
        match Command::new("/usr/bin/passwd").arg("root").status() {
            Ok(s) if s.success() => break,
            Ok(_) => println!("The password was not set. Try again."),
            Err(e) => {
                println!("cannot run passwd: {e}");
                std::thread::sleep(std::time::Duration::from_secs(5));
            }
        }
    }
    match root_hash(shadow) {
        Some(hash) => match crate::state::write_atomic(kept, format!("{hash}\n").as_bytes()) {
            Ok(()) => {
                use std::os::unix::fs::PermissionsExt;
                let _ = fs::set_permissions(kept, fs::Permissions::from_mode(0o600));
                println!("Root's password is set.");
            }
            Err(e) => println!("Root's password is set for this boot only: it could not be kept ({e})."),
        },
        None => println!("passwd succeeded but root has no password hash in /etc/shadow."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_hash_is_put_in_place_and_read_back() {
        let t = std::env::temp_dir().join(format!("nasinit-shadow-{}", std::process::id()));
        fs::create_dir_all(&t).expect("fixture");
        let shadow = t.join("shadow");
        fs::write(&shadow, "root:!:20000:0:99999:7:::\ndaemon:*:20000:0:99999:7:::\n").expect("fixture");
        assert_eq!(root_hash(&shadow), None, "locked");
        set_root_hash(&shadow, "$y$j9T$abc$def").expect("set");
        assert_eq!(root_hash(&shadow).as_deref(), Some("$y$j9T$abc$def"));
        let text = fs::read_to_string(&shadow).expect("read");
        assert_eq!(text, "root:$y$j9T$abc$def:20000:0:99999:7:::\ndaemon:*:20000:0:99999:7:::\n");
        let _ = fs::remove_dir_all(&t);
    }
}
