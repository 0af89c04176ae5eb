//! `nasos build`: recipe → plan → rootfs (+ ZFS module) → verified root + initramfs → UKI →
//! A/B disk, each stage cached by content.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use nasos_board::Plan;
use nasos_layout::cmdline::RootArgs;
use nasos_layout::entry;
use nasos_layout::paths::initramfs as initrd_paths;

use crate::archive::SOURCES;
use crate::disk::{self, Guids, Layout};
use crate::initramfs::{Cpio, Entry};
use crate::lock::{self, Lock};
use crate::root::{self, Binaries};
use crate::rootfs::{self, Cache};
use crate::stage::{Key, Stages, write_atomic};
use crate::{host, secureboot, uki, zfs};

/// Bumped when a stage's own logic changes in a way its inputs do not show.
const STAGE_LOGIC: &str = "nasos-build-2";
const ESP_MIB: u64 = 96;
const DATA_MIB: u64 = 256;
const DEFAULT_SLOT_MIB: u64 = 1024;

pub struct Options {
    pub recipe: PathBuf,
    pub out: PathBuf,
    pub update_lock: bool,
    /// Redo every stage (the ZFS module excepted: it is cached by kernel, ZFS version and build
    /// root, and checked against its record).
    pub rebuild: bool,
    /// The Secure Boot db key, where it is not beside the recipe's certificate.
    pub secure_boot_key: Option<PathBuf>,
}

pub struct Outputs {
    pub disk_raw: PathBuf,
    pub disk_qcow2: PathBuf,
    pub uki: PathBuf,
    /// The root filesystem with its verity tree after it, as a slot holds them.
    pub root: PathBuf,
    /// The root's verity parameters (what the UKI's command line carries).
    pub verity: nasos_layout::cmdline::Verity,
    pub stages: Stages,
}

