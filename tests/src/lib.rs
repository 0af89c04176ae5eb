//! What the end-to-end tests and the data-path benchmark share: building the release binaries
//! and images, booting VMs on the twin board, and running commands on their consoles.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nasos_qemu::{Link, Serial, Spec, Vm};

pub mod lanes;
pub mod reference;
pub mod suite;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("repo root")
}

pub fn target_release() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| repo().join("target")).join("release")
}

/// Builds the workspace's binaries in release mode (the images carry them).
pub fn build_binaries() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "--workspace", "--bins", "--locked"])
        .current_dir(repo())
        .status()
        .expect("run cargo build");
    assert!(status.success(), "cargo build --release failed");
}

pub struct Built {
    pub stdout: String,
    pub stderr: String,
    pub took: Duration,
}

/// Runs the release `nasos` and insists it succeeds.
pub fn nasos(args: &[&str]) -> Built {
    let t = Instant::now();
    let out = Command::new(target_release().join("nasos")).args(args).current_dir(repo()).output().expect("run nasos");
    let b = Built {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: t.elapsed(),
    };
    assert!(out.status.success(), "nasos {} failed:\n{}", args.join(" "), b.stderr);
    b
}

/// Runs the release `nasos`: whether it succeeded, and its stderr.
pub fn nasos_status(args: &[&str]) -> (bool, String) {
    let out = Command::new(target_release().join("nasos")).args(args).current_dir(repo()).output().expect("run nasos");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

pub fn board(name: &str) -> nasos_board::Board {
    let (file, text) = nasos_board::find_board(name).expect("board");
    nasos_board::load_board(&nasos_board::SourceFile::new(file, text)).expect("valid board").0
}

/// The Secure Boot test keys (PK, KEK, db) of the end-to-end suites: made by `nasos keygen
/// --secure-boot` the first time, kept after (a new key would re-sign every image).
pub fn secure_boot_test_keys() -> PathBuf {
    let dir = repo().join("build/e2e/secure-boot-keys");
    if !dir.join("db.crt").exists() || !dir.join("owner.guid").exists() {
        let _ = std::fs::remove_dir_all(&dir);
        nasos(&["keygen", "--secure-boot", "--out", &dir.display().to_string(), "--name", "nasos e2e"]);
    }
    dir
}

/// Writes `DIR/NAME.toml`, a variant of `recipes/BASE.toml` made by `edit`, with its lock beside
/// it and its key files named by absolute path (they are relative to the recipe's directory).
pub fn recipe_variant(dir: &Path, base: &str, name: &str, edit: impl FnOnce(String) -> String) -> PathBuf {
    std::fs::create_dir_all(dir).expect("recipe dir");
    let recipes = repo().join("recipes");
    let text = std::fs::read_to_string(recipes.join(format!("{base}.toml"))).expect("recipe");
    let text = text.replace("\"keys/", &format!("\"{}/keys/", recipes.display()));
    let changed = edit(text.clone());
    assert_ne!(changed, text, "the variant {name} of {base} changes nothing");
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, changed).expect("write recipe");
    std::fs::copy(recipes.join(format!("{base}.toml.lock")), dir.join(format!("{name}.toml.lock"))).expect("copy lock");
    path
}

/// Where the upgrade bundles of qemu-dev are built: the upgrade suite and the data-path suite
/// build the same ones here, so the second finds the image built and only packs the bundle.
pub fn bundles_dir() -> PathBuf {
    repo().join("build/e2e/upgrade")
}

/// A bundle of qemu-dev at `version` with `extra` appended to the recipe, signed with the
/// committed development key: `build/e2e/upgrade/qemu-dev-VERSION.nasos`.
pub fn dev_bundle(version: &str, extra: &str) -> PathBuf {
    let dir = bundles_dir();
    let recipe = recipe_variant(&dir, "qemu-dev", &format!("qemu-dev-{version}"), |r| {
        r.replace("version = \"0.1.0\"", &format!("version = \"{version}\"")) + extra
    });
    let out = dir.join(format!("qemu-dev-{version}.nasos"));
    let key = repo().join("recipes/keys/nasos-dev.key");
    let b = nasos(&[
        "bundle",
        &recipe.display().to_string(),
        "--key",
        &key.display().to_string(),
        "--build",
        &dir.join(version).display().to_string(),
        "--out",
        &out.display().to_string(),
    ]);
    eprintln!(
        "bundle {version}: {:.1}s, {} MiB",
        b.took.as_secs_f64(),
        std::fs::metadata(&out).expect("bundle").len() >> 20
    );
    out
}

