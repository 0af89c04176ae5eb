//! Name and format predicates: what a pool, dataset, interface, module, bay, PCI address or MAC
//! may look like, and which password hashes are acceptable.

pub(super) fn check_crypt_hash(h: &str) -> Result<(), String> {
    let fields: Vec<&str> = h.split('$').collect();
    // "$id$…$hash": the first field is empty because the string starts with '$'.
    if fields.len() < 4 || !fields[0].is_empty() {
        return Err("root_password_hash is not a crypt(3) hash (a plain password?)".into());
    }
    match fields[1] {
        "y" | "gy" | "7" | "2b" | "6" | "5" => {}
        "1" => return Err("root_password_hash uses MD5-crypt ($1$), which is too weak".into()),
        other => return Err(format!("root_password_hash uses an unknown scheme `${other}$`")),
    }
    if fields.last().is_none_or(|f| f.len() < 20) {
        return Err("root_password_hash is truncated".into());
    }
    Ok(())
}

/// A Kerberos realm as written by convention: capitals, digits, `.` and `-`.
pub(super) fn is_realm(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 255
        && b[0].is_ascii_uppercase()
        && b.iter().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == b'.' || *c == b'-')
}

/// A login name: lowercase letters, digits, `_` and `-`, starting with a letter, at most 32.
pub(super) fn is_login(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 32
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-')
}

pub(super) fn is_slug(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && !s.ends_with('-')
}

pub(super) fn is_version(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.len() <= 9 && p.bytes().all(|c| c.is_ascii_digit()))
}

pub(super) fn is_hostname(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub(super) fn is_package(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 2
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'+' | b'-' | b'.'))
}

pub(super) fn is_ifname(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 15
        && b[0].is_ascii_alphabetic()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_'))
}

pub(super) fn is_module(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-'))
}

pub(super) fn is_bay(s: &str) -> bool {
    !s.is_empty() && s.len() <= 16 && s.bytes().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

pub(super) fn is_pool_name(s: &str) -> bool {
    let b = s.as_bytes();
    let reserved = ["mirror", "raidz", "spare", "log", "draid"].iter().any(|r| s.starts_with(r))
        || (b.len() >= 2 && b[0] == b'c' && b[1].is_ascii_digit());
    !b.is_empty()
        && b.len() <= 200
        && b[0].is_ascii_alphabetic()
        && !reserved
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b':'))
}

pub(super) fn is_dataset_component(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b':'))
}

pub(super) fn is_pci_address(s: &str) -> bool {
    // DDDD:BB:DD.F
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && [0, 1, 2, 3, 5, 6, 8, 9, 11].iter().all(|&i| b[i].is_ascii_hexdigit())
        && (b[11] as char).to_digit(16).is_some_and(|f| f <= 7)
}

pub(super) fn is_mac(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() == 6 && parts.iter().all(|p| p.len() == 2 && p.bytes().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_pci_address("0000:41:00.0"));
        assert!(!is_pci_address("0000:41:00.8"));
        assert!(!is_pci_address("41:00.0"));
        assert!(is_mac("52:54:00:aa:bb:01"));
        assert!(!is_mac("52:54:00:aa:bb"));
        assert!(is_pool_name("tank"));
        assert!(!is_pool_name("mirror1"));
        assert!(!is_pool_name("c0pool"));
        assert!(is_ifname("data0"));
        assert!(!is_ifname("a-very-long-interface"));
        assert!(is_version("1.0.12"));
        assert!(!is_version("1.0"));
        assert!(!is_version("1.0.x"));
    }

    #[test]
    fn crypt_hashes() {
        assert!(
            check_crypt_hash(
                "$6$saltsalt$Xq0HZl3kbtwXxt3gHGW0jqDOWyA5k8Fmc7y4xJv5ZcC3h1dVbWmYVQyo2UqDZr0b2X4ZSt0XQ0Qe7a3Dm1Hd1."
            )
            .is_ok()
        );
        assert!(check_crypt_hash("hunter2").is_err());
        assert!(check_crypt_hash("$1$abc$0123456789012345678901").is_err());
        assert!(check_crypt_hash("$6$salt$short").is_err());
    }
}
