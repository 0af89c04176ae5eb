//! Sizes and durations as people write them in recipes ("96G", "1M", "40T"; "90s", "15m", "14d").

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

/// A size as `zfs list` prints it: three significant figures and a binary unit ("1.31M",
/// "47.0G", "192K", "512B"), for any byte count.
pub fn human_size(bytes: u64) -> String {
    let units = ["B", "K", "M", "G", "T", "P"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    match (u, v) {
        (0, _) => format!("{bytes}B"),
        (_, v) if v < 10.0 => format!("{v:.2}{}", units[u]),
        (_, v) if v < 100.0 => format!("{v:.1}{}", units[u]),
        _ => format!("{v:.0}{}", units[u]),
    }
}

/// Parses a duration: a whole number with one unit, `s`, `m` (minutes), `h`, `d` or `w`
/// ("14d", "90s"). Returns seconds, or `None` if the text is not a duration or overflows.
pub fn parse_duration(s: &str) -> Option<u64> {
    let s = s.trim();
    let unit = match s.chars().last()? {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        'w' => 7 * 86_400,
        _ => return None,
    };
    let digits = &s[..s.len() - 1];
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

/// Formats seconds with the largest unit that divides them exactly ("14d", "90s").
pub fn format_duration(secs: u64) -> String {
    for (suffix, unit) in [("w", 7 * 86_400), ("d", 86_400), ("h", 3600), ("m", 60)] {
        if secs >= unit && secs.is_multiple_of(unit) {
            return format!("{}{suffix}", secs / unit);
        }
    }
    format!("{secs}s")
}

#[cfg(test)]
mod tests {
    use super::{format_duration, format_size, parse_duration, parse_size};

    #[test]
    fn durations() {
        assert_eq!(parse_duration("14d"), Some(14 * 86_400));
        assert_eq!(parse_duration("90s"), Some(90));
        assert_eq!(parse_duration("3m"), Some(180));
        assert_eq!(parse_duration("2w"), Some(14 * 86_400));
        assert_eq!(parse_duration("5"), None, "a unit is required");
        assert_eq!(parse_duration("1.5h"), None);
        assert_eq!(parse_duration("d"), None);
        assert_eq!(parse_duration("-3d"), None);
        assert_eq!(parse_duration("99999999999999999999d"), None);
        assert_eq!(format_duration(14 * 86_400), "2w");
        assert_eq!(format_duration(180), "3m");
        assert_eq!(format_duration(90), "90s");
        assert_eq!(format_duration(0), "0s");
    }

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