/// For the upgrade benchmarks: qemu-dev 0.1.0 built in `DIR/v1`, a 0.2.0 bundle signed with the
/// development key (`DIR/qemu-dev-0.2.0.nasos`) and a USB stick image holding it (`DIR/stick.img`).
pub fn v1_and_0_2_0_stick(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let v1 = dir.join("v1");
    nasos(&["build", "recipes/qemu-dev.toml", "--out", &v1.display().to_string()]);
    let recipe =
        recipe_variant(dir, "qemu-dev", "qemu-dev-0.2.0", |r| r.replace("version = \"0.1.0\"", "version = \"0.2.0\""));
    let bundle = dir.join("qemu-dev-0.2.0.nasos");
    let key = repo().join("recipes/keys/nasos-dev.key");
    nasos(&[
        "bundle",
        &recipe.display().to_string(),
        "--key",
        &key.display().to_string(),
        "--build",
        &dir.join("0.2.0").display().to_string(),
        "--out",
        &bundle.display().to_string(),
    ]);
    let stick = dir.join("stick.img");
    nasos_qemu::usb_stick(&bundle, &stick).expect("stick");
    (v1, bundle, stick)
}

/// The sha256 of a file, as hex (`sha256sum`; empty if it cannot be read).
pub fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().expect("sha256sum");
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or("").to_string()
}

/// nasos's cache directory, resolved as `nasos build` does: `$NASOS_CACHE`, else
/// `$XDG_CACHE_HOME/nasos`, else `~/.cache/nasos`.
pub fn nasos_cache() -> PathBuf {
    std::env::var_os("NASOS_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|x| PathBuf::from(x).join("nasos")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/nasos")))
        .expect("a cache directory: set NASOS_CACHE")
}

/// A throwaway qcow2 overlay over a built disk, so boots never change the build output.
pub fn overlay(base: &Path, at: &Path) -> PathBuf {
    let _ = std::fs::remove_file(at);
    let base = base.canonicalize().expect("base");
    let st = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
        .arg(&base)
        .arg(at)
        .status()
        .expect("qemu-img");
    assert!(st.success());
    at.to_path_buf()
}

/// Boots a disk on the twin board with a fresh state directory (new blank bays) that `prepare`
/// may seed before QEMU starts.
pub fn boot(dir: &Path, base: &Path, tag: &str, memory_mib: u32, link: Link, prepare: impl FnOnce(&Path)) -> Vm {
    let state = dir.join(format!("vm-{tag}"));
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state).expect("state dir");
    prepare(&state);
    overlay(base, &state.join("run.qcow2"));
    boot_again(dir, tag, memory_mib, link)
}

/// Boots the VM of `tag` again on the disk, bays and EFI variables it has (after a power cut,
/// say): what was written before stays.
pub fn boot_again(dir: &Path, tag: &str, memory_mib: u32, link: Link) -> Vm {
    boot_again_with(dir, tag, memory_mib, link, None)
}

/// [`boot_again`], with Secure Boot on and the test keys of `secure_boot` enrolled when given.
pub fn boot_again_with(dir: &Path, tag: &str, memory_mib: u32, link: Link, secure_boot: Option<PathBuf>) -> Vm {
    start(dir, tag, memory_mib, link, secure_boot, TEST_CPUS, false)
}

/// Virtual CPUs of a test VM: one. Two (multi-threaded TCG, the host's second core) made boots
/// take about 0.6 of the time, but under multi-threaded TCG a guest sometimes stops getting
/// timer interrupts on CPU 0 after a kexec, and the kernel hangs in early boot (RCU stalls:
/// "timer wakeup didn't happen", "0 ticks this GP"): a kexec'd kernel did in the upgrade suite,
/// and the firmware boot after a watchdog reset that followed a kexec did in the appliance
/// suite. Every such hang was in a 2-vCPU guest; the benchmarks' 1-vCPU guests kexec'd some 20
/// times without one. It is QEMU's (real hardware has no such fault, and there the watchdog the
/// kexec keeps armed resets a kernel that hangs), so the suites run single-threaded TCG.
pub const TEST_CPUS: u32 = 1;

/// [`boot_again`] with `cpus` virtual CPUs (the boot benchmark boots both sides with one).
pub fn boot_again_cpus(dir: &Path, tag: &str, memory_mib: u32, link: Link, cpus: u32) -> Vm {
    start(dir, tag, memory_mib, link, None, cpus, false)
}

/// [`boot_again`] on one vCPU whose clock counts instructions (see `nasos_qemu::Spec::icount`):
/// the boot benchmark's A/B mode.
pub fn boot_again_icount(dir: &Path, tag: &str, memory_mib: u32, link: Link) -> Vm {
    start(dir, tag, memory_mib, link, None, 1, true)
}

