//! Sizes as people write them in recipes ("96G", "1M", "40T").

/// Parses a size with an optional binary suffix (K, M, G, T, P; an optional trailing `B` or `iB`).
/// Returns bytes, or `None` if the text is not a size or overflows.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s.strip_suffix("iB").or_else(|| s.strip_suffix('B')).unwrap_or(s);
    let (digits, shift) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 10),
        'M' | 'm' => (&s[..s.len() - 1], 20),
        'G' | 'g' => (&s[..s.len() - 1], 30),
        'T' | 't' => (&s[..s.len() - 1], 40),
        'P' | 'p' => (&s[..s.len() - 1], 50),
        _ => (s, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// Formats bytes with the largest binary suffix that divides them exactly ("256M", "192G").
pub fn format_size(bytes: u64) -> String {
    for (suffix, shift) in [("P", 50), ("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::{format_size, parse_size};

    #[test]
    fn sizes() {
        assert_eq!(parse_size("96G"), Some(96 << 30));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("2TiB"), Some(2 << 40));
        assert_eq!(parse_size("1.5G"), None);
        assert_eq!(parse_size("G"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999P"), None);
        assert_eq!(format_size(256 << 20), "256M");
        assert_eq!(format_size(192 << 30), "192G");
        assert_eq!(format_size(1000), "1000");
    }
}
