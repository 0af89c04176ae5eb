//! The emulated twin board: QEMU command lines from the board model, and a driver for a running
//! VM's serial console and QMP monitor.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nasos_board::Board;

pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
pub const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
/// The firmware build that enforces Secure Boot (it needs SMM and a secure flash).
pub const OVMF_CODE_SECBOOT: &str = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd";
/// Size of each emulated bay (sparse).
pub const BAY_SIZE: &str = "4G";

/// Where the serial console goes.
#[derive(Clone)]
pub enum Serial {
    /// The terminal, for people (`-chardev stdio,signal=off`: Ctrl-C reaches the guest).
    Stdio,
    /// A unix socket QEMU listens on, for programs.
    Socket(PathBuf),
    /// A file, for a headless run nobody watches.
    File(PathBuf),
}

/// One private network between VMs: the first VM listens, the others connect. A listening link
/// with `more` sockets is a hub in the first VM's QEMU: every VM that connects to any of its
/// sockets is on one segment (the appliance, its client and its peer).
#[derive(Debug, Clone)]
pub struct Link {
    pub port: String,
    pub socket: PathBuf,
    pub listen: bool,
    pub more: Vec<PathBuf>,
}

#[derive(Clone)]
pub struct Spec {
    pub board: Board,
    /// The boot disk (qcow2). Tests pass a throwaway overlay so the build stays pristine.
    pub disk: PathBuf,
    /// Directory for state that outlives a run: the bays and the EFI variables.
    pub state: PathBuf,
    pub memory_mib: u32,
    /// Virtual CPUs. More than one runs TCG multi-threaded: a single VM on a multi-core host
    /// boots in about 0.6 of the time; VMs that share the host's cores gain nothing.
    pub cpus: u32,
    pub serial: Serial,
    pub qmp: Option<PathBuf>,
    pub links: Vec<Link>,
    /// A raw disk image plugged in as a USB stick (see [`usb_stick`]).
    pub usb: Option<PathBuf>,
    /// Secure Boot on, with the test keys of this directory enrolled (`PK.crt`, `KEK.crt`,
    /// `db.crt`, `owner.guid`: what `nasos keygen --secure-boot` writes).
    pub secure_boot: Option<PathBuf>,
    /// The guest's clock counts instructions, one nanosecond each, and skips its idle time
    /// (QEMU's `-icount shift=0,sleep=off`; one vCPU): the same boot then takes the same virtual
    /// time within ±0.1 s whatever else the host does, where real time varies by ±20 %. It counts
    /// the guest's work, not QEMU's emulation of its devices: a benchmark's tool for ranking
    /// changes to what the guest does, never for a test's timeouts.
    pub icount: bool,
}

