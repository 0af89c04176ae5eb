//! `nasos`: the host CLI, a thin layer of argument parsing and printing over `nasos_image`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use nasos_board::{Loaded, Report, load_recipe_file, schema};
use nasos_image::{build, bundle, flash, secureboot, vm};

#[derive(Parser)]
#[command(name = "nasos", version, about = "Build and boot nasos, the NFS-over-RDMA storage appliance firmware")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check a recipe and its board; print every mistake with file:line:col and how to fix it.
    ///
    /// Exits 0 when the recipe is valid (warnings may still be printed), 1 when it is not.
    Validate {
        /// The recipe, e.g. recipes/qemu-dev.toml.
        recipe: PathBuf,
        /// One line per finding (`file:line:col: error: …`), for editors and scripts.
        #[arg(long)]
        short: bool,
    },
    /// Print the plan: the fully resolved description of the image a recipe builds.
    Plan {
        /// The recipe, e.g. recipes/qemu-dev.toml.
        recipe: PathBuf,
        /// Print the plan as JSON (what the image carries at /usr/lib/nasos/plan.json).
        #[arg(long)]
        json: bool,
    },
    /// Print what the image is made of, as SPDX 2.3 JSON: every package the recipe's lock pins,
    /// the ZFS module, nasos's own crates. Made from the lock (`nasos build` writes it).
    Sbom {
        /// The recipe, e.g. recipes/qemu-dev.toml.
        recipe: PathBuf,
        /// Write the document to this file instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Print Kubernetes manifests for the recipe's NFS exports: for each, a StorageClass, a
    /// static PersistentVolume and a claim bound to it, for the NFS CSI driver (nfs.csi.k8s.io),
    /// over RDMA (NFS 4.2, port 20049) and over TCP. One `v1/List` for `kubectl apply -f -`.
    K8s {
        /// The recipe, e.g. recipes/qemu-dev.toml.
        recipe: PathBuf,
        /// Only this tenant's exports (claims in a namespace named after it).
        #[arg(long)]
        tenant: Option<String>,
        /// The address the cluster mounts from (default: the box's address facing the export's
        /// clients).
        #[arg(long)]
        server: Option<String>,
        /// The claims' namespace (default: the tenant's name, or `default`).
        #[arg(long)]
        namespace: Option<String>,
    },
    /// Build the image: a verified A/B disk (raw and qcow2) in build/<image name>/ (or --out).
    Build {
        /// The recipe, e.g. recipes/qemu-dev.toml.
        recipe: PathBuf,
        /// Output directory.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Resolve packages afresh — the image's and the ZFS module's build root's (so the module
        /// is built again) — and rewrite RECIPE.lock.
        #[arg(long)]
        update_lock: bool,
        /// Print the per-stage timing table.
        #[arg(long)]
        timings: bool,
        /// Redo every stage from the recipe and lock, ignoring what is cached (the ZFS module,
        /// cached by kernel, ZFS and its locked build root and checked against its record,
        /// excepted).
        #[arg(long)]
        rebuild: bool,
        /// The Secure Boot db key, where it is not beside the recipe's [secure_boot] db
        /// certificate (a product key kept off the repository).
        #[arg(long)]
        secure_boot_key: Option<PathBuf>,
    },
    /// Build the image if needed and boot it on the emulated twin board (QEMU, TCG).
    Qemu {
        /// The recipe, e.g. recipes/qemu-dev.toml.
        recipe: PathBuf,
        /// Do not put the console on this terminal (it goes to --serial, or a log file).
        #[arg(long)]
        headless: bool,
        /// Serve the serial console on this unix socket instead of the terminal.
        #[arg(long)]
        serial: Option<PathBuf>,
        /// Serve the QMP monitor on this unix socket.
        #[arg(long)]
        qmp: Option<PathBuf>,
        /// Guest memory in MiB.
        #[arg(long, default_value_t = 2048)]
        memory: u32,
        /// The appliance's virtual CPUs; more than one runs TCG multi-threaded (faster alone,
        /// nothing gained beside a client and a peer on a small host).
        #[arg(long, default_value_t = 1)]
        cpus: u32,
        /// Also boot a client VM from this recipe (e.g. recipes/qemu-client.toml) on the
        /// appliance's private network, to try the data path by hand.
        #[arg(long)]
        client: Option<PathBuf>,
        /// Serve the client's console on this unix socket (else it goes to a log file, named
        /// when the client starts).
        #[arg(long, requires = "client")]
        client_serial: Option<PathBuf>,
        /// Serve the client's QMP monitor on this unix socket (to plug a USB stick into it).
        #[arg(long, requires = "client")]
        client_qmp: Option<PathBuf>,
        /// Also boot a second appliance from this recipe (e.g. recipes/qemu-dr.toml, the
        /// disaster-recovery twin) on the same private network: a replication peer.
        #[arg(long)]
        peer: Option<PathBuf>,
        /// Serve the peer's console on this unix socket (else a log file).
        #[arg(long, requires = "peer")]
        peer_serial: Option<PathBuf>,
        /// Serve the peer's QMP monitor on this unix socket.
        #[arg(long, requires = "peer")]
        peer_qmp: Option<PathBuf>,
        /// Keep the VM's bays and EFI variables here (default build/<name>/vm; the client's and
        /// the peer's go in client/ and peer/ folders under it). A new folder means blank bays.
        #[arg(long)]
        state: Option<PathBuf>,
        /// Plug in a USB stick (FAT) holding this file, e.g. a bundle for `nasctl upgrade apply usb:`.
        #[arg(long)]
        usb: Option<PathBuf>,
    },
    /// Write a raw disk image (disk.img) to a block device and verify it by reading it back.
    ///
    /// Refuses partitions, devices with mounted filesystems, and the disk the running system
    /// is on. Without --yes it only says what it would overwrite.
    Flash {
        /// The raw image, e.g. build/ts-h1290fx/disk.img.
        image: PathBuf,
        /// The whole disk to overwrite, e.g. /dev/sdb.
        device: PathBuf,
        /// Really overwrite the device.
        #[arg(long)]
        yes: bool,
    },
    /// Make an upgrade signing key pair: DIR/NAME.pub (for recipes' [upgrade] trusted_keys) and
    /// DIR/NAME.key (keep it secret). minisign's format: `minisign -V` checks what it signs.
    Keygen {
        /// Where to write the two files.
        #[arg(long)]
        out: PathBuf,
        /// The files' name.
        #[arg(long, default_value = "nasos")]
        name: String,
        /// Make the UEFI Secure Boot keys instead: PK, KEK and db (X.509 certificates and their
        /// keys) and the owner GUID they are enrolled under. A recipe names db.crt in
        /// [secure_boot] db; `nasos qemu` enrolls all three in the VM's firmware.
        #[arg(long)]
        secure_boot: bool,
        /// Leave the secret key unencrypted (development and CI keys). Otherwise it is encrypted
        /// with a password: NASOS_KEY_PASSWORD, or asked on the terminal.
        #[arg(long)]
        no_password: bool,
    },
    /// Build the image if needed and pack it into a signed upgrade bundle
    /// (default build/<name>/<name>-<version>.nasos); or, with --inspect, say what a bundle holds.
    Bundle {
        /// The recipe. With --inspect it is optional: its trusted keys judge the signature.
        recipe: Option<PathBuf>,
        /// The minisign secret key that signs the manifest (from `nasos keygen`); an encrypted
        /// one is opened with NASOS_KEY_PASSWORD or a password asked on the terminal.
        #[arg(long, required_unless_present = "inspect")]
        key: Option<PathBuf>,
        /// Where to write the bundle.
        #[arg(long, conflicts_with = "inspect")]
        out: Option<PathBuf>,
        /// Where the image is built (default build/<name>/).
        #[arg(long, conflicts_with = "inspect")]
        build: Option<PathBuf>,
        /// Print this bundle's manifest, whether its signature is good for the recipe's keys, and
        /// whether its payloads match the manifest.
        #[arg(long)]
        inspect: Option<PathBuf>,
        /// The Secure Boot db key the image is signed with, where it is not beside the
        /// recipe's [secure_boot] db certificate.
        #[arg(long, conflicts_with = "inspect")]
        secure_boot_key: Option<PathBuf>,
    },
    /// Print the JSON Schema of recipe or board files, for editors (e.g. taplo, VS Code Even Better TOML).
    Schema {
        /// Which schema.
        #[arg(value_enum, default_value_t = SchemaKind::Recipe)]
        kind: SchemaKind,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum SchemaKind {
    Recipe,
    Board,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nasos: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Validate { recipe, short } => {
            let loaded = load(&recipe, short)?;
            Ok(match loaded {
                Some(_) => {
                    println!("{}: valid", recipe.display());
                    ExitCode::SUCCESS
                }
                None => ExitCode::from(1),
            })
        }
        Command::Plan { recipe, json } => {
            let Some(loaded) = load(&recipe, false)? else { return Ok(ExitCode::from(1)) };
            let plan = loaded.plan();
            let mut out = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut out, &plan).context("writing the plan")?;
                writeln!(out)?;
            } else {
                write!(out, "{plan}")?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::K8s { recipe, tenant, server, namespace } => {
            let Some(loaded) = load(&recipe, false)? else { return Ok(ExitCode::from(1)) };
            let opts = nasos_k8s::Options { tenant, server, namespace };
            let list = nasos_k8s::manifests(&loaded.plan(), &opts).with_context(|| recipe.display().to_string())?;
            println!("{}", serde_json::to_string_pretty(&list)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Sbom { recipe, out } => {
            let Some(loaded) = load(&recipe, false)? else { return Ok(ExitCode::from(1)) };
            let plan = loaded.plan();
            let lock_path = nasos_image::lock::path_for(&recipe);
            let lock = nasos_image::lock::Lock::read(&lock_path)?.with_context(|| {
                format!(
                    "{} does not exist: the SBOM lists what the lock pins; `nasos build {}` writes it",
                    lock_path.display(),
                    recipe.display()
                )
            })?;
            let doc =
                nasos_image::sbom::document(&plan.image.name, &plan.image.version, &lock, env!("CARGO_PKG_VERSION"))?;
            let text = serde_json::to_string_pretty(&doc)? + "\n";
            match out {
                Some(path) => {
                    nasos_image::stage::write_atomic(&path, text.as_bytes())?;
                    eprintln!("nasos: wrote {} ({} packages)", path.display(), lock.packages.len());
                }
                None => std::io::stdout().lock().write_all(text.as_bytes())?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Build { recipe, out, update_lock, timings, rebuild, secure_boot_key } => {
            let Some(loaded) = load(&recipe, false)? else { return Ok(ExitCode::from(1)) };
            let plan = loaded.plan();
            let out = out.unwrap_or_else(|| PathBuf::from("build").join(&plan.image.name));
            let opts = build::Options { recipe: recipe.clone(), out, update_lock, rebuild, secure_boot_key };
            let outputs = build::build(&opts, &plan)?;
            if timings {
                eprint!("{}", outputs.stages.table());
            }
            println!("{}", outputs.disk_raw.display());
            println!("{}", outputs.disk_qcow2.display());
            println!("{}", outputs.uki.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Qemu {
            recipe,
            headless,
            serial,
            qmp,
            memory,
            cpus,
            client,
            client_serial,
            client_qmp,
            peer,
            peer_serial,
            peer_qmp,
            state,
            usb,
        } => {
            let opts = vm::Options {
                recipe,
                headless,
                serial,
                qmp,
                memory,
                cpus,
                client,
                client_serial,
                client_qmp,
                peer,
                peer_serial,
                peer_qmp,
                state,
                usb,
            };
            vm::run(opts, |r| load(r, false))
        }
        Command::Flash { image, device, yes } => {
            let disk = flash::check_target(&device)?;
            if !yes {
                let size = std::fs::read_to_string(format!("/sys/block/{disk}/size"))
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                let model = std::fs::read_to_string(format!("/sys/block/{disk}/device/model")).unwrap_or_default();
                eprintln!(
                    "nasos: this would overwrite /dev/{disk} ({} GiB{}) with {}; run again with --yes to do it",
                    (size * 512) >> 30,
                    if model.trim().is_empty() { String::new() } else { format!(", {}", model.trim()) },
                    image.display()
                );
                return Ok(ExitCode::from(1));
            }
            let digest = flash::flash(&image, &device)?;
            println!("{} written to {} and verified (sha256 {digest})", image.display(), device.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Keygen { out, name, secure_boot: true, .. } => {
            for p in secureboot::keygen(&out, &name)? {
                println!("{}", p.display());
            }
            eprintln!(
                "nasos: keep the three .key files secret (db.key signs images, PK.key and KEK.key change what \
                 a box trusts); name {} in a recipe's [secure_boot] db",
                secureboot::cert_path(&out, "db").display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Keygen { out, name, no_password, secure_boot: false } => {
            let (public, secret) = bundle::keygen(&out, &name, !no_password)?;
            println!("{}", public.display());
            println!("{}", secret.display());
            eprintln!(
                "nasos: keep {} secret; list {} in a recipe's [upgrade] trusted_keys",
                secret.display(),
                public.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Bundle { recipe, inspect: Some(file), .. } => {
            let keys = match &recipe {
                Some(r) => {
                    let Some(loaded) = load(r, false)? else { return Ok(ExitCode::from(1)) };
                    let plan = loaded.plan();
                    Some(
                        nasos_bundle::TrustedKeys::parse(plan.upgrade.trusted_keys.iter().map(|k| k.key.as_str()))
                            .context("the recipe's trusted keys")?,
                    )
                }
                None => None,
            };
            let found = bundle::inspect(&file, keys.as_ref())?;
            let mut good = true;
            match &found.manifest {
                Ok(m) => {
                    println!("bundle     {}", file.display());
                    println!("image      {} {} for board {}", m.image, m.version, m.board);
                    println!("replaces   {} or later", m.min_version);
                    println!("root hash  {}", m.root_hash());
                    for p in &m.payloads {
                        println!("payload    {:<7} {:>11} bytes  sha256 {}", p.kind.as_str(), p.size, p.sha256);
                    }
                }
                Err(e) => {
                    good = false;
                    println!("manifest   unreadable: {e}");
                }
            }
            match &found.signature {
                Some(Ok(v)) => println!("signature  {v}"),
                Some(Err(e)) => {
                    good = false;
                    println!("signature  BAD: {e}");
                }
                None => println!("signature  not judged: give the recipe whose boxes would take it"),
            }
            match &found.payloads {
                Some(Ok(())) => println!("payloads   match the manifest"),
                Some(Err(e)) => {
                    good = false;
                    println!("payloads   BAD: {e}");
                }
                None => {}
            }
            Ok(if good { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Command::Bundle { recipe, key, out, build: build_dir, inspect: None, secure_boot_key } => {
            let (Some(recipe), Some(key)) = (recipe, key) else {
                anyhow::bail!("nasos bundle needs a RECIPE and --key SECRET (or --inspect FILE)");
            };
            let Some(loaded) = load(&recipe, false)? else { return Ok(ExitCode::from(1)) };
            let plan = loaded.plan();
            let dir = build_dir.unwrap_or_else(|| PathBuf::from("build").join(&plan.image.name));
            let opts = build::Options {
                recipe: recipe.clone(),
                out: dir.clone(),
                update_lock: false,
                rebuild: false,
                secure_boot_key: secure_boot_key.clone(),
            };
            let outputs = build::build(&opts, &plan)?;
            let file = out.unwrap_or_else(|| {
                dir.join(format!("{}-{}.{}", plan.image.name, plan.image.version, nasos_bundle::EXTENSION))
            });
            let m = bundle::bundle(&plan, &outputs, &key, &file)?;
            eprintln!(
                "nasos: bundle {} {} for {}: {} MiB (root hash {})",
                m.image,
                m.version,
                m.board,
                std::fs::metadata(&file)?.len() >> 20,
                &m.root_hash()[..16]
            );
            println!("{}", file.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Schema { kind } => {
            let schema = match kind {
                SchemaKind::Recipe => schema::recipe_schema(),
                SchemaKind::Board => schema::board_schema(),
            };
            println!("{}", serde_json::to_string_pretty(&schema)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Loads a recipe, printing its diagnostics to stderr. `None` means it had errors.
fn load(recipe: &std::path::Path, short: bool) -> anyhow::Result<Option<Loaded>> {
    let (loaded, report) = match load_recipe_file(recipe) {
        Ok(loaded) => {
            let report = loaded.report.clone();
            (Some(loaded), report)
        }
        Err(report) => (None, report),
    };
    print_report(&report, short)?;
    Ok(loaded)
}

fn print_report(report: &Report, short: bool) -> anyhow::Result<()> {
    if report.diagnostics.is_empty() {
        return Ok(());
    }
    let mut err = std::io::stderr().lock();
    if short {
        for d in &report.diagnostics {
            writeln!(err, "{d}")?;
        }
    } else {
        write!(err, "{}", report.render())?;
    }
    Ok(())
}
