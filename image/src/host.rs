//! The host tools a build needs, checked before anything starts. As root, missing ones are
//! installed with apt (QEMU from bookworm-backports on Debian 12, where bookworm's QEMU is 7.2);
//! otherwise the error names the exact apt line to run.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};

/// A tool: a file that must exist, and the Debian package that provides it.
pub struct Tool {
    pub path: &'static str,
    pub package: &'static str,
    /// Needs bookworm-backports on Debian 12.
    pub backports: bool,
}

const fn tool(path: &'static str, package: &'static str) -> Tool {
    Tool { path, package, backports: false }
}

/// What `nasos build` needs.
pub const BUILD: &[Tool] = &[
    tool("/usr/bin/mmdebstrap", "mmdebstrap"),
    tool("/usr/bin/mkfs.erofs", "erofs-utils"),
    tool("/usr/sbin/veritysetup", "cryptsetup-bin"),
    tool("/usr/bin/mcopy", "mtools"),
    tool("/usr/sbin/mkfs.vfat", "dosfstools"),
    tool("/usr/sbin/mkfs.ext4", "e2fsprogs"),
    tool("/usr/bin/objcopy", "binutils"),
    tool("/usr/bin/xz", "xz-utils"),
    // A build as a normal user works on the root tree inside a user namespace with the user's
    // subordinate ids (see userns.rs); mmdebstrap's unshare mode needs the same helpers.
    tool("/usr/bin/newuidmap", "uidmap"),
    Tool { path: "/usr/bin/qemu-img", package: "qemu-utils", backports: true },
];

/// What `nasos qemu` needs on top.
pub const QEMU: &[Tool] = &[
    Tool { path: "/usr/bin/qemu-system-x86_64", package: "qemu-system-x86", backports: true },
    tool("/usr/share/OVMF/OVMF_CODE_4M.fd", "ovmf"),
    tool("/usr/share/OVMF/OVMF_VARS_4M.fd", "ovmf"),
];

/// What signing a Secure Boot image needs on top of a build.
pub const SIGN: &[Tool] = &[
    tool("/usr/bin/sbsign", "sbsigntool"),
    tool("/usr/bin/sbverify", "sbsigntool"),
    tool("/usr/bin/sbattach", "sbsigntool"),
    tool("/usr/bin/faketime", "faketime"),
    tool("/usr/bin/openssl", "openssl"),
];

/// What booting a Secure Boot image in QEMU needs on top: the enforcing firmware and the tool
/// that enrolls keys in its variable store.
pub const SECURE_QEMU: &[Tool] = &[
    tool("/usr/share/OVMF/OVMF_CODE_4M.secboot.fd", "ovmf"),
    Tool { path: "/usr/bin/virt-fw-vars", package: "python3-virt-firmware", backports: true },
];

const BACKPORTS_LIST: &str = "/etc/apt/sources.list.d/nasos-bookworm-backports.list";

/// Ensures every tool exists, installing what is missing when running as root.
pub fn ensure(tools: &[Tool]) -> anyhow::Result<()> {
    let missing: Vec<&Tool> = tools.iter().filter(|t| !Path::new(t.path).exists()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let mut plain: Vec<&str> = missing.iter().filter(|t| !t.backports || !is_bookworm()).map(|t| t.package).collect();
    let mut bpo: Vec<&str> = missing.iter().filter(|t| t.backports && is_bookworm()).map(|t| t.package).collect();
    plain.sort();
    plain.dedup();
    bpo.sort();
    bpo.dedup();
    let mut lines = Vec::new();
    if !bpo.is_empty() {
        lines.push(format!(
            "echo 'deb http://deb.debian.org/debian bookworm-backports main' > {BACKPORTS_LIST} && apt-get update"
        ));
        lines.push(format!("apt-get install -y -t bookworm-backports {}", bpo.join(" ")));
    }
    if !plain.is_empty() {
        lines.push(format!("apt-get install -y {}", plain.join(" ")));
    }
    if !nix::unistd::geteuid().is_root() {
        let names: Vec<&str> = missing.iter().map(|t| t.path).collect();
        bail!("missing host tools: {}\nas root, run:\n  {}", names.join(", "), lines.join("\n  "));
    }
    eprintln!("nasos: installing host tools: {}", [plain.clone(), bpo.clone()].concat().join(" "));
    if !bpo.is_empty() && !Path::new(BACKPORTS_LIST).exists() {
        std::fs::write(BACKPORTS_LIST, "deb http://deb.debian.org/debian bookworm-backports main\n")
            .with_context(|| format!("writing {BACKPORTS_LIST}"))?;
    }
    apt(&["update", "-qq"])?;
    if !bpo.is_empty() {
        let mut args = vec!["install", "-y", "-qq", "-t", "bookworm-backports"];
        args.extend(&bpo);
        apt(&args)?;
    }
    if !plain.is_empty() {
        let mut args = vec!["install", "-y", "-qq"];
        args.extend(&plain);
        apt(&args)?;
    }
    let still: Vec<&str> = tools.iter().filter(|t| !Path::new(t.path).exists()).map(|t| t.path).collect();
    if !still.is_empty() {
        bail!("apt finished but these are still missing: {}", still.join(", "));
    }
    Ok(())
}

/// How long apt waits for dpkg's lock, as an apt option.
const APT_LOCK_WAIT: &str = "DPkg::Lock::Timeout=600";

fn apt(args: &[&str]) -> anyhow::Result<()> {
    // Another apt (a test lane installing its own tool, the host's timers) may hold dpkg's
    // lock for a while: wait for it rather than fail the build.
    let status = Command::new("apt-get")
        .args(["-o", APT_LOCK_WAIT])
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get")?;
    if !status.success() {
        bail!("apt-get {} failed: {status}", args.join(" "));
    }
    Ok(())
}

fn is_bookworm() -> bool {
    std::fs::read_to_string("/etc/os-release").is_ok_and(|s| s.contains("VERSION_CODENAME=bookworm"))
}
