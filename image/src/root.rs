//! The verified root: the rootfs tarball unpacked, the ZFS module, nasos's binaries and the plan
//! added, everything the appliance does not need removed, packed as EROFS, and a dm-verity hash
//! tree appended. Every input is fixed (timestamps, UUIDs, salt), so the same inputs give the
//! same bytes.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use nasos_board::Plan;

use nasos_board::recipe::RootLogin;
use nasos_layout::agents::{self, Place};
use nasos_layout::cmdline::Verity;
use nasos_layout::paths;

use crate::stage::{hex, sha256_file};

pub const BLOCK: u64 = 4096;

/// The binaries nasos puts into an image, from the build host's cargo target directory.
pub struct Binaries {
    /// Programs of the root filesystem: (path on the host, path in the image).
    pub files: Vec<(PathBuf, String)>,
    /// The initramfs's init.
    pub initramfs_init: PathBuf,
}

impl Binaries {
    /// Finds them next to the running `nasos` (cargo builds all of a workspace's binaries there).
    pub fn beside_self() -> anyhow::Result<Binaries> {
        let exe = std::env::current_exe().context("locating nasos")?;
        let dir = exe.parent().context("nasos has no directory")?;
        let mut files = Vec::new();
        let mut initramfs_init = None;
        for program in agents::programs() {
            let p = dir.join(program.binary);
            if !p.exists() {
                bail!(
                    "{} is missing: build the whole workspace first (cargo build --release --workspace)",
                    p.display()
                );
            }
            match program.place {
                Place::Root => files.push((p, program.dest.to_string())),
                Place::Initramfs => initramfs_init = Some(p),
            }
        }
        let initramfs_init = initramfs_init.context("the program list names no initramfs init")?;
        Ok(Binaries { files, initramfs_init })
    }

    /// Every file, for cache keys.
    pub fn all(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|(p, _)| p.as_path()).chain(std::iter::once(self.initramfs_init.as_path()))
    }
}

/// Unpacks the rootfs and shapes it into the appliance's root tree.
pub fn assemble(rootfs_tar: &Path, tree: &Path, plan: &Plan, plan_json: &str, bins: &Binaries) -> anyhow::Result<()> {
    crate::userns::remove_tree(tree)?;
    std::fs::create_dir_all(tree)?;
    run(
        crate::userns::tree_command("tar")
            // Not the device nodes of /dev: the appliance mounts devtmpfs there, and a build as
            // a normal user may not make them (so the tree is the same either way).
            .args(["-x", "-p", "--numeric-owner", "--exclude=./dev/*", "-f"])
            .arg(rootfs_tar)
            .arg("-C")
            .arg(tree),
        "unpacking the rootfs",
    )?;
    for (src, dest) in &bins.files {
        install(tree, src, dest, 0o755)?;
    }
    write(tree, paths::PLAN, plan_json.as_bytes(), 0o644)?;
    write(tree, "/etc/hostname", format!("{}\n", plan.image.hostname).as_bytes(), 0o644)?;
    write(tree, "/etc/machine-id", b"", 0o444)?;
    write(tree, "/etc/fstab", b"# nasinit mounts what the appliance needs; the root is read-only.\n", 0o644)?;
    let release = format!(
        "NAME=\"nasos\"\nID=nasos\nID_LIKE=debian\nPRETTY_NAME=\"nasos {v} ({n})\"\nIMAGE_ID={n}\nIMAGE_VERSION={v}\nVERSION_ID={v}\n",
        n = plan.image.name,
        v = plan.image.version
    );
    write(tree, paths::OS_RELEASE, release.as_bytes(), 0o644)?;
    write(tree, paths::BAY_RULES, nasos_board::plan::udev::bay_rules(&plan.bays).as_bytes(), 0o644)?;
    // Only where the storage agent runs, which creates the flag: without it blkid would never
    // probe a drive.
    if !plan.pools.is_empty() {
        let rules = nasos_board::plan::udev::boot_rules(paths::IMPORT_DONE);
        write(tree, paths::BOOT_UDEV_RULES, rules.as_bytes(), 0o644)?;
    }
    for (rules, why) in paths::MASKED_UDEV_RULES {
        write(tree, rules, format!("# {why}\n").as_bytes(), 0o644)?;
    }
    // Written whatever the plan: a box with no links loads none, and the file shows what it would.
    write(tree, paths::FIREWALL_RULES, nasos_board::plan::firewall::ruleset(plan).as_bytes(), 0o644)?;
    write(tree, paths::WATCHDOG_MODPROBE, paths::WATCHDOG_MODPROBE_OPTIONS.as_bytes(), 0o644)?;
    set_root_password(tree, plan)?;
    if let Some(k) = &plan.kerberos {
        write(tree, "/etc/krb5.conf", k.krb5_conf().as_bytes(), 0o644)?;
        write(tree, "/etc/idmapd.conf", k.idmapd_conf().as_bytes(), 0o644)?;
        add_accounts(tree, &k.users)?;
        // mountd offers the krb5 flavours on the NFSv4 pseudo-root only when /etc/krb5.keytab
        // exists (nfs-utils 2.6.3+); without them a krb5p client's walk from the root is
        // refused (mount: "Operation not permitted"). The link resolves once a keytab is joined
        // onto the state partition, so until then the pseudo-root offers sys only, as it should.
        let keytab = tree.join("etc/krb5.keytab");
        let _ = std::fs::remove_file(&keytab);
        std::os::unix::fs::symlink(format!("{}/{}", nasos_layout::state::MOUNT, nasos_layout::state::KEYTAB), &keytab)?;
    }
    // The kernel looks for /sbin/init; the initramfs execs nasinit directly, but a rescue boot
    // with init= pointing at the usual place should land in nasinit too.
    let init = tree.join("usr/sbin/init");
    let _ = std::fs::remove_file(&init);
    std::os::unix::fs::symlink("nasinit", &init)?;
    for dir in ["export", "var/lib/nasos", "var/log/nasinit"] {
        std::fs::create_dir_all(tree.join(dir))?;
    }
    prune(tree)?;
    Ok(())
}

