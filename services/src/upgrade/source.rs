//! Where a bundle comes from: a file on the appliance (copied onto a dataset over NFS), the one
//! bundle on a USB stick (`usb:`), or an `http://` URL, streamed and never stored whole.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use nasos_exec::blkid;

use crate::run;

/// Where a USB stick is mounted, read-only, while its bundle is read.
const USB_MOUNT: &str = "/run/nasos/usb";

/// An open bundle stream, and what to undo when it is dropped.
pub struct Source {
    pub reader: Box<dyn Read>,
    /// What it is, for the progress lines and the history.
    pub describe: String,
    /// Its length when known (a file, an HTTP response with Content-Length).
    pub len: Option<u64>,
    _usb: Option<UsbMount>,
}

struct UsbMount;

impl Drop for UsbMount {
    fn drop(&mut self) {
        let _ = run("umount", &[USB_MOUNT]);
    }
}

pub fn open(spec: &str) -> anyhow::Result<Source> {
    if spec == "usb:" || spec == "usb" {
        return usb();
    }
    if spec.starts_with("https://") {
        bail!(
            "https is not supported: the bundle's signature is what makes it trustworthy, so serve it over http:// (or copy it onto the box)"
        );
    }
    if spec.starts_with("http://") {
        return http(spec);
    }
    let path = Path::new(spec);
    let f = std::fs::File::open(path).with_context(|| format!("opening {spec}"))?;
    let len = f.metadata().ok().map(|m| m.len());
    Ok(Source {
        reader: Box::new(std::io::BufReader::with_capacity(1 << 20, f)),
        describe: spec.to_string(),
        len,
        _usb: None,
    })
}

fn http(url: &str) -> anyhow::Result<Source> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_connect(Some(std::time::Duration::from_secs(15)))
        .timeout_recv_body(Some(std::time::Duration::from_secs(60)))
        .build()
        .into();
    let resp = agent.get(url).call().with_context(|| format!("fetching {url}"))?;
    let len = resp.headers().get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    let reader = resp.into_body().into_with_config().limit(u64::MAX).reader();
    Ok(Source {
        reader: Box::new(std::io::BufReader::with_capacity(1 << 20, reader)),
        describe: url.to_string(),
        len,
        _usb: None,
    })
}

/// Block devices on a USB bus: whole disks whose sysfs device path runs through a USB host.
fn usb_disks(sys: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(sys.join("block"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            std::fs::canonicalize(e.path())
                .is_ok_and(|p| p.components().any(|c| c.as_os_str().to_string_lossy().starts_with("usb")))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A disk's partitions (sda1, sda2) and the disk itself (a stick formatted without a table).
fn candidates(sys: &Path, disk: &str) -> Vec<String> {
    let mut parts: Vec<String> = std::fs::read_dir(sys.join("block").join(disk))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(disk) && n != disk)
        .collect();
    parts.sort();
    parts.push(disk.to_string());
    parts
}

/// The one bundle on a USB stick's FAT filesystem.
fn usb() -> anyhow::Result<Source> {
    for m in ["xhci_pci", "usb_storage", "uas", "sd_mod", "vfat", "nls_cp437", "nls_iso8859_1"] {
        let _ = run("modprobe", &[m]);
    }
    // A stick just plugged in takes a moment to be probed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let disks = loop {
        let d = usb_disks(Path::new("/sys"));
        if !d.is_empty() || std::time::Instant::now() > deadline {
            break d;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    };
    if disks.is_empty() {
        bail!("no USB storage device is plugged in");
    }
    let mut fat = Vec::new();
    for disk in &disks {
        for c in candidates(Path::new("/sys"), disk) {
            let dev = PathBuf::from("/dev").join(&c);
            if let Ok(blkid::Content::Found { kind, .. }) = blkid::probe(&dev)
                && kind == "vfat"
            {
                fat.push(dev);
                break;
            }
        }
    }
    let [dev] = &fat[..] else {
        if fat.is_empty() {
            bail!(
                "no FAT filesystem on the USB device(s) {}: put the bundle on a FAT-formatted stick",
                disks.join(", ")
            );
        }
        bail!(
            "several USB sticks hold FAT filesystems ({}): plug in only the one with the bundle",
            fat.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
        );
    };
    std::fs::create_dir_all(USB_MOUNT)?;
    run("mount", &["-t", "vfat", "-o", "ro,nosuid,nodev,noexec", &dev.display().to_string(), USB_MOUNT])
        .with_context(|| format!("mounting {}", dev.display()))?;
    let guard = UsbMount;
    let bundles: Vec<PathBuf> = std::fs::read_dir(USB_MOUNT)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x.eq_ignore_ascii_case(nasos_bundle::EXTENSION)))
        .collect();
    let [file] = &bundles[..] else {
        if bundles.is_empty() {
            bail!("{} holds no *.{} file at its top level", dev.display(), nasos_bundle::EXTENSION);
        }
        bail!(
            "{} holds several bundles ({}): leave only the one to install",
            dev.display(),
            bundles
                .iter()
                .filter_map(|b| b.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let f = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let len = f.metadata().ok().map(|m| m.len());
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    Ok(Source {
        reader: Box::new(std::io::BufReader::with_capacity(1 << 20, f)),
        describe: format!("usb:{name} ({})", dev.display()),
        len,
        _usb: Some(guard),
    })
}