/// Makes `out`, an EFI variable store holding only the keys of `keys` (PK, KEK, db) with Secure
/// Boot on (python3-virt-firmware's `virt-fw-vars`).
pub fn secure_boot_vars(keys: &Path, out: &Path) -> anyhow::Result<()> {
    let guid_file = keys.join("owner.guid");
    let guid = std::fs::read_to_string(&guid_file)
        .with_context(|| format!("reading {} (`nasos keygen --secure-boot` writes it)", guid_file.display()))?;
    let guid = guid.trim();
    let mut c = Command::new("virt-fw-vars");
    c.arg("--input").arg(OVMF_VARS).arg("--output").arg(out);
    for (flag, role) in [("--set-pk", "PK"), ("--add-kek", "KEK"), ("--add-db", "db")] {
        let cert = keys.join(format!("{role}.crt"));
        if !cert.exists() {
            bail!(
                "{} is missing: a Secure Boot VM enrolls the PK, KEK and db certificates beside the recipe's db \
                 (make test keys with `nasos keygen --secure-boot DIR`)",
                cert.display()
            );
        }
        c.arg(flag).arg(guid).arg(cert);
    }
    c.arg("--secure-boot");
    let o = c.output().context("running virt-fw-vars (package python3-virt-firmware)")?;
    if !o.status.success() {
        bail!("virt-fw-vars failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(())
}

/// Makes `out`, a raw image of a FAT-formatted USB stick holding `file` at its top level, as an
/// operator would carry a bundle (mkfs.vfat and mtools; written whole, then renamed).
pub fn usb_stick(file: &Path, out: &Path) -> anyhow::Result<()> {
    let len = std::fs::metadata(file).with_context(|| format!("reading {}", file.display()))?.len();
    let mib = (len >> 20) + (len >> 24) + 16;
    let tmp = out.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let name = file.file_name().context("the file has no name")?.to_string_lossy().into_owned();
    let steps: [(&str, Vec<String>); 2] = [
        (
            "mkfs.vfat",
            vec!["-C".into(), "-n".into(), "NASOS-USB".into(), tmp.display().to_string(), (mib * 1024).to_string()],
        ),
        ("mcopy", vec!["-i".into(), tmp.display().to_string(), file.display().to_string(), format!("::{name}")]),
    ];
    for (tool, args) in steps {
        let o = Command::new(tool).args(&args).output().with_context(|| format!("running {tool}"))?;
        if !o.status.success() {
            bail!("{tool} {} failed: {}", args.join(" "), String::from_utf8_lossy(&o.stderr));
        }
    }
    std::fs::rename(&tmp, out)?;
    Ok(())
}

/// Makes the twelve bay disks (kept across runs) and the EFI variable store, if missing.
pub fn prepare_state(spec: &Spec) -> anyhow::Result<()> {
    std::fs::create_dir_all(&spec.state)?;
    for bay in &spec.board.bays {
        let p = bay_path(spec, &bay.name);
        if !p.exists() {
            let o = Command::new("qemu-img").args(["create", "-q", "-f", "qcow2"]).arg(&p).arg(BAY_SIZE).output()?;
            if !o.status.success() {
                bail!("qemu-img create {} failed: {}", p.display(), String::from_utf8_lossy(&o.stderr));
            }
        }
    }
    let vars = vars_path(spec);
    if !vars.exists() {
        match &spec.secure_boot {
            Some(keys) => {
                let tmp = vars.with_extension("tmp");
                secure_boot_vars(keys, &tmp)?;
                std::fs::rename(&tmp, &vars)?;
            }
            None => {
                std::fs::copy(OVMF_VARS, &vars).with_context(|| format!("copying {OVMF_VARS}"))?;
            }
        }
    }
    Ok(())
}

/// The VM's EFI variables: a store of its own for Secure Boot, so a state directory that booted
/// an unsigned image before does not keep Secure Boot off.
pub fn vars_path(spec: &Spec) -> PathBuf {
    spec.state.join(if spec.secure_boot.is_some() { "OVMF_VARS.secboot.fd" } else { "OVMF_VARS.fd" })
}

fn bay_path(spec: &Spec, bay: &str) -> PathBuf {
    spec.state.join(format!("{}.qcow2", bay.to_ascii_lowercase()))
}

/// The QEMU command line for a spec.
pub fn command(spec: &Spec) -> Command {
    let mut c = Command::new("qemu-system-x86_64");
    let code = if spec.secure_boot.is_some() {
        // Secure Boot's variables live in SMM-protected flash: the firmware refuses to run
        // without both.
        c.args(["-machine", "q35,smm=on", "-global", "driver=cfi.pflash01,property=secure,value=on"]);
        OVMF_CODE_SECBOOT
    } else {
        c.args(["-machine", "q35"]);
        OVMF_CODE
    };
    let cpus = spec.cpus.max(1).to_string();
    if spec.icount {
        // Counting instructions needs one TCG thread.
        c.args(["-accel", "tcg", "-cpu", "max", "-smp", "1", "-icount", "shift=0,sleep=off"]);
    } else if spec.cpus > 1 {
        c.args(["-accel", "tcg,thread=multi", "-cpu", "max", "-smp", &cpus]);
    } else {
        c.args(["-accel", "tcg", "-cpu", "max", "-smp", "1"]);
    }
    c.arg("-m").arg(spec.memory_mib.to_string());
    c.args(["-nodefaults", "-display", "none", "-no-user-config"]);
    c.arg("-drive").arg(format!("if=pflash,format=raw,unit=0,readonly=on,file={code}"));
    c.arg("-drive").arg(format!("if=pflash,format=raw,unit=1,file={}", vars_path(spec).display()));
    let boot_serial = spec.board.boot.matcher.virtio_serial.clone().unwrap_or_else(|| "nasos-boot".into());
    c.arg("-drive").arg(format!("file={},if=none,id=boot,format=qcow2,cache=unsafe", spec.disk.display()));
    c.arg("-device").arg(format!("virtio-blk-pci,drive=boot,serial={boot_serial},bootindex=0"));
    for (i, bay) in spec.board.bays.iter().enumerate() {
        let n = i + 1;
        let serial = bay.matcher.serial.clone().unwrap_or_else(|| bay.name.clone());
        c.arg("-device").arg(format!("pcie-root-port,id=rp{n},chassis={n},slot={n}"));
        c.arg("-drive")
            .arg(format!("file={},if=none,id=bay{n},format=qcow2,cache=unsafe", bay_path(spec, &bay.name).display()));
        c.arg("-device").arg(format!("nvme,id=nvme{n},serial={serial},drive=bay{n},bus=rp{n}"));
    }
    for (i, link) in spec.links.iter().enumerate() {
        let Some(port) = spec.board.ports.iter().find(|p| p.name == link.port) else { continue };
        let server = if link.listen { "on" } else { "off" };
        let stream = |id: String, sock: &Path| {
            format!("stream,id={id},server={server},addr.type=unix,addr.path={}", sock.display())
        };
        if link.listen && !link.more.is_empty() {
            // QEMU's hub forwards every frame to all its ports: the NIC and each socket.
            c.arg("-netdev").arg(format!("hubport,id=net{i},hubid={i}"));
            for (j, sock) in std::iter::once(&link.socket).chain(&link.more).enumerate() {
                c.arg("-netdev").arg(stream(format!("net{i}s{j}"), sock));
                c.arg("-netdev").arg(format!("hubport,id=net{i}h{j},hubid={i},netdev=net{i}s{j}"));
            }
        } else {
            c.arg("-netdev").arg(stream(format!("net{i}"), &link.socket));
        }
        let mac = port.matcher.mac.clone().unwrap_or_default();
        // The NIC's id is what QMP's set_link takes (`nic0`: the cable pulled).
        c.arg("-device").arg(format!("virtio-net-pci,id=nic{i},netdev=net{i},mac={mac}"));
    }
    // A USB controller, as the real board has, so a stick can be plugged in (also later, by QMP).
    c.args(["-device", "qemu-xhci,id=xhci"]);
    if let Some(stick) = &spec.usb {
        c.arg("-drive").arg(format!("file={},if=none,id=usb0,format=raw,cache=unsafe", stick.display()));
        c.args(["-device", "usb-storage,bus=xhci.0,drive=usb0,removable=on"]);
    }
    c.args(["-device", "i6300esb", "-action", "watchdog=reset"]);
    match &spec.serial {
        Serial::Stdio => c.args(["-chardev", "stdio,id=s0,signal=off", "-serial", "chardev:s0"]),
        Serial::Socket(p) => {
            c.arg("-chardev").arg(format!("socket,id=s0,path={},server=on,wait=off", p.display()));
            c.args(["-serial", "chardev:s0"])
        }
        Serial::File(p) => {
            c.arg("-chardev").arg(format!("file,id=s0,path={}", p.display()));
            c.args(["-serial", "chardev:s0"])
        }
    };
    if let Some(q) = &spec.qmp {
        c.arg("-qmp").arg(format!("unix:{},server=on,wait=off", q.display()));
    }
    c
}

/// A running VM driven through its serial console socket.
pub struct Vm {
    /// The process that owns the VM (QEMU itself, or `nasos qemu`); `None` when another handle
    /// owns it.
    child: Option<Child>,
    lines: mpsc::Receiver<Console>,
    console: UnixStream,
    qmp: Option<PathBuf>,
    /// Everything the console printed, for failure reports.
    pub transcript: PathBuf,
    seen: Vec<String>,
    /// Whether the console shell has been set up for programs (no echo, no prompt).
    quiet: bool,
    /// Where in `seen` the current boot's console begins (the last [`Vm::expect_new_shell`]).
    shell_from: usize,
    /// How to start the VM again, for a VM this handle started.
    respawn: Option<(Spec, PathBuf)>,
    /// Whether the guest's initramfs or nasinit has spoken since QEMU started.
    spoke: bool,
    /// Times QEMU was started again after the guest stalled before it spoke.
    restarts: u32,
}

/// What the guest kernel prints when a CPU stopped answering: under multi-threaded TCG on a
/// loaded host a vCPU can miss its timer wakeups for good before the kernel has printed anything
/// (seen on the 2-core test hosts), and that boot never goes on.
const STALL: &str = "rcu: INFO: rcu_preempt detected stalls";
/// The first words of nasos's initramfs and of nasinit on the console.
const SPOKE: &str = "nasinit:";
/// Starts again after such a stall, at most.
const STALL_RESTARTS: u32 = 2;

impl Vm {
    /// Starts QEMU with the console on a socket and begins recording it into `transcript`.
    pub fn start(spec: &Spec, transcript: &Path) -> anyhow::Result<Vm> {
        let Serial::Socket(sock) = &spec.serial else { bail!("Vm needs the serial console on a socket") };
        prepare_state(spec)?;
        let _ = std::fs::remove_file(sock);
        let log = std::fs::File::create(spec.state.join("qemu.log"))?;
        let child = command(spec)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting qemu-system-x86_64")?;
        let mut vm = Vm::attach(sock, transcript, spec.qmp.clone(), Some(child), Duration::from_secs(20))?;
        vm.respawn = Some((spec.clone(), transcript.to_path_buf()));
        Ok(vm)
    }

    /// Starts QEMU again on the same disks after the guest stalled before anything of nasos ran
    /// (nothing was written yet: it is a power cycle before the kernel got going). The stalled
    /// boot's transcript is kept beside the new one.
    fn restart_after_stall(&mut self) -> anyhow::Result<()> {
        let Some((spec, transcript)) = self.respawn.clone() else { bail!("this VM was not started here") };
        eprintln!(
            "qemu: the guest stalled before nasos's initramfs spoke (an RCU stall: a vCPU missed its timer for good \
             under multi-threaded TCG); starting QEMU again"
        );
        self.kill();
        let kept = transcript.with_extension(format!("stalled-{}.log", self.restarts + 1));
        let _ = std::fs::rename(&transcript, &kept);
        let mut fresh = Vm::start(&spec, &transcript)?;
        fresh.restarts = self.restarts + 1;
        *self = fresh;
        Ok(())
    }

    /// Connects to a VM's console socket (waiting up to `wait` for it to appear, e.g. while
    /// `nasos qemu` builds) and records it into `transcript`. `owner`, if any, is killed with
    /// the handle.
    pub fn attach(
        sock: &Path,
        transcript: &Path,
        qmp: Option<PathBuf>,
        mut owner: Option<Child>,
        wait: Duration,
    ) -> anyhow::Result<Vm> {
        let t = Instant::now();
        let console = loop {
            match UnixStream::connect(sock) {
                Ok(s) => break s,
                Err(e) => {
                    let exited = owner.as_mut().and_then(|c| c.try_wait().ok().flatten());
                    if let Some(st) = exited {
                        bail!("the VM's process exited ({st}) before opening its console {}", sock.display());
                    }
                    if t.elapsed() > wait {
                        if let Some(c) = owner.as_mut() {
                            let _ = c.kill();
                            let _ = c.wait();
                        }
                        bail!("no console socket {} after {wait:?}: {e}", sock.display());
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        let opened = console.try_clone().map_err(anyhow::Error::from).and_then(|reader| {
            let record = std::fs::File::create(transcript)
                .with_context(|| format!("creating the transcript {}", transcript.display()))?;
            Ok((reader, record))
        });
        let (reader, mut record) = match opened {
            Ok(x) => x,
            Err(e) => {
                // Nobody would hold the VM's console: do not leave it running.
                if let Some(c) = owner.as_mut() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(e);
            }
        };
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = reader;
            use std::io::Read;
            let mut buf = [0u8; 4096];
            let mut pending: Vec<u8> = Vec::new();
            loop {
                let n = match r.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let _ = record.write_all(&buf[..n]);
                pending.extend_from_slice(&buf[..n]);
                while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
                    let raw: Vec<u8> = pending.drain(..=pos).collect();
                    let line = String::from_utf8_lossy(&raw).replace('\r', "").trim_end_matches('\n').to_string();
                    if tx.send(Console::Line(line)).is_err() {
                        return;
                    }
                }
                // A prompt ("login: ", "New password: ") ends without a newline.
                if !pending.is_empty() {
                    let text = String::from_utf8_lossy(&pending).replace('\r', "");
                    if tx.send(Console::Partial(text)).is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Vm {
            child: owner,
            lines,
            console,
            qmp,
            transcript: transcript.to_path_buf(),
            seen: Vec::new(),
            quiet: false,
            shell_from: 0,
            respawn: None,
            spoke: false,
            restarts: 0,
        })
    }

    /// Waits for a console line containing `needle`; returns it.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> anyhow::Result<String> {
        self.wait(needle, timeout, false)
    }

    /// Like [`Vm::wait_for`], but a line already seen since `from` (a [`Vm::console_lines`]
    /// length taken before the act) counts too: an alert the box printed while the test ran
    /// other commands is not missed.
    pub fn wait_for_since(&mut self, from: usize, needle: &str, timeout: Duration) -> anyhow::Result<String> {
        if let Some(l) = self.seen[from.min(self.seen.len())..].iter().find(|l| l.contains(needle)) {
            return Ok(l.clone());
        }
        self.wait(needle, timeout, false)
    }

    /// Waits for `needle` in a line or in a prompt that is not ended by a newline yet
    /// (`login: `, `New password: `); returns the line or the prompt so far.
    pub fn wait_for_prompt(&mut self, needle: &str, timeout: Duration) -> anyhow::Result<String> {
        self.wait(needle, timeout, true)
    }

    fn wait(&mut self, needle: &str, timeout: Duration, prompts: bool) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(Console::Partial(p)) => {
                    if prompts && p.contains(needle) {
                        return Ok(p);
                    }
                }
                Ok(Console::Line(line)) => {
                    self.seen.push(line.clone());
                    if !self.spoke {
                        if line.contains(SPOKE) {
                            self.spoke = true;
                        } else if line.contains(STALL) && self.respawn.is_some() && self.restarts < STALL_RESTARTS {
                            self.restart_after_stall()?;
                            continue;
                        }
                    }
                    if line.contains(needle) {
                        return Ok(line);
                    }
                }
                Err(_) => bail!(
                    "no console line with `{needle}` within {timeout:?}; last lines:\n{}",
                    self.seen.iter().rev().take(30).rev().cloned().collect::<Vec<_>>().join("\n")
                ),
            }
        }
    }

    /// Runs a shell command on the console (a logged-in shell) and returns its output and status.
    pub fn run(&mut self, command: &str, timeout: Duration) -> anyhow::Result<(String, i32)> {
        if !self.quiet {
            // A program reads the console: no echo, no prompt, no bracketed-paste escapes, and
            // no line wrapping of long commands.
            let setup = "stty -echo cols 1000; bind 'set enable-bracketed-paste off' 2>/dev/null; PS1=''; echo NASOS_\"\"QUIET\n";
            // A shell that is still starting (login just printed) may discard what was typed:
            // ask again until it answers.
            let deadline = Instant::now() + timeout;
            loop {
                self.console.write_all(setup.as_bytes())?;
                let left = deadline.saturating_duration_since(Instant::now());
                match self.wait_for("NASOS_QUIET", left.min(Duration::from_secs(10))) {
                    Ok(_) => break,
                    Err(e) if Instant::now() >= deadline => return Err(e),
                    Err(_) => {}
                }
            }
            self.quiet = true;
        }
        let tag = format!("NASOS{}", Instant::now().elapsed().as_nanos() ^ u128::from(std::process::id()));
        // The markers are built by the shell, so the echoed command line never matches them.
        let line = format!("{command}; echo \"{tag}_\"\"END $?\"\n");
        let begin = format!("echo \"{tag}_\"\"BEGIN\"\n");
        self.console.write_all(begin.as_bytes())?;
        self.wait_for(&format!("{tag}_BEGIN"), timeout)?;
        self.console.write_all(line.as_bytes())?;
        let mut out = Vec::new();
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let l = match self.lines.recv_timeout(left) {
                Ok(Console::Line(l)) => l,
                Ok(Console::Partial(_)) => continue,
                Err(_) => bail!("`{command}` did not finish within {timeout:?}"),
            };
            self.seen.push(l.clone());
            if let Some(rest) = l.split(&format!("{tag}_END ")).nth(1) {
                let status = rest.trim().parse::<i32>().unwrap_or(-1);
                // The terminal echoes the command line; it holds the marker in quotes, the real
                // marker line does not.
                let echo = format!("{tag}_\"\"END");
                let body: Vec<String> =
                    out.into_iter().filter(|x: &String| !x.contains(&echo)).map(|x| strip_escapes(&x)).collect();
                return Ok((body.join("\n"), status));
            }
            out.push(l);
        }
    }

    /// Types a line on the console without waiting for anything (for commands that do not come
    /// back, such as a reboot).
    pub fn send_line(&mut self, line: &str) -> anyhow::Result<()> {
        self.console.write_all(format!("{line}\n").as_bytes())?;
        Ok(())
    }

    /// After a reboot the console has a fresh login shell, which `run` must set up again.
    pub fn expect_new_shell(&mut self) {
        self.quiet = false;
        self.shell_from = self.seen.len();
    }

    /// Waits for the console's automatic root login of this boot, or returns at once if it was
    /// already printed (the console logs in long before the appliance is ready, so waiting for
    /// the line after `ready` would wait out the whole timeout).
    pub fn wait_for_login(&mut self, timeout: Duration) -> anyhow::Result<String> {
        const LOGIN: &str = "login: root (automatic login)";
        if let Some(l) = self.seen[self.shell_from.min(self.seen.len())..].iter().find(|l| l.contains(LOGIN)) {
            return Ok(l.clone());
        }
        self.wait_for(LOGIN, timeout)
    }

    /// Connects to QMP and completes the capabilities handshake (10 s read timeout).
    fn qmp_connect(&self) -> anyhow::Result<(BufReader<UnixStream>, UnixStream)> {
        let path = self.qmp.as_ref().context("this VM has no QMP socket")?;
        let w = UnixStream::connect(path)?;
        w.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut r = BufReader::new(w.try_clone()?);
        let mut w = w;
        let mut line = String::new();
        r.read_line(&mut line)?;
        w.write_all(b"{\"execute\":\"qmp_capabilities\"}\n")?;
        line.clear();
        r.read_line(&mut line)?;
        Ok((r, w))
    }

    /// Plugs a USB stick (a raw image, see [`usb_stick`]) into the running VM, as an operator
    /// would.
    pub fn plug_usb(&self, image: &Path) -> anyhow::Result<()> {
        // A stick an earlier step left plugged in comes out first.
        if self.qmp("device_del", serde_json::json!({"id": "usbstick0"})).is_ok() {
            let _ = self.unplug_usb_drive();
        }
        let _ = self.qmp("blockdev-del", serde_json::json!({"node-name": "usbstick"}));
        self.qmp(
            "blockdev-add",
            serde_json::json!({"driver": "raw", "node-name": "usbstick", "file": {"driver": "file", "filename": image.display().to_string()}}),
        )?;
        self.qmp("device_add", serde_json::json!({"driver": "usb-storage", "id": "usbstick0", "bus": "xhci.0", "drive": "usbstick", "removable": true}))?;
        Ok(())
    }

    /// Pulls (`up` false) or puts back the cable of the VM's `n`-th link (0 is the first).
    pub fn set_link(&self, n: u32, up: bool) -> anyhow::Result<()> {
        self.qmp("set_link", serde_json::json!({"name": format!("nic{n}"), "up": up}))?;
        Ok(())
    }

    /// Pulls the drive out of bay `n` (1-based). QEMU has no surprise removal: `device_del` asks
    /// the guest (the slot's attention button), which removes the driver while the controller is
    /// still there; I/O still in flight on it fails, as on a pulled drive.
    pub fn pull_bay(&self, n: u32) -> anyhow::Result<()> {
        self.qmp("device_del", serde_json::json!({"id": format!("nvme{n}")}))?;
        Ok(())
    }

    /// Pulls the drive out of bay `n` as [`Vm::pull_bay`] does, and returns once the guest has
    /// let go of it (QEMU's `DEVICE_DELETED`), with how long that took: a check that times what
    /// the box does about a pulled drive starts its clock when the drive is gone.
    pub fn pull_bay_released(&self, n: u32, timeout: Duration) -> anyhow::Result<Duration> {
        let id = format!("nvme{n}");
        let (mut r, mut w) = self.qmp_connect()?;
        let t = Instant::now();
        let cmd = serde_json::json!({"execute": "device_del", "arguments": {"id": id}});
        w.write_all(format!("{cmd}\n").as_bytes())?;
        let deadline = t + timeout;
        let mut line = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("the guest did not let go of {id} within {timeout:?}");
            }
            r.get_ref().set_read_timeout(Some(left))?;
            line.clear();
            match r.read_line(&mut line) {
                Ok(0) => bail!("QMP closed before {id} was released"),
                Ok(_) => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => continue,
                Err(e) => return Err(e.into()),
            }
            let v: serde_json::Value = serde_json::from_str(&line)?;
            if let Some(e) = v.get("error") {
                bail!("QMP device_del {id}: {e}");
            }
            if v["event"] == "DEVICE_DELETED" && v["data"]["device"] == id.as_str() {
                return Ok(t.elapsed());
            }
        }
    }

    /// Puts a drive into bay `n`: `disk` (a qcow2 file; a new blank one is made there if it does
    /// not exist), with the serial the twin board gives that bay. Once the guest has let go of a
    /// pulled drive (the slot is free again), this may be retried.
    pub fn plug_bay(&self, n: u32, disk: &Path) -> anyhow::Result<()> {
        if !disk.exists() {
            let o = Command::new("qemu-img").args(["create", "-q", "-f", "qcow2"]).arg(disk).arg(BAY_SIZE).output()?;
            if !o.status.success() {
                bail!("qemu-img create {} failed: {}", disk.display(), String::from_utf8_lossy(&o.stderr));
            }
        }
        static PLUGGED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let node = format!("swap{n}-{}", PLUGGED.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        self.qmp(
            "blockdev-add",
            serde_json::json!({"driver": "qcow2", "node-name": node, "file": {"driver": "file", "filename": disk.display().to_string()}}),
        )?;
        let mut last = None;
        for _ in 0..50 {
            match self.qmp(
                "device_add",
                serde_json::json!({"driver": "nvme", "id": format!("nvme{n}"), "serial": format!("BAY{n:02}"), "drive": node, "bus": format!("rp{n}")}),
            ) {
                Ok(_) => return Ok(()),
                // The pulled controller may still be on its way out.
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("device_add failed")))
    }

    /// Unplugs the stick [`Vm::plug_usb`] plugged in.
    pub fn unplug_usb(&self) -> anyhow::Result<()> {
        self.qmp("device_del", serde_json::json!({"id": "usbstick0"}))?;
        self.unplug_usb_drive()
    }

    /// The drive goes once the guest has let go of the device.
    fn unplug_usb_drive(&self) -> anyhow::Result<()> {
        for _ in 0..50 {
            if self.qmp("blockdev-del", serde_json::json!({"node-name": "usbstick"})).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!("the USB stick's drive was not released")
    }

    /// Opens a QMP connection that listens for events (QEMU serves one QMP client at a time:
    /// send no command while it is open).
    pub fn qmp_events(&self) -> anyhow::Result<QmpEvents> {
        let (reader, writer) = self.qmp_connect()?;
        Ok(QmpEvents { reader, _writer: writer })
    }

    /// Sends one QMP command (after the capabilities handshake) and returns its `return` value.
    pub fn qmp(&self, execute: &str, arguments: serde_json::Value) -> anyhow::Result<serde_json::Value> {
        let (mut r, mut w) = self.qmp_connect()?;
        let mut line = String::new();
        let cmd = serde_json::json!({"execute": execute, "arguments": arguments});
        w.write_all(format!("{cmd}\n").as_bytes())?;
        loop {
            line.clear();
            if r.read_line(&mut line)? == 0 {
                bail!("QMP closed");
            }
            let v: serde_json::Value = serde_json::from_str(&line)?;
            if let Some(ret) = v.get("return") {
                return Ok(ret.clone());
            }
            if let Some(e) = v.get("error") {
                bail!("QMP {execute}: {e}");
            }
        }
    }

    /// Waits for QEMU to exit (the guest powered off).
    pub fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let Some(child) = self.child.as_mut() else { bail!("this handle does not own the VM's process") };
        loop {
            if let Some(s) = child.try_wait()? {
                return Ok(s);
            }
            if Instant::now() > deadline {
                bail!("QEMU did not exit within {timeout:?}");
            }
            // Keep draining the console so the guest never blocks on a full socket.
            while let Ok(l) = self.lines.try_recv() {
                if let Console::Line(l) = l {
                    self.seen.push(l);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn console_lines(&self) -> &[String] {
        &self.seen
    }

    pub fn kill(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Removes terminal control sequences (`ESC [ … letter`) from a console line.
pub fn strip_escapes(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// What the console reader passes on: whole lines, and the start of a line not ended yet.
enum Console {
    Line(String),
    Partial(String),
}

/// A QMP connection waiting for events.
pub struct QmpEvents {
    reader: BufReader<UnixStream>,
    _writer: UnixStream,
}

impl QmpEvents {
    /// Waits for the event named `name` (`WATCHDOG`, `RESET`); returns it whole.
    pub fn wait(&mut self, name: &str, timeout: Duration) -> anyhow::Result<serde_json::Value> {
        let deadline = Instant::now() + timeout;
        let mut line = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("no QMP event {name} within {timeout:?}");
            }
            self.reader.get_ref().set_read_timeout(Some(left))?;
            line.clear();
            match self.reader.read_line(&mut line) {
                Ok(0) => bail!("QMP closed before the event {name}"),
                Ok(_) => {
                    let v: serde_json::Value = serde_json::from_str(&line)?;
                    if v.get("event").and_then(|e| e.as_str()) == Some(name) {
                        return Ok(v);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                    bail!("no QMP event {name} within {timeout:?}")
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_are_stripped() {
        assert_eq!(super::strip_escapes("\u{1b}[?2004labc\u{1b}[0m d"), "abc d");
        assert_eq!(super::strip_escapes("plain"), "plain");
    }
}