/// Sets root's password field in /etc/shadow from the plan: the hash for password login, `*`
/// otherwise (no password matches it; autologin needs none, agetty logs root in). Not `!`:
/// OpenSSH takes that for a locked account and would refuse even a replication peer's key.
fn set_root_password(tree: &Path, plan: &Plan) -> anyhow::Result<()> {
    let path = tree.join("etc/shadow");
    let shadow = std::fs::read_to_string(&path).context("reading /etc/shadow of the rootfs")?;
    let field = match (plan.console.root_login, &plan.console.root_password_hash) {
        (RootLogin::Password, Some(h)) => h.clone(),
        _ => "*".to_string(),
    };
    let mut out = String::new();
    for line in shadow.lines() {
        let mut f: Vec<String> = line.split(':').map(String::from).collect();
        if f.first().map(String::as_str) == Some("root") && f.len() > 2 {
            f[1] = field.clone();
        }
        out.push_str(&f.join(":"));
        out.push('\n');
    }
    std::fs::write(&path, out)?;
    Ok(())
}

/// The accounts the realm's principals map to: no password, no shell, no home; they exist so
/// files have owners.
fn add_accounts(tree: &Path, users: &[(String, u32, u32)]) -> anyhow::Result<()> {
    let read = |f: &str| std::fs::read_to_string(tree.join(f)).with_context(|| format!("reading /{f} of the rootfs"));
    let (mut passwd, mut group, mut shadow) = (read("etc/passwd")?, read("etc/group")?, read("etc/shadow")?);
    let taken = |table: &str, name: &str, id: u32| {
        table.lines().any(|l| {
            let f: Vec<&str> = l.split(':').collect();
            f.first() == Some(&name) || f.get(2) == Some(&id.to_string().as_str())
        })
    };
    for (name, uid, gid) in users {
        if taken(&passwd, name, *uid) {
            anyhow::bail!(
                "[kerberos] user `{name}` (uid {uid}) collides with an account of the image's packages; choose another name or uid"
            );
        }
        passwd.push_str(&format!("{name}:x:{uid}:{gid}::/nonexistent:/usr/sbin/nologin\n"));
        shadow.push_str(&format!("{name}:*:1::::::\n"));
        if !taken(&group, name, *gid) {
            group.push_str(&format!("{name}:x:{gid}:\n"));
        }
    }
    std::fs::write(tree.join("etc/passwd"), passwd)?;
    std::fs::write(tree.join("etc/group"), group)?;
    std::fs::write(tree.join("etc/shadow"), shadow)?;
    Ok(())
}

