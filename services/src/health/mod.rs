//! Health checks as decisions over what sysfs and ZFS say, apart from the agent's loop
//! (`agent`) so host tests reach them with a fixture tree.

mod agent;

pub use agent::run;

use std::collections::BTreeSet;
use std::path::Path;

use nasos_board::plan::BayPlan;

/// One bay's NVMe composite temperature, as the kernel's nvme hwmon reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct BayTemperature {
    pub bay: String,
    /// °C; `None` when the bay is empty or its drive reports no temperature.
    pub celsius: Option<f64>,
}

/// Reads the composite temperature of the drive in each bay from its controller's hwmon
/// (`/sys/class/nvme/nvmeK/hwmonN/temp1_input`, millidegrees; the kernel reads the SMART log).
/// Controllers are matched to bays as nasinit links them: by serial on the twin board, by PCI
/// address on real hardware, never by kernel numbering. `sys` is normally `/sys`.
pub fn nvme_temperatures(sys: &Path, bays: &[BayPlan]) -> Vec<BayTemperature> {
    let read = |p: &Path| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    let ctrls: Vec<(Option<String>, Option<String>, Option<f64>)> = std::fs::read_dir(sys.join("class/nvme"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|c| {
            let dir = c.path();
            let celsius = std::fs::read_dir(&dir).ok().and_then(|entries| {
                entries.flatten().find_map(|e| {
                    if !e.file_name().to_string_lossy().starts_with("hwmon") {
                        return None;
                    }
                    let milli: i64 = read(&e.path().join("temp1_input"))?.parse().ok()?;
                    Some(milli as f64 / 1000.0)
                })
            });
            (read(&dir.join("serial")), read(&dir.join("address")), celsius)
        })
        .collect();
    bays.iter()
        .map(|bay| {
            let celsius = ctrls
                .iter()
                .find(|(serial, address, _)| {
                    bay.matcher.serial.as_ref().is_some_and(|s| serial.as_ref() == Some(s))
                        || bay.matcher.pci.as_ref().is_some_and(|p| address.as_ref() == Some(p))
                })
                .and_then(|(_, _, c)| *c);
            BayTemperature { bay: bay.name.clone(), celsius }
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
        let nvme = t.join("class/nvme");
        for (ctrl, serial, addr, temp) in
            [("nvme4", "BAY01", "0000:03:00.0", Some("71850")), ("nvme0", "BAY02", "0000:04:00.0", None)]
        {
            std::fs::create_dir_all(nvme.join(ctrl).join("hwmon7")).expect("fixture");
            std::fs::write(nvme.join(ctrl).join("serial"), format!("{serial}   \n")).expect("fixture");
            std::fs::write(nvme.join(ctrl).join("address"), format!("{addr}\n")).expect("fixture");
            if let Some(v) = temp {
                std::fs::write(nvme.join(ctrl).join("hwmon7/temp1_input"), format!("{v}\n")).expect("fixture");
            }
        }
        let bay = |name: &str, serial: Option<&str>, pci: Option<&str>| BayPlan {
            name: name.into(),
            matcher: nasos_board::board::DeviceMatch {
                serial: serial.map(String::from),
                pci: pci.map(String::from),
                ..Default::default()
            },
        };
        let bays = [
            bay("BAY01", Some("BAY01"), None),
            bay("BAY02", None, Some("0000:04:00.0")),
            bay("BAY03", Some("BAY03"), None),
        ];
        let temps = nvme_temperatures(&t, &bays);
        assert_eq!(temps[0], BayTemperature { bay: "BAY01".into(), celsius: Some(71.85) });
        assert_eq!(temps[1].celsius, None, "no hwmon reading");
        assert_eq!(temps[2].celsius, None, "empty bay");
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