pub fn build(opts: &Options, plan: &Plan) -> anyhow::Result<Outputs> {
    host::ensure(host::BUILD)?;
    crate::userns::check()?;
    // What nasos writes into the tree gets its modes from the umask: the same for every user
    // and host, so two builds make the same bytes.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    if plan.image.emulated_board {
        // An image for the emulated twin is built to be booted: have QEMU and OVMF ready too.
        host::ensure(host::QEMU)?;
    }
    let signer = match secureboot::db_cert(&opts.recipe, plan) {
        Some(cert) => {
            host::ensure(host::SIGN)?;
            if plan.image.emulated_board {
                host::ensure(host::SECURE_QEMU)?;
            }
            let key = opts.secure_boot_key.clone().unwrap_or_else(|| cert.with_extension("key"));
            let s = secureboot::Signer { cert, key };
            s.check()?;
            Some(s)
        }
        None if opts.secure_boot_key.is_some() => {
            bail!("--secure-boot-key was given, but {} has no [secure_boot] db to sign for", opts.recipe.display())
        }
        None => None,
    };
    std::fs::create_dir_all(&opts.out).with_context(|| format!("creating {}", opts.out.display()))?;
    let cache = Cache::open()?;
    let bins = Binaries::beside_self()?;
    let plan_json = serde_json::to_string_pretty(plan)?;
    let lock_path = lock::path_for(&opts.recipe);
    let locked = if opts.update_lock { None } else { Lock::read(&lock_path)? };
    let mut stages = Stages::new(&opts.out)?;
    stages.force = opts.rebuild;
    // The later stages' logic lives in this binary: a different nasos redoes them.
    let tool = crate::stage::sha256_file(&std::env::current_exe()?)?;

    // Root filesystem, from the lock when there is one.
    let epoch = locked.as_ref().map_or_else(now_day, |l| l.epoch);
    let rootfs_key = |lock: Option<&Lock>| -> anyhow::Result<Key> {
        let mut k = Key::new("rootfs");
        k.str(STAGE_LOGIC).str(&SOURCES.join("\n")).str(&plan.packages.join(","));
        // The image's packages only: the ZFS build root's do not change the tarball.
        k.str(&lock.map(|l| l.image_part().to_toml()).transpose()?.unwrap_or_default());
        Ok(k)
    };
    let key = rootfs_key(locked.as_ref())?;
    let tar = cache.root.join("rootfs").join(format!("{}.tar", key.hex()));
    let resolved_path = tar.with_extension("lock");
    let rootfs_lock = cache.lock("rootfs")?;
    stages.run_keyed("rootfs", &key, &[&tar, &resolved_path], || {
        // mmdebstrap picks its output format from the extension: keep `.tar` last.
        let tmp = crate::stage::Scratch::at(tar.with_extension(format!("tmp{}.tar", std::process::id())));
        let resolved = rootfs::build(&cache, &plan.packages, locked.as_ref(), epoch, &tmp)?;
        if let Some(l) = &locked {
            l.check(&resolved)?;
        }
        std::fs::rename(&tmp, &tar)?;
        write_atomic(&resolved_path, resolved.to_toml()?.as_bytes())?;
        Ok(format!("{} packages, {} MiB", resolved.packages.len(), mib(&tar)))
    })?;
    let resolved: Lock =
        toml::from_str(&std::fs::read_to_string(&resolved_path)?).context("reading the resolved package list")?;
    if locked.is_none() {
        // Next time the lock exists: make the same tarball answer to the locked key too.
        let locked_key = rootfs_key(Some(&resolved))?;
        let again = cache.root.join("rootfs").join(format!("{}.tar", locked_key.hex()));
        if !again.exists() {
            std::fs::hard_link(&tar, &again).or_else(|_| std::fs::copy(&tar, &again).map(|_| ()))?;
            std::fs::copy(&resolved_path, again.with_extension("lock"))?;
            crate::stage::record_cache_entry(&locked_key, &[&again, &again.with_extension("lock")])?;
        }
    }
    drop(rootfs_lock);

    // ZFS module, when the image has pools, from the build root the lock names.
    let locked_build = locked.as_ref().map_or(&[][..], |l| &l.build_packages[..]);
    let (zfs_dir, build_root) = if plan.pools.is_empty() {
        (None, Vec::new())
    } else {
        let v = &zfs::versions(&resolved)?;
        let t = std::time::Instant::now();
        let module = {
            let _held = cache.lock("zfs")?;
            zfs::ensure(&cache, v, locked_build, epoch)?
        };
        if let Some(l) = &locked
            && !l.build_packages.is_empty()
        {
            l.check_build(&module.build_root)?;
        }
        stages.timings.push(crate::stage::Timing {
            stage: "zfs",
            took: t.elapsed(),
            cached: !module.built,
            note: format!(
                "zfs {} for {}, build root of {} locked packages",
                v.zfs_version,
                v.kernel_release,
                module.build_root.len()
            ),
        });
        (Some(module.dir), module.build_root)
    };
    // A new lock is written once everything it records was resolved; a lock from before build
    // roots were locked gets its build root added, the image's packages untouched.
    let full = Lock { build_packages: build_root, ..resolved.clone() };
    match &locked {
        None => {
            write_atomic(&lock_path, full.to_toml()?.as_bytes())?;
            eprintln!("nasos: wrote {}", lock_path.display());
        }
        Some(l) if l.build_packages.is_empty() && !full.build_packages.is_empty() => {
            let added = Lock { build_packages: full.build_packages.clone(), ..l.clone() };
            write_atomic(&lock_path, added.to_toml()?.as_bytes())?;
            eprintln!(
                "nasos: {} had no ZFS build root: recorded the {} packages the module was built with (commit it)",
                lock_path.display(),
                added.build_packages.len()
            );
        }
        Some(_) => {}
    }
    let (kernel_release, _) = zfs::kernel(&resolved)?;

    // Verified root, initramfs and kernel: they share one unpacked tree.
    let root_img = opts.out.join("root.img");
    let initrd = opts.out.join("initrd.cpio");
    let vmlinuz = opts.out.join("vmlinuz");
    let verity_file = opts.out.join("verity.txt");
    // The boot chain, from the image's own systemd-boot-efi (locked like every package).
    let boot_efi = opts.out.join("systemd-bootx64.efi");
    let stub = opts.out.join("linuxx64.efi.stub");
    let mut k = Key::new("root");
    k.str(STAGE_LOGIC).str(&tool).str(&key.hex()).str(&plan_json);
    for src in bins.all() {
        k.file(src)?;
    }
    if let Some(d) = &zfs_dir {
        // The modules' bytes, not their directory: a rebuilt module makes a new root.
        for m in zfs::modules_in(d) {
            k.str(&m).file(&d.join(&m))?;
        }
        k.str(zfs::PREPARED);
    }
    if let Some(s) = &signer {
        // Signed modules: their signatures follow from the modules and the certificate (the
        // key is checked to be the certificate's).
        k.str("signed-modules").file(&s.cert)?;
    }
    stages.run("root", &k, &[&root_img, &initrd, &vmlinuz, &verity_file, &boot_efi, &stub], || {
        let tree = opts.out.join("tree");
        root::assemble(&tar, &tree, plan, &plan_json, &bins)?;
        if let Some(d) = &zfs_dir {
            let prepared = opts.out.join("zfs-modules");
            let _ = std::fs::remove_dir_all(&prepared);
            let names = zfs::prepare(d, &prepared)?;
            match &signer {
                Some(s) => {
                    // Under Secure Boot the kernel is locked down and loads only signed modules;
                    // Debian's kernel checks them against the UEFI db.
                    let signed = opts.out.join("signed-modules");
                    let _ = std::fs::remove_dir_all(&signed);
                    secureboot::sign_modules(s, &prepared, &names, &signed)?;
                    zfs::install(&signed, &tree, &kernel_release)?;
                    std::fs::remove_dir_all(&signed)?;
                }
                None => zfs::install(&prepared, &tree, &kernel_release)?,
            }
            std::fs::remove_dir_all(&prepared)?;
        }
        let (kept, removed) = root::prune_modules(&tree, &kernel_release, plan)?;
        let tree_mib = root::tree_size(&tree) >> 20;
        initramfs(&tree, &kernel_release, plan, &bins.initramfs_init, &initrd)?;
        std::fs::copy(tree.join("boot").join(format!("vmlinuz-{kernel_release}")), &vmlinuz)
            .context("copying the kernel")?;
        for (from, to) in [(uki::BOOT, &boot_efi), (uki::STUB, &stub)] {
            std::fs::copy(tree.join(from), to)
                .with_context(|| format!("copying /{from} out of the image (its systemd-boot-efi package)"))?;
        }
        let tmp = crate::stage::Scratch::beside(&root_img);
        root::erofs(&tree, &tmp, epoch, &root::fixed_uuid(&k.hex()))?;
        let erofs_mib = mib(&tmp);
        let v = root::verity(&tmp)?;
        std::fs::rename(&tmp, &root_img)?;
        write_atomic(&verity_file, v.to_arg().as_bytes())?;
        crate::userns::remove_tree(&tree)?;
        if let Some(budget) = plan.image.size_budget_mib
            && erofs_mib > u64::from(budget)
        {
            bail!("the root filesystem is {erofs_mib} MiB, over the recipe's budget of {budget} MiB");
        }
        Ok(format!("tree {tree_mib} MiB → erofs {erofs_mib} MiB ({kept} kernel modules kept, {removed} removed), initramfs {} MiB", mib(&initrd)))
    })?;

    // UKI.
    // The root stage's record of its verity parameters, read back through the same contract the
    // initramfs uses: a record that does not parse is a broken cache, not a boot failure later.
    let verity_arg = std::fs::read_to_string(&verity_file)?;
    let verity = RootArgs::parse(&verity_arg)
        .with_context(|| format!("{} is not a verity record; rerun with --rebuild", verity_file.display()))?
        .verity;
    let guids = Guids::derive(&verity.root_hash)?;
    let mut cmdline: Vec<String> = plan.kernel.cmdline.clone();
    cmdline.push("loglevel=4".into());
    cmdline.extend(RootArgs { verity: verity.clone(), init: None }.to_args());
    let cmdline = cmdline.join(" ");
    let uki_path = opts.out.join("nasos.efi");
    // What the ESP boots: systemd-boot as packaged, or signed for the recipe's db.
    let boot_signed = opts.out.join("systemd-bootx64.signed.efi");
    let esp_boot = if signer.is_some() { boot_signed.clone() } else { boot_efi.clone() };
    let mut k = Key::new("uki");
    k.str(STAGE_LOGIC).str(&tool).str(&cmdline).file(&vmlinuz)?.file(&initrd)?.file(&stub)?;
    let mut uki_outputs = vec![uki_path.as_path()];
    if let Some(s) = &signer {
        k.str("signed").str(&epoch.to_string()).file(&s.cert)?.file(&boot_efi)?;
        uki_outputs.push(boot_signed.as_path());
    }
    stages.run("uki", &k, &uki_outputs, || {
        let cmd_file = opts.out.join("cmdline.txt");
        std::fs::write(&cmd_file, &cmdline)?;
        let osrel = opts.out.join("os-release");
        std::fs::write(
            &osrel,
            format!("NAME=\"nasos\"\nID=nasos\nVERSION_ID={v}\nPRETTY_NAME=\"nasos {v} ({n})\"\nIMAGE_ID={n}\nIMAGE_VERSION={v}\n", v = plan.image.version, n = plan.image.name),
        )?;
        let tmp = crate::stage::tmp_path(&uki_path);
        // Under Secure Boot the running kernel is locked down, and a fast reboot's
        // kexec_file_load takes only a kernel signed by a key it trusts — the db's (the platform
        // keyring), not Debian's: the UKI carries the kernel re-signed for the recipe's db.
        let signed_kernel = opts.out.join("vmlinuz.signed");
        let kernel = match &signer {
            Some(s) => {
                s.resign_efi(&vmlinuz, &signed_kernel, epoch)?;
                signed_kernel.as_path()
            }
            None => vmlinuz.as_path(),
        };
        uki::build(&stub, &uki::Parts { os_release: &osrel, cmdline: &cmd_file, kernel, initrd: &initrd }, &tmp, epoch)?;
        let _ = std::fs::remove_file(&signed_kernel);
        let signed = match &signer {
            // Signing is the very last change: objcopy on a signed UKI breaks its signature.
            Some(s) => {
                let unsigned = tmp.with_extension("unsigned");
                std::fs::rename(&tmp, &unsigned)?;
                s.sign_efi(&unsigned, &tmp, epoch)?;
                std::fs::remove_file(&unsigned)?;
                let btmp = crate::stage::tmp_path(&boot_signed);
                s.sign_efi(&boot_efi, &btmp, epoch)?;
                std::fs::rename(&btmp, &boot_signed)?;
                format!(", systemd-boot, the UKI and its kernel signed for {}", s.subject_cn()?)
            }
            None => String::new(),
        };
        std::fs::rename(&tmp, &uki_path)?;
        Ok(format!("{} MiB{signed}", mib(&uki_path)))
    })?;

    // The disk.
    let disk_raw = opts.out.join("disk.img");
    let disk_qcow2 = opts.out.join("disk.qcow2");
    let slot_mib = plan.image.size_budget_mib.map_or(DEFAULT_SLOT_MIB, u64::from);
    // The factory entry is blessed from the start: a freshly flashed box has no earlier version
    // to fall back to, so counting its tries would only delay the reboot-loop guard. Upgrades
    // install their entries with a counter, beside the running one.
    let entry = entry::blessed_path(&plan.image.version);
    let mut k = Key::new("disk");
    k.str(STAGE_LOGIC).str(&tool).str(&entry).str(&format!("{ESP_MIB}/{slot_mib}/{DATA_MIB}/{epoch}"));
    k.file(&uki_path)?.file(&root_img)?.file(&esp_boot)?;
    stages.run("disk", &k, &[&disk_raw, &disk_qcow2], || {
        let boot = std::fs::read(&esp_boot).context("reading systemd-boot")?;
        let esp = vec![
            ("EFI/BOOT/BOOTX64.EFI".to_string(), boot.clone()),
            ("EFI/systemd/systemd-bootx64.efi".to_string(), boot),
            ("loader/loader.conf".to_string(), b"timeout 0\neditor no\nauto-entries no\nauto-firmware no\n".to_vec()),
            (entry.clone(), std::fs::read(&uki_path)?),
        ];
        let tmp = crate::stage::Scratch::beside(&disk_raw);
        disk::build(&tmp, &Layout { esp_mib: ESP_MIB, slot_mib, data_mib: DATA_MIB }, &guids, &esp, &root_img, epoch)?;
        let qtmp = crate::stage::Scratch::beside(&disk_qcow2);
        crate::progress::run_tool(
            std::process::Command::new("qemu-img").args(["convert", "-p", "-O", "qcow2"]).arg(&*tmp).arg(&*qtmp),
            "qemu-img convert",
        )?;
        std::fs::rename(&tmp, &disk_raw)?;
        std::fs::rename(&qtmp, &disk_qcow2)?;
        Ok(format!("{} MiB raw, {} MiB qcow2", std::fs::metadata(&disk_raw)?.len() >> 20, mib(&disk_qcow2)))
    })?;
    Ok(Outputs { disk_raw, disk_qcow2, uki: uki_path, root: root_img, verity, stages })
}

