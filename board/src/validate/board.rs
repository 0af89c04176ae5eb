//! Board files.

use super::*;

/// Validates a board file.
pub fn board(doc: &Document<'_>, b: &Board) -> Vec<Diagnostic> {
    let mut c = Checker { doc, out: Vec::new() };
    let root = Path::root();
    c.name(
        &root.key("board").key("name"),
        "board name",
        &b.board.name,
        is_slug,
        "use lowercase letters, digits and dashes",
    );
    if b.cpu.threads < b.cpu.cores {
        c.error(
            &root.key("cpu").key("threads"),
            "fewer threads than cores",
            "threads counts hardware threads: cores × threads per core".to_string(),
        );
    }
    for (i, m) in b.kernel.modules.iter().enumerate() {
        c.name(
            &root.key("kernel").key("modules").index(i),
            "module name",
            m,
            is_module,
            "module names are letters, digits, `_` and `-`",
        );
    }
    packages(&mut c, &root.key("packages"), &b.packages);
    device_match(&mut c, &root.key("boot").key("match"), &b.boot.matcher, &["pci", "virtio_serial"]);
    let bays = root.key("bays");
    c.unique("bay", b.bays.iter().enumerate().map(|(i, bay)| (bay.name.as_str(), bays.index(i).key("name"))));
    for (i, bay) in b.bays.iter().enumerate() {
        c.name(
            &bays.index(i).key("name"),
            "bay name",
            &bay.name,
            is_bay,
            "bay names are uppercase letters and digits, e.g. BAY01",
        );
        device_match(&mut c, &bays.index(i).key("match"), &bay.matcher, &["pci", "serial"]);
    }
    let ports = root.key("ports");
    c.unique("port", b.ports.iter().enumerate().map(|(i, p)| (p.name.as_str(), ports.index(i).key("name"))));
    for (i, port) in b.ports.iter().enumerate() {
        c.name(
            &ports.index(i).key("name"),
            "port name",
            &port.name,
            is_ifname,
            "port names are 1–15 letters, digits, `-` and `_`",
        );
        device_match(&mut c, &ports.index(i).key("match"), &port.matcher, &["pci", "mac"]);
    }
    let matchers = b.bays.iter().enumerate().map(|(i, x)| (&x.matcher, bays.index(i).key("match")));
    let matchers = matchers.chain(b.ports.iter().enumerate().map(|(i, x)| (&x.matcher, ports.index(i).key("match"))));
    let keys: Vec<(String, Path)> = matchers.map(|(m, p)| (format!("{m:?}"), p)).collect();
    let mut seen = std::collections::HashSet::new();
    for (k, p) in &keys {
        if !seen.insert(k.as_str()) {
            c.error(
                p,
                "two devices have the same match",
                "each bay and port must be found by a different address or serial".to_string(),
            );
        }
    }
    c.out
}

fn device_match(c: &mut Checker<'_, '_>, path: &Path, m: &DeviceMatch, allowed: &[&str]) {
    let set: Vec<(&str, &str)> =
        [("pci", &m.pci), ("serial", &m.serial), ("mac", &m.mac), ("virtio_serial", &m.virtio_serial)]
            .into_iter()
            .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
            .collect();
    if set.len() != 1 {
        return c.error(
            path,
            format!("set exactly one of {}", allowed.join(", ")),
            "a device is found by one property".to_string(),
        );
    }
    let (key, value) = set[0];
    if !allowed.contains(&key) {
        return c.error(
            &path.key(key),
            format!("`{key}` cannot find this kind of device"),
            format!("use one of {}", allowed.join(", ")),
        );
    }
    let ok = match key {
        "pci" => is_pci_address(value),
        "mac" => is_mac(value),
        // The bay map becomes udev match patterns (plan::udev): no pattern or substitution
        // characters, so a serial matches only itself.
        _ => {
            !value.is_empty()
                && value.len() <= 20
                && value.chars().all(|ch| ch.is_ascii_graphic() && !"*?[]|\\\"'$%{},".contains(ch))
        }
    };
    if !ok {
        let rule = match key {
            "pci" => "write a PCI address as DDDD:BB:DD.F, e.g. \"0000:41:00.0\"",
            "mac" => "write a MAC as six hex pairs, e.g. \"52:54:00:12:34:56\"",
            _ => "serials are 1–20 printable characters, none of * ? [ ] | \\ \" ' $ % { } ,",
        };
        c.error(&path.key(key), format!("invalid {key} `{value}`"), rule.to_string());
    }
}
