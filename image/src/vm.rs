//! `nasos qemu`: build a recipe for an emulated board if needed and boot it, optionally with a
//! client VM (a stand-in GPU node) and a peer appliance (a replication twin) on the same private
//! network.

use std::path::{Path, PathBuf};
use std::process::{Child, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nasos_board::Loaded;
use nasos_qemu::{Link, Serial, Spec};

use crate::{build, host, root};

pub struct Options {
    pub recipe: PathBuf,
    pub headless: bool,
    pub serial: Option<PathBuf>,
    pub qmp: Option<PathBuf>,
    pub memory: u32,
    /// The appliance's virtual CPUs (companions get one each).
    pub cpus: u32,
    pub client: Option<PathBuf>,
    pub client_serial: Option<PathBuf>,
    pub client_qmp: Option<PathBuf>,
    /// A second appliance (a replication peer) on the same network, its console and QMP.
    pub peer: Option<PathBuf>,
    pub peer_serial: Option<PathBuf>,
    pub peer_qmp: Option<PathBuf>,
    /// Where the VM keeps its bays and EFI variables (the client's under `client/`).
    pub state: Option<PathBuf>,
    /// A file to carry on a USB stick (FAT) plugged into the appliance, e.g. a bundle.
    pub usb: Option<PathBuf>,
}

/// Builds (if needed) and prepares one VM: a fresh overlay over the built disk, kept bays.
fn prepare(recipe: &Path, loaded: &Loaded, state: Option<PathBuf>) -> anyhow::Result<(PathBuf, PathBuf)> {
    let plan = loaded.plan();
    if !loaded.board.board.emulated {
        bail!(
            "board `{}` of {} is real hardware; `nasos qemu` boots recipes for an emulated board such as qemu-q35",
            loaded.board.board.name,
            recipe.display()
        );
    }
    let out = PathBuf::from("build").join(&plan.image.name);
    let outputs = build::build(
        &build::Options {
            recipe: recipe.to_path_buf(),
            out: out.clone(),
            update_lock: false,
            rebuild: false,
            secure_boot_key: None,
        },
        &plan,
    )?;
    let state = state.unwrap_or_else(|| out.join("vm"));
    std::fs::create_dir_all(&state).with_context(|| format!("creating {}", state.display()))?;
    // Boot a fresh overlay: the built disk stays as built; the bays persist.
    let run = state.join("run.qcow2");
    let _ = std::fs::remove_file(&run);
    let base = std::fs::canonicalize(&outputs.disk_qcow2)?;
    root::run(
        std::process::Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
            .arg(&base)
            .arg(&run),
        "qemu-img create",
    )?;
    Ok((state, run))
}

/// The directory of the test keys a Secure Boot image's VM enrolls: its db certificate's.
fn secure_boot_keys(recipe: &Path, plan: &nasos_board::Plan) -> Option<PathBuf> {
    let db = crate::secureboot::db_cert(recipe, plan)?;
    let dir = db.parent().map(Path::to_path_buf).unwrap_or_default();
    eprintln!("nasos: Secure Boot on, with the PK, KEK and db of {} enrolled", dir.display());
    Some(dir)
}

pub fn run(opts: Options, load: impl Fn(&Path) -> anyhow::Result<Option<Loaded>>) -> anyhow::Result<ExitCode> {
    let Some(nas) = load(&opts.recipe)? else { return Ok(ExitCode::from(1)) };
    let mut companions: Vec<Companion> = Vec::new();
    for (role, path, serial, qmp, memory) in [
        ("client", &opts.client, &opts.client_serial, &opts.client_qmp, 1536),
        ("peer", &opts.peer, &opts.peer_serial, &opts.peer_qmp, 2048),
    ] {
        let Some(path) = path else { continue };
        let Some(c) = load(path)? else { return Ok(ExitCode::from(1)) };
        if c.plan().links.is_empty() || nas.plan().links.is_empty() {
            bail!(
                "{} and {} each need a network link to meet on ([[network.links]])",
                opts.recipe.display(),
                path.display()
            );
        }
        companions.push(Companion {
            role,
            recipe: path.clone(),
            loaded: c,
            serial: serial.clone(),
            qmp: qmp.clone(),
            memory,
        });
    }
    let (state, disk) = prepare(&opts.recipe, &nas, opts.state.clone())?;
    let mut prepared = Vec::new();
    for c in companions {
        let (cstate, cdisk) = prepare(&c.recipe, &c.loaded, opts.state.as_ref().map(|s| s.join(c.role)))?;
        prepared.push((c, cstate, cdisk));
    }
    host::ensure(host::QEMU)?;
    let usb = match &opts.usb {
        Some(file) => {
            let stick = state.join("usb-stick.img");
            nasos_qemu::usb_stick(file, &stick)
                .with_context(|| format!("putting {} on a USB stick", file.display()))?;
            eprintln!("nasos: a USB stick holding {} is plugged in", file.display());
            Some(stick)
        }
        None => None,
    };
    let plan = nas.plan();
    // Each link listens for the client; a peer meets both on the first link, through a hub.
    let with_peer = prepared.iter().any(|p| p.0.role == "peer");
    let links: Vec<Link> = plan
        .links
        .iter()
        .enumerate()
        .map(|(i, l)| Link {
            port: l.port.clone(),
            socket: state.join(format!("net-{}.sock", l.port)),
            listen: true,
            more: if with_peer && i == 0 { vec![state.join(format!("net-{}-peer.sock", l.port))] } else { Vec::new() },
        })
        .collect();
    let console = match (&opts.serial, opts.headless) {
        (Some(p), _) => Serial::Socket(p.clone()),
        (None, true) => Serial::File(state.join("console.log")),
        (None, false) => Serial::Stdio,
    };
    let spec = Spec {
        board: nas.board.clone(),
        disk,
        state: state.clone(),
        memory_mib: opts.memory,
        cpus: opts.cpus,
        serial: console,
        qmp: opts.qmp.clone(),
        links: links.clone(),
        usb: usb.clone(),
        secure_boot: secure_boot_keys(&opts.recipe, &plan),
        icount: false,
    };
    nasos_qemu::prepare_state(&spec)?;
    for l in &links {
        let _ = std::fs::remove_file(&l.socket);
        for m in &l.more {
            let _ = std::fs::remove_file(m);
        }
    }
    let mut appliance = owned(nasos_qemu::command(&spec)).spawn().context("running qemu-system-x86_64")?;
    let t = Instant::now();
    while !links.iter().all(|l| l.socket.exists() && l.more.iter().all(|m| m.exists())) {
        if t.elapsed() > Duration::from_secs(30) || appliance.try_wait()?.is_some() {
            kill(&mut appliance);
            bail!("the appliance's QEMU did not open its network sockets");
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    let mut children: Vec<Child> = Vec::new();
    for (Companion { role, recipe: crecipe, loaded: c, serial, qmp, memory }, cstate, cdisk) in prepared {
        let cplan = c.plan();
        // The client's links plug into the appliance's, in order; the peer's first link into the
        // first link's hub.
        let clinks: Vec<Link> = if role == "peer" {
            cplan
                .links
                .iter()
                .zip(&links)
                .take(1)
                .map(|(cl, al)| Link { port: cl.port.clone(), socket: al.more[0].clone(), listen: false, more: vec![] })
                .collect()
        } else {
            cplan
                .links
                .iter()
                .zip(&links)
                .map(|(cl, al)| Link { port: cl.port.clone(), socket: al.socket.clone(), listen: false, more: vec![] })
                .collect()
        };
        // A companion's console is never the terminal: the appliance has it.
        let (cserial, where_) = match serial {
            Some(p) => (Serial::Socket(p.clone()), format!("on the socket {}", p.display())),
            None => {
                let log = cstate.join("console.log");
                let shown = format!("in {}", log.display());
                (Serial::File(log), shown)
            }
        };
        let cspec = Spec {
            board: c.board.clone(),
            disk: cdisk,
            state: cstate.clone(),
            memory_mib: memory,
            cpus: 1,
            serial: cserial,
            qmp,
            links: clinks,
            usb: None,
            secure_boot: secure_boot_keys(&crecipe, &cplan),
            icount: false,
        };
        nasos_qemu::prepare_state(&cspec)?;
        let log = std::fs::File::create(cstate.join("qemu.log"))?;
        let child =
            owned(nasos_qemu::command(&cspec)).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).spawn();
        match child {
            Ok(ch) => {
                eprintln!(
                    "nasos: {role} {} ({}) is booting; its console is {where_}",
                    cplan.image.hostname,
                    cplan.links.iter().flat_map(|l| l.addresses.iter().cloned()).collect::<Vec<_>>().join(" ")
                );
                children.push(ch);
            }
            Err(e) => {
                kill(&mut appliance);
                for mut c in children {
                    kill(&mut c);
                }
                return Err(e).with_context(|| format!("starting the {role}'s QEMU"));
            }
        }
    }
    let status = appliance.wait().context("waiting for QEMU")?;
    // The client and the peer exist for the appliance; they go when the appliance goes.
    for mut c in children {
        kill(&mut c);
    }
    Ok(if status.success() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// A VM booted beside the appliance: the client or the peer.
struct Companion {
    role: &'static str,
    recipe: PathBuf,
    loaded: Loaded,
    serial: Option<PathBuf>,
    qmp: Option<PathBuf>,
    memory: u32,
}

/// QEMU goes when nasos goes, however nasos ends: a killed `nasos qemu` must not leave VMs
/// running with nobody holding their consoles.
fn owned(mut cmd: std::process::Command) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM).map_err(std::io::Error::from)
        });
    }
    cmd
}

fn kill(child: &mut Child) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}