/// Removes what an appliance never reads, and files that would make two builds differ.
fn prune(tree: &Path) -> anyhow::Result<()> {
    for rel in [
        "boot/initrd.img",
        "initrd.img",
        "initrd.img.old",
        "vmlinuz.old",
        "var/cache/apt",
        "var/lib/apt/lists",
        "var/cache/ldconfig/aux-cache",
        "var/cache/debconf/config.dat-old",
        "var/cache/debconf/templates.dat-old",
        "var/lib/dpkg/status-old",
        "var/lib/dpkg/diversions-old",
        "var/log/apt",
        "var/log/dpkg.log",
        "var/log/alternatives.log",
        "var/log/bootstrap.log",
        "usr/include",
        // Per-machine identities that package scripts generate at random: they belong to each
        // box (made on first boot), not to an image every box shares, and they would make two
        // builds differ.
        "etc/hostid",
        "etc/nvme/hostid",
        "etc/nvme/hostnqn",
        "usr/share/doc-base",
        "usr/share/bug",
    ] {
        let p = tree.join(rel);
        if p.is_dir() && !p.is_symlink() {
            // Some hold directories of the image's system users (apt's `partial`).
            crate::userns::remove_tree(&p)?;
        } else if p.exists() || p.is_symlink() {
            std::fs::remove_file(&p)?;
        }
    }
    // openssh-server's script makes host keys at install: secrets every box of the image would
    // share. nasos's sshd uses each box's own replication key instead.
    if let Ok(dir) = std::fs::read_dir(tree.join("etc/ssh")) {
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with("ssh_host_") {
                std::fs::remove_file(e.path())?;
            }
        }
    }
    remove_pycache(tree)?;
    for e in std::fs::read_dir(tree.join("boot"))?.flatten() {
        if e.file_name().to_string_lossy().starts_with("initrd.img") {
            std::fs::remove_file(e.path())?;
        }
    }
    Ok(())
}

/// Removes Python's byte-code caches. They are a build-time artefact, and not a reproducible one:
/// the scripts that write them pick timestamp- or hash-checked files depending on what ran
/// first (a build as a normal user got timestamped ones where root's got hashed ones). Nothing on
/// the appliance runs Python in its serving path; a tool that does compiles in memory.
fn remove_pycache(tree: &Path) -> anyhow::Result<()> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let Ok(t) = e.file_type() else { continue };
            if !t.is_dir() {
                continue;
            }
            if e.file_name() == "__pycache__" {
                found.push(e.path());
            } else {
                walk(&e.path(), found);
            }
        }
    }
    let mut found = Vec::new();
    for top in ["usr/lib", "usr/share"] {
        walk(&tree.join(top), &mut found);
    }
    for d in found {
        crate::userns::remove_tree(&d)?;
    }
    Ok(())
}

/// Modules kept whatever the plan says: filesystems and helpers the kernel asks for by name at
/// run time (mounting the ESP wants nls_cp437; ext4 wants crc32c), which no dependency lists,
/// and the drivers of a USB stick, which udev loads when one appears.
const ALWAYS_MODULES: &[&str] = &[
    "ext4",
    "vfat",
    "nls_cp437",
    "nls_ascii",
    "nls_iso8859_1",
    "nls_utf8",
    "overlay",
    "loop",
    "crc32c_generic",
    "efi_pstore",
    // systemd-boot's variables (which entry booted, its tries) for blessing.
    "efivarfs",
    // A USB stick carrying an upgrade bundle: the controller's driver is loaded at boot (the
    // plan's base module set; nothing replays the devices present from power-on), udev loads
    // the stick's when one is plugged in.
    "xhci_pci",
    "usb_storage",
    "uas",
    "sd_mod",
];
/// Subtrees kept whole: small, generic, and loaded on demand by the kernel itself.
const ALWAYS_DIRS: &[&str] = &["kernel/crypto/", "kernel/lib/", "kernel/fs/nls/", "updates/"];

/// Removes every kernel module the board and plan do not need, keeping their dependencies (hard
/// and soft), then rebuilds the module index. Returns (kept, removed).
pub fn prune_modules(tree: &Path, kernel_release: &str, plan: &Plan) -> anyhow::Result<(usize, usize)> {
    let mut wanted: Vec<String> =
        plan.kernel.modules.iter().chain(plan.kernel.initramfs_modules.iter()).cloned().collect();
    wanted.extend(ALWAYS_MODULES.iter().map(|m| m.to_string()));
    let keep = crate::initramfs::resolve_modules(tree, kernel_release, &wanted)?;
    let dir = tree.join("usr/lib/modules").join(kernel_release);
    let (mut kept, mut removed) = (0, 0);
    let mut stack = vec![dir.join("kernel")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)?.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let rel = p.strip_prefix(&dir).map(|r| r.display().to_string()).unwrap_or_default();
            if !rel.contains(".ko") {
                continue;
            }
            if keep.contains(&rel) || ALWAYS_DIRS.iter().any(|a| rel.starts_with(a)) {
                kept += 1;
            } else {
                std::fs::remove_file(&p)?;
                removed += 1;
            }
        }
    }
    decompress_modules(&dir)?;
    run(
        crate::userns::tree_command("chroot").arg(tree).args(["/usr/sbin/depmod", kernel_release]),
        "depmod in the image tree",
    )?;
    Ok((kept, removed))
}

