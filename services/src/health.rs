//! Health checks as decisions over what sysfs and ZFS say, apart from the agent's loop so host
//! tests reach them with a fixture tree.

use std::collections::BTreeSet;
use std::path::Path;

/// The watchdog device whose driver reports this identity (`i6300ESB timer`, `SP5100 TCO timer`):
/// found by what it is, never by its number.
pub fn find_watchdog(sys: &Path, identity: &str) -> Option<std::path::PathBuf> {
    for e in std::fs::read_dir(sys.join("class/watchdog")).ok()?.flatten() {
        if std::fs::read_to_string(e.path().join("identity")).is_ok_and(|i| i.trim() == identity) {
            return Some(std::path::PathBuf::from("/dev").join(e.file_name()));
        }
    }
    None
}

/// One bay's NVMe composite temperature, as the kernel's nvme hwmon reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct BayTemperature {
    pub bay: String,
    /// °C; `None` when the bay is empty or its drive reports no temperature.
    pub celsius: Option<f64>,
}

/// Reads the temperature of the drive in each bay: `bay_dir/BAYnn` points at the namespace
/// (`/dev/nvme3n1`), whose controller carries an hwmon with `temp1_input` (millidegrees).
/// `sys` is normally `/sys`.
pub fn nvme_temperatures(sys: &Path, bay_dir: &Path, bays: &[String]) -> Vec<BayTemperature> {
    bays.iter()
        .map(|bay| {
            let celsius = std::fs::read_link(bay_dir.join(bay))
                .ok()
                .and_then(|target| target.file_name().map(|n| n.to_owned()))
                .and_then(|ns| {
                    let device = sys.join("block").join(ns).join("device");
                    std::fs::read_dir(&device).ok()?.flatten().find_map(|e| {
                        let name = e.file_name();
                        if !name.to_string_lossy().starts_with("hwmon") {
                            return None;
                        }
                        let milli: i64 =
                            std::fs::read_to_string(e.path().join("temp1_input")).ok()?.trim().parse().ok()?;
                        Some(milli as f64 / 1000.0)
                    })
                });
            BayTemperature { bay: bay.clone(), celsius }
        })
        .collect()
}

/// Lines to say about temperatures, given which bays were already over the threshold: a bay
/// that crosses it is named once, and once more when it is back under. `hot` is updated.
pub fn temperature_changes(temps: &[BayTemperature], warn_celsius: u32, hot: &mut BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for t in temps {
        let Some(c) = t.celsius else { continue };
        let over = c > f64::from(warn_celsius);
        if over && hot.insert(t.bay.clone()) {
            out.push(format!("{}: NVMe drive at {c:.0}°C, above the {warn_celsius}°C threshold", t.bay));
        } else if !over && hot.remove(&t.bay) {
            out.push(format!("{}: NVMe drive back to {c:.0}°C, under the {warn_celsius}°C threshold", t.bay));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        let t = std::env::temp_dir().join(format!("nasos-health-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        std::fs::create_dir_all(t.join("bays")).expect("fixture");
        t
    }

    #[test]
    fn temperatures_are_read_by_bay_through_the_controller_hwmon() {
        let t = fixture("temps");
        let sys = t.join("sys");
        std::fs::create_dir_all(sys.join("block/nvme4n1/device/hwmon7")).expect("fixture");
        std::fs::write(sys.join("block/nvme4n1/device/hwmon7/temp1_input"), "71850\n").expect("fixture");
        std::fs::create_dir_all(sys.join("block/nvme0n1/device")).expect("fixture");
        std::os::unix::fs::symlink("/dev/nvme4n1", t.join("bays/BAY01")).expect("link");
        std::os::unix::fs::symlink("/dev/nvme0n1", t.join("bays/BAY02")).expect("link");
        let bays: Vec<String> = ["BAY01", "BAY02", "BAY03"].iter().map(|s| s.to_string()).collect();
        let temps = nvme_temperatures(&sys, &t.join("bays"), &bays);
        assert_eq!(temps[0], BayTemperature { bay: "BAY01".into(), celsius: Some(71.85) });
        assert_eq!(temps[1].celsius, None, "no hwmon");
        assert_eq!(temps[2].celsius, None, "empty bay");
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn the_watchdog_is_found_by_identity() {
        let t = fixture("watchdog");
        for (n, id) in [("watchdog0", "iTCO_wdt"), ("watchdog1", "i6300ESB timer")] {
            std::fs::create_dir_all(t.join("class/watchdog").join(n)).expect("fixture");
            std::fs::write(t.join("class/watchdog").join(n).join("identity"), format!("{id}\n")).expect("fixture");
        }
        assert_eq!(find_watchdog(&t, "i6300ESB timer"), Some(std::path::PathBuf::from("/dev/watchdog1")));
        assert_eq!(find_watchdog(&t, "SP5100 TCO timer"), None);
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn a_hot_drive_is_named_once_and_again_when_it_cools() {
        let mut hot = BTreeSet::new();
        let at = |c: f64| vec![BayTemperature { bay: "BAY05".into(), celsius: Some(c) }];
        assert!(temperature_changes(&at(60.0), 70, &mut hot).is_empty());
        assert_eq!(
            temperature_changes(&at(72.4), 70, &mut hot),
            vec!["BAY05: NVMe drive at 72°C, above the 70°C threshold"]
        );
        assert!(temperature_changes(&at(75.0), 70, &mut hot).is_empty(), "said once");
        assert_eq!(
            temperature_changes(&at(65.0), 70, &mut hot),
            vec!["BAY05: NVMe drive back to 65°C, under the 70°C threshold"]
        );
        assert!(hot.is_empty());
    }
}
