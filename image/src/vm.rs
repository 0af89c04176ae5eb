//! `nasos qemu`: build a recipe for an emulated board if needed and boot it, optionally with a
//! client VM (a stand-in GPU node) on the same private network.

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
    pub client: Option<PathBuf>,
    pub client_serial: Option<PathBuf>,
    pub client_qmp: Option<PathBuf>,
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
        &build::Options { recipe: recipe.to_path_buf(), out: out.clone(), update_lock: false, rebuild: false },
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

pub fn run(opts: Options, load: impl Fn(&Path) -> anyhow::Result<Option<Loaded>>) -> anyhow::Result<ExitCode> {
    let Some(nas) = load(&opts.recipe)? else { return Ok(ExitCode::from(1)) };
    let client = match &opts.client {
        Some(path) => match load(path)? {
            Some(c) => Some((path.clone(), c)),
            None => return Ok(ExitCode::from(1)),
        },
        None => None,
    };
    if let Some((path, c)) = &client
        && (c.plan().links.is_empty() || nas.plan().links.is_empty())
    {
        bail!(
            "{} and {} each need a network link to meet on ([[network.links]])",
            opts.recipe.display(),
            path.display()
        );
    }
    let (state, disk) = prepare(&opts.recipe, &nas, opts.state.clone())?;
    let client_vm = match &client {
        Some((path, c)) => Some((prepare(path, c, opts.state.as_ref().map(|s| s.join("client")))?, c)),
        None => None,
    };
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
    let links: Vec<Link> = plan
        .links
        .iter()
        .map(|l| Link { port: l.port.clone(), socket: state.join(format!("net-{}.sock", l.port)), listen: true })
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
        serial: console,
        qmp: opts.qmp.clone(),
        links: links.clone(),
        usb: usb.clone(),
    };
    nasos_qemu::prepare_state(&spec)?;
    for l in &links {
        let _ = std::fs::remove_file(&l.socket);
    }
    let mut appliance = owned(nasos_qemu::command(&spec)).spawn().context("running qemu-system-x86_64")?;

    let mut client_child: Option<Child> = None;
    if let Some(((cstate, cdisk), c)) = client_vm {
        // The client's links plug into the appliance's, in order, once the appliance listens.
        let cplan = c.plan();
        let t = Instant::now();
        while !links.iter().all(|l| l.socket.exists()) {
            if t.elapsed() > Duration::from_secs(30) || appliance.try_wait()?.is_some() {
                kill(&mut appliance);
                bail!("the appliance's QEMU did not open its network sockets");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let clinks: Vec<Link> = cplan
            .links
            .iter()
            .zip(&links)
            .map(|(cl, al)| Link { port: cl.port.clone(), socket: al.socket.clone(), listen: false })
            .collect();
        // The client's console is never the terminal: the appliance has it.
        let (cserial, where_) = match &opts.client_serial {
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
            memory_mib: 1536,
            serial: cserial,
            qmp: opts.client_qmp.clone(),
            links: clinks,
            usb: None,
        };
        nasos_qemu::prepare_state(&cspec)?;
        let log = std::fs::File::create(cstate.join("qemu.log"))?;
        let child =
            owned(nasos_qemu::command(&cspec)).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).spawn();
        match child {
            Ok(ch) => {
                eprintln!(
                    "nasos: client {} ({}) is booting; its console is {where_}",
                    cplan.image.hostname,
                    cplan.links.iter().flat_map(|l| l.addresses.iter().cloned()).collect::<Vec<_>>().join(" ")
                );
                client_child = Some(ch);
            }
            Err(e) => {
                kill(&mut appliance);
                return Err(e).context("starting the client's QEMU");
            }
        }
    }
    let status = appliance.wait().context("waiting for QEMU")?;
    // The client exists for the appliance; it goes when the appliance goes.
    if let Some(mut c) = client_child {
        kill(&mut c);
    }
    Ok(if status.success() { ExitCode::SUCCESS } else { ExitCode::from(1) })
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