/// Stores the kept modules uncompressed: the EROFS root compresses them already (lz4, which the
/// kernel reads back far faster), and an xz module is decompressed again on every boot before it
/// loads, on the boot's critical path. A signed module keeps its signature (it is part of the
/// uncompressed bytes). xz runs inside the tree's namespace so the files keep their owners.
fn decompress_modules(dir: &Path) -> anyhow::Result<()> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)?.flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            } else if p.to_string_lossy().ends_with(".ko.xz") {
                found.push(p);
            }
        }
    }
    found.sort();
    for chunk in found.chunks(256) {
        run(crate::userns::tree_command("xz").args(["-d", "-q"]).args(chunk), "decompressing the kernel modules")?;
    }
    Ok(())
}

/// Packs the tree as EROFS with fixed timestamps and UUID.
pub fn erofs(tree: &Path, out: &Path, epoch: u64, uuid: &str) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(out);
    run(
        // Inside the namespace when not root, so the files keep their owners.
        crate::userns::tree_command("mkfs.erofs")
            .arg("-zlz4hc")
            .arg(format!("-T{epoch}"))
            .arg(format!("-U{uuid}"))
            .arg("--quiet")
            .arg(out)
            .arg(tree),
        "mkfs.erofs",
    )?;
    // The verity hash tree goes right after the data; keep the data a whole number of blocks.
    let len = std::fs::metadata(out)?.len();
    if len % BLOCK != 0 {
        let f = std::fs::OpenOptions::new().write(true).open(out)?;
        f.set_len(len.div_ceil(BLOCK) * BLOCK)?;
    }
    Ok(())
}

/// Appends a dm-verity hash tree to an EROFS image, in place. Salt and UUID derive from the data,
/// so the result is reproducible.
pub fn verity(image: &Path) -> anyhow::Result<Verity> {
    let data = std::fs::metadata(image)?.len();
    let digest = sha256_file(image)?;
    let salt = digest[..64].to_string();
    let uuid = uuid_from(&digest[..32]);
    let out = Command::new("veritysetup")
        .arg("format")
        .arg(image)
        .arg(image)
        .arg(format!("--data-blocks={}", data / BLOCK))
        .arg(format!("--hash-offset={data}"))
        .arg(format!("--salt={salt}"))
        .arg(format!("--uuid={uuid}"))
        .output()
        .context("running veritysetup")?;
    if !out.status.success() {
        bail!("veritysetup format failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let root_hash = text
        .lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .map(|h| h.trim().to_string())
        .context("veritysetup printed no root hash")?;
    // The hash tree's size is not a whole number of blocks in every case; pad for the partition.
    let len = std::fs::metadata(image)?.len();
    if len % BLOCK != 0 {
        std::fs::OpenOptions::new().write(true).open(image)?.set_len(len.div_ceil(BLOCK) * BLOCK)?;
    }
    Ok(Verity { root_hash, salt, data_blocks: data / BLOCK, hash_offset: data })
}

/// A UUID string from 32 hex digits.
pub fn uuid_from(hex32: &str) -> String {
    format!("{}-{}-{}-{}-{}", &hex32[0..8], &hex32[8..12], &hex32[12..16], &hex32[16..20], &hex32[20..32])
}

pub fn fixed_uuid(seed: &str) -> String {
    use sha2::{Digest, Sha256};
    uuid_from(&hex(&Sha256::digest(seed.as_bytes()))[..32])
}

/// Disk usage of a tree in bytes (apparent sizes of regular files).
pub fn tree_size(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(m) = e.path().symlink_metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                total += m.len();
            }
        }
    }
    total
}

/// Installs a binary without its debug information (an unstripped debug build is ten times the size).
fn install(tree: &Path, src: &Path, dest: &str, mode: u32) -> anyhow::Result<()> {
    let p = tree.join(dest.trim_start_matches('/'));
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let _ = std::fs::remove_file(&p);
    run(Command::new("objcopy").arg("--strip-debug").arg(src).arg(&p), "objcopy --strip-debug")?;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn write(tree: &Path, dest: &str, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let p = tree.join(dest.trim_start_matches('/'));
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // Replace, never write through, a symlink the rootfs may have at that path.
    let _ = std::fs::remove_file(&p);
    std::fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))?;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

pub fn run(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    crate::progress::status(what);
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}