/// Writes the initramfs: its init program, that program's libraries from the image, the boot
/// modules.
fn initramfs(tree: &Path, kernel_release: &str, plan: &Plan, init: &Path, out: &Path) -> anyhow::Result<()> {
    let mut c = Cpio::default();
    c.add(initrd_paths::INIT, Entry::File { data: std::fs::read(init)?, mode: 0o755 });
    c.add("/dev/console", Entry::CharDev { major: 5, minor: 1, mode: 0o600 });
    c.add(initrd_paths::MARKER, Entry::File { data: b"NAME=nasos-initramfs\n".to_vec(), mode: 0o644 });
    if plan.image.development {
        // Only a development image's initramfs takes `nasos.init=` from the command line.
        c.add(initrd_paths::DEVELOPMENT, Entry::File { data: Vec::new(), mode: 0o644 });
    }
    for lib in crate::initramfs::needed_libraries(init)? {
        let (src, dest) = if lib.starts_with("ld-linux") {
            (tree.join("usr/lib/x86_64-linux-gnu").join(&lib), format!("/lib64/{lib}"))
        } else {
            (tree.join("usr/lib/x86_64-linux-gnu").join(&lib), format!("/lib/x86_64-linux-gnu/{lib}"))
        };
        let data =
            std::fs::read(&src).with_context(|| format!("the initramfs init needs {lib}, which the image lacks"))?;
        c.add(&dest, Entry::File { data, mode: 0o755 });
    }
    let mut wanted = plan.kernel.initramfs_modules.clone();
    wanted.push("overlay".into());
    let modules = crate::initramfs::resolve_modules(tree, kernel_release, &wanted)?;
    let mut list = String::new();
    for rel in &modules {
        let name = rel.rsplit('/').next().unwrap_or(rel).split(".ko").next().unwrap_or(rel);
        let dest = format!("/lib/modules/{name}.ko");
        c.add(&dest, Entry::File { data: crate::initramfs::module_bytes(tree, kernel_release, rel)?, mode: 0o644 });
        list.push_str(&dest);
        list.push('\n');
    }
    c.add(initrd_paths::MODULE_LIST, Entry::File { data: list.into_bytes(), mode: 0o644 });
    let tmp = crate::stage::tmp_path(out);
    let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
    c.write(&mut f)?;
    drop(f);
    std::fs::rename(&tmp, out)?;
    Ok(())
}

fn mib(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len().div_ceil(1 << 20)).unwrap_or(0)
}

/// Today at 00:00 UTC, the SOURCE_DATE_EPOCH a new lock records.
fn now_day() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    now - now % 86_400
}