fn start(
    dir: &Path,
    tag: &str,
    memory_mib: u32,
    link: Link,
    secure_boot: Option<PathBuf>,
    cpus: u32,
    icount: bool,
) -> Vm {
    let state = dir.join(format!("vm-{tag}"));
    let disk = state.join("run.qcow2");
    let spec = Spec {
        board: board("qemu-q35"),
        disk,
        state: state.clone(),
        memory_mib,
        cpus,
        serial: Serial::Socket(state.join("console.sock")),
        qmp: Some(state.join("qmp.sock")),
        links: vec![link],
        usb: None,
        secure_boot,
        icount,
    };
    Vm::start(&spec, &dir.join(format!("console-{tag}.log"))).expect("start QEMU")
}

/// The JSON value a command printed on a console. The console is shared: the kernel, nasinit and
/// the health agent write their lines to it too, so one may land before, inside or after the
/// value. Such lines begin with a word and a colon (`health: WARNING …`) or a kernel timestamp,
/// which no line of pretty-printed JSON does; they are left out, and anything after the value
/// is ignored.
pub fn console_json(out: &str) -> serde_json::Value {
    let said = |l: &str| {
        let head = l.split(':').next().unwrap_or("");
        let printk = l.strip_prefix('[').and_then(|r| r.split_once(']')).is_some_and(|(t, _)| {
            let t = t.trim();
            !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.')
        });
        printk
            || (!l.starts_with([' ', '{', '}', '[', ']', '"'])
                && !head.is_empty()
                && head.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
    };
    let kept: String = out.lines().filter(|l| !said(l)).map(|l| format!("{l}\n")).collect();
    let start = kept.find(['{', '[']).unwrap_or_else(|| panic!("no JSON in {out:?}"));
    serde_json::Deserializer::from_str(&kept[start..])
        .into_iter::<serde_json::Value>()
        .next()
        .unwrap_or_else(|| panic!("no JSON in {out:?}"))
        .unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Runs a command on a console and insists it succeeds.
pub fn ok(vm: &mut Vm, cmd: &str) -> String {
    let (out, code) = vm.run(cmd, Duration::from_secs(300)).unwrap_or_else(|e| panic!("`{cmd}`: {e}"));
    assert_eq!(code, 0, "`{cmd}` failed:\n{out}");
    out
}

/// Runs `cmd` until its output contains `needle` or `within` has passed; returns the last output.
pub fn poll(vm: &mut Vm, cmd: &str, needle: &str, within: Duration) -> String {
    poll_until(vm, cmd, |out| out.contains(needle), within)
}

/// Runs `cmd` until its output satisfies `done` or `within` has passed; returns the last output.
pub fn poll_until(vm: &mut Vm, cmd: &str, done: impl Fn(&str) -> bool, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let out = ok(vm, cmd);
        if done(&out) || Instant::now() >= deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The sha256 digest in a command's output.
pub fn digest(out: &str) -> String {
    out.split_whitespace()
        .find(|w| w.len() == 64 && w.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(|| panic!("no sha256 in {out:?}"))
        .to_string()
}

/// The qemu-dev appliance and a qemu-client GPU node on one private network, both ready,
/// started the way an operator starts them: `nasos qemu recipes/qemu-dev.toml --client
/// recipes/qemu-client.toml`, with both consoles on sockets and blank bays.
pub struct Pair {
    pub nas: Vm,
    pub gpu: Vm,
    /// The disaster-recovery twin (recipes/qemu-dr.toml), when started with one.
    pub dr: Option<Vm>,
    qmp: PathBuf,
}

impl Pair {
    pub fn start(dir: &Path) -> Pair {
        Pair::boot(dir, false)
    }

    /// The pair and the disaster-recovery twin at 10.77.0.2, on one network (a hub in the
    /// appliance's QEMU).
    pub fn start_with_dr(dir: &Path) -> Pair {
        Pair::boot(dir, true)
    }

    fn boot(dir: &Path, with_dr: bool) -> Pair {
        build_binaries();
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).expect("dir");
        let (nas_sock, gpu_sock, qmp) = (dir.join("nas.sock"), dir.join("gpu.sock"), dir.join("qmp.sock"));
        let gpu_qmp = dir.join("gpu-qmp.sock");
        let log = std::fs::File::create(dir.join("nasos-qemu.log")).expect("log");
        let (dr_sock, dr_qmp) = (dir.join("dr.sock"), dir.join("dr-qmp.sock"));
        let mut cmd = Command::new(target_release().join("nasos"));
        cmd.args(["qemu", "recipes/qemu-dev.toml", "--headless", "--client", "recipes/qemu-client.toml"]);
        if with_dr {
            cmd.args(["--peer", "recipes/qemu-dr.toml", "--peer-serial"]).arg(&dr_sock).arg("--peer-qmp").arg(&dr_qmp);
        }
        let nasos = cmd
            .arg("--serial")
            .arg(&nas_sock)
            .arg("--client-serial")
            .arg(&gpu_sock)
            .arg("--qmp")
            .arg(&qmp)
            .arg("--client-qmp")
            .arg(&gpu_qmp)
            .arg("--state")
            .arg(dir.join("state"))
            .current_dir(repo())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("nasos qemu");
        // Building both images if they changed takes a while; the consoles appear after that.
        let wait = Duration::from_secs(1200);
        let nas = Vm::attach(&nas_sock, &dir.join("console-nas.log"), Some(qmp.clone()), Some(nasos), wait)
            .unwrap_or_else(|e| panic!("{e:#}; see {}", dir.join("nasos-qemu.log").display()));
        let gpu = Vm::attach(&gpu_sock, &dir.join("console-gpu.log"), Some(gpu_qmp), None, Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("{e:#}; see {}", dir.join("nasos-qemu.log").display()));
        let dr = with_dr.then(|| {
            Vm::attach(&dr_sock, &dir.join("console-dr.log"), Some(dr_qmp), None, Duration::from_secs(120))
                .unwrap_or_else(|e| panic!("{e:#}; see {}", dir.join("nasos-qemu.log").display()))
        });
        let mut pair = Pair { nas, gpu, dr, qmp };
        pair.nas.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("appliance ready");
        pair.gpu.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("client ready");
        if let Some(dr) = &mut pair.dr {
            dr.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("DR twin ready");
        }
        pair
    }

    /// Mounts the training export on the client over one transport.
    pub fn mount(&mut self, transport: &str, dir: &str) {
        mount_train(&mut self.gpu, transport, dir);
    }

    /// Ends both VMs as an operator would: the appliance's QEMU quits, and `nasos qemu` takes
    /// the client down with it and exits.
    pub fn kill(mut self) {
        let _ = self.nas.qmp("quit", serde_json::json!({}));
        if self.nas.wait_exit(Duration::from_secs(60)).is_err() {
            eprintln!("nasos qemu did not exit after QMP quit ({}); killing it", self.qmp.display());
        }
        self.nas.kill();
    }
}

/// Mounts the appliance's training export on a client over one transport ("rdma" or "tcp")
/// and proves which one it rides, from /proc/mounts and mountstats.
pub fn mount_train(gpu: &mut Vm, transport: &str, dir: &str) {
    let opts = if transport == "rdma" { "vers=4.2,proto=rdma,port=20049" } else { "vers=4.2,proto=tcp" };
    ok(gpu, &format!("mkdir -p {dir} && mount -t nfs -o {opts} 10.77.0.1:/export/tank/train {dir}"));
    let mount = ok(gpu, &format!("grep ' {dir} ' /proc/mounts"));
    assert!(mount.contains(&format!("proto={transport}")), "{transport}: {mount}");
    let xprt = ok(
        gpu,
        &format!(
            "awk -v d='mounted on {dir} ' 'index($0, d) {{f=1}} f && /xprt:/ {{print; exit}}' /proc/self/mountstats"
        ),
    );
    assert!(
        xprt.contains(&format!("xprt:\t{transport}")) || xprt.contains(&format!("xprt: {transport}")),
        "{transport}: {xprt}"
    );
}

/// `apt-get install PACKAGE` (no recommends), waiting for dpkg's lock (the other lane may be
/// installing its own tool), once more after `apt-get update` if a fresh machine's package
/// lists are missing or old. Whether it succeeded.
pub fn apt_install(package: &str) -> bool {
    let apt = |args: &[&str]| {
        std::process::Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=600"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    let install = || apt(&["install", "-y", "-qq", "--no-install-recommends", package]);
    install() || (apt(&["update", "-qq"]) && install())
}

/// A host tool a test needs beyond what `nasos` installs (e.g. `promtool`): installed with apt
/// (no recommends) when it is missing and the tests run as root; otherwise the panic names the
/// package to install.
pub fn host_tool(path: &str, package: &str) -> PathBuf {
    if !Path::new(path).exists() {
        let root = std::process::Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0"));
        assert!(root, "{path} is missing: install the Debian package {package}");
        eprintln!("installing {package} for {path}");
        assert!(apt_install(package) && Path::new(path).exists(), "apt-get install {package} did not provide {path}");
    }
    PathBuf::from(path)
}

#[cfg(test)]
mod tests {
    use super::console_json;

    #[test]
    fn console_lines_around_and_inside_json_are_left_out() {
        let out = "nasinit: watchdog armed\n{\n  \"a\": [\n[   12.5] nvme nvme0: pci function\n    1\n  ],\nhealth: WARNING replication tank/train → dr: behind\n  \"b\": \"x: y\"\n}\nhealth: CRITICAL BAY07: drive missing\n{\"next\": 1}\n";
        let v = console_json(out);
        assert_eq!(v, serde_json::json!({"a": [1], "b": "x: y"}));
        assert_eq!(console_json("root@nasos-dev:~# [1, 2]\n"), serde_json::json!([1, 2]));
    }
}
