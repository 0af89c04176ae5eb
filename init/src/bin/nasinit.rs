//! nasinit: PID 1 of the appliance, or (for tests and development) a supervisor that makes itself
//! a child subreaper. See init/README.md.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use nasos_board::Plan;
use nasos_exec::Tool;
use nasos_init::cgroup::CgroupRoot;
use nasos_init::console::Console;
use nasos_init::run::{Options, run};
use nasos_init::supervisor::Config;
use nasos_init::view::BootFacts;
use nasos_init::watchdog::Watchdog;
use nasos_init::{early, finish, laps, state};
use nasos_layout::{agents, paths};

#[derive(Parser)]
#[command(name = "nasinit", about = "The nasos appliance's PID 1 and service supervisor")]
struct Args {
    /// The plan to run.
    #[arg(long, default_value = paths::PLAN)]
    plan: PathBuf,
    /// Control socket.
    #[arg(long, default_value = paths::CONTROL_SOCKET)]
    control: PathBuf,
    /// Runtime directory (notify sockets).
    #[arg(long, default_value = "/run/nasinit")]
    run_dir: PathBuf,
    /// Directory for per-service log files; none when absent or not writable.
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Do not put services in cgroups (they can then escape a stop by calling setsid).
    #[arg(long)]
    no_cgroups: bool,
    /// A state directory (tests: the failed-boot counter of the boot deadline's guard).
    #[arg(long)]
    state: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Load one of the plan's module sets with the modules' options (and, for the set holding
    /// the drives' driver, wait for udev to name the bays); the set's service runs this.
    #[command(name = agents::NASINIT_LOAD_MODULES)]
    LoadModules {
        /// The set, by the service that loads it (`modules`, `modules-storage`, ...).
        #[arg(default_value = "modules")]
        set: String,
    },
    /// Wait for udev to name the bays and their partitions (after a pool was created and its
    /// disks partitioned).
    #[command(name = agents::NASINIT_WAIT_BAYS)]
    WaitBays,
    /// Never finish (what a development recipe's `[debug] hang_services` runs instead of a
    /// service, to test start timeouts and the boot deadline).
    #[command(name = agents::NASINIT_DEBUG_HANG)]
    DebugHang,
    /// The console service of an image that ships no password: on the first boot, ask for
    /// root's password on DEVICE and keep it; then run the getty.
    #[command(name = agents::NASINIT_CONSOLE)]
    Console {
        /// The console's tty, e.g. ttyS0.
        device: String,
        /// The getty and its arguments.
        #[arg(last = true, required = true)]
        getty: Vec<String>,
    },
}

fn main() -> ExitCode {
    let t0 = Instant::now();
    if std::process::id() == 1 {
        pid1(t0);
    }
    let args = Args::parse();
    match args.command {
        Some(Command::LoadModules { set }) => load_modules(&args.plan, &set),
        Some(Command::Console { device, getty }) => {
            let e = nasos_init::firstboot::console(&device, &getty);
            eprintln!("nasinit console: cannot run {}: {e}", getty.join(" "));
            ExitCode::from(1)
        }
        Some(Command::DebugHang) => {
            println!("debug: hanging on purpose (a development recipe's [debug] hang_services)");
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        Some(Command::WaitBays) => match read_plan(&args.plan) {
            Ok(plan) => {
                let present = early::wait_for_bays(&plan.bays, std::time::Duration::from_secs(10));
                println!("{} of {} bays present", present.len(), plan.bays.len());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        },
        None => supervise(args, t0),
    }
}

fn read_plan(path: &std::path::Path) -> Result<Plan, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read plan {}: {e}", path.display()))?;
    Plan::from_json(&text).map_err(|e| format!("plan {}: {e}", path.display()))
}

/// PID 1: tolerant of any argv the kernel passes, never returns.
fn pid1(t0: Instant) -> ! {
    let kernel_ms = early::kernel_ms();
    let console = Console::new(false);
    let mut took = laps::Laps::default();
    early::mount_api_filesystems(&console);
    took.lap("api filesystems");
    early::writable_overlays(&console);
    took.lap("overlays");
    let console = Console::new(true);
    console.say(&format!("started {:.2}s after the kernel", kernel_ms as f64 / 1000.0));
    // Ctrl-Alt-Del becomes SIGINT to PID 1 (an orderly reboot) instead of the kernel's instant
    // reset.
    if let Err(e) = nix::sys::reboot::set_cad_enabled(false) {
        console.say(&format!("cannot take Ctrl-Alt-Del from the kernel: {e}"));
    }
    let brought = state::bring_up(&console);
    took.take(brought.took.clone());
    let facts = BootFacts {
        kernel_ms,
        boot: brought.boot,
        last_boot: brought.last_end.map(|e| e.describe().to_string()).unwrap_or_default(),
        state_partition: match &brought.device {
            Ok(d) if brought.created => format!("{} (made this boot)", d.display()),
            Ok(d) => d.display().to_string(),
            Err(why) => format!("none: {why}"),
        },
        state_root: brought.device.is_ok().then(|| brought.state.root.clone()),
        why_not_ready: String::new(),
        previous: brought
            .device
            .is_ok()
            .then(|| brought.state.boots().iter().rev().nth(1).map(|p| (brought.state.root.clone(), *p)))
            .flatten(),
    };
    match (&brought.device, brought.last_end) {
        (Ok(d), Some(end)) => console.say(&format!(
            "state on {}, boot {}; the last boot ended: {}",
            d.display(),
            brought.boot,
            end.describe()
        )),
        (Ok(d), None) => console.say(&format!("state on {}, boot {} (first boot)", d.display(), brought.boot)),
        (Err(_), _) => {}
    }
    let plan = match read_plan(std::path::Path::new(paths::PLAN)) {
        Ok(p) => p,
        Err(e) => {
            console.say(&format!("{e}; running with no services"));
            Plan::empty("nasos")
        }
    };
    took.lap("plan");
    early::set_hostname(&plan.image.hostname, &console);
    early::scheduler_without_autogroups(&console);
    let cgroups = match CgroupRoot::at(std::path::Path::new("/sys/fs/cgroup")) {
        Ok(c) => Some(c),
        Err(e) => {
            console.say(&format!("no cgroups ({e}): services are tracked by session only"));
            None
        }
    };
    took.lap("cgroups");
    // Service logs go to this boot's directory on the state partition (kept for later boots);
    // /var/log/nasinit points there for an operator.
    let log_dir = brought.state.boot_dir(brought.boot).join("log");
    let _ = std::fs::create_dir_all(&log_dir);
    let _ = std::fs::remove_dir_all(paths::SERVICE_LOG_DIR);
    let _ = std::os::unix::fs::symlink(&log_dir, paths::SERVICE_LOG_DIR);
    let writable = nix::unistd::access(&log_dir, nix::unistd::AccessFlags::W_OK).is_ok();
    let config = Config {
        plan,
        run_dir: early::run_dir(),
        log_dir: writable.then(|| log_dir.clone()),
        cgroups,
        pid1: true,
        facts,
    };
    let mut watchdog =
        Watchdog::new(&config.plan.health.watchdog_identity, config.plan.health.watchdog_timeout_seconds, t0);
    took.lap("logs");
    // Everything so far is on the way to serving: no service runs yet.
    console.say(&format!("{:.2}s before the first service: {}", t0.elapsed().as_secs_f64(), took.describe()));
    let opts = Options { config, control_socket: PathBuf::from(paths::CONTROL_SOCKET) };
    loop {
        match run(opts.clone(), t0, console.clone(), watchdog.as_mut()) {
            Ok((kind, sup)) => {
                let end = sup.end();
                let hang = sup.hang_shutdown();
                // Close the service logs: the state partition must unmount cleanly.
                drop(sup);
                finish::finish(kind, end, &console, Some((&brought.state, brought.boot)), watchdog.as_mut(), hang)
            }
            Err(e) => {
                console.say(&format!("event loop failed: {e}; retrying in 5s"));
                std::thread::sleep(std::time::Duration::from_secs(5));
            }
        }
    }
}

/// Supervisor mode for tests and development: a child subreaper with its own cgroup subtree.
fn supervise(args: Args, t0: Instant) -> ExitCode {
    let console = Console::new(false);
    let plan = match read_plan(&args.plan) {
        Ok(p) => p,
        Err(e) => {
            console.say(&e);
            return ExitCode::from(2);
        }
    };
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        console.say(&format!("cannot become a child subreaper: {e}"));
        return ExitCode::from(2);
    }
    let cgroups = if args.no_cgroups {
        None
    } else {
        match CgroupRoot::beside_self() {
            Ok(c) => Some(c),
            Err(e) => {
                console.say(&format!("no cgroups ({e}): services are tracked by session only"));
                None
            }
        }
    };
    if let Some(d) = &args.log_dir {
        let _ = std::fs::create_dir_all(d);
    }
    let facts = BootFacts { kernel_ms: -1, state_root: args.state.clone(), ..BootFacts::default() };
    let config = Config { plan, run_dir: args.run_dir, log_dir: args.log_dir, cgroups, pid1: false, facts };
    let opts = Options { config, control_socket: args.control.clone() };
    match run(opts, t0, console.clone(), None) {
        Ok((kind, sup)) => {
            if let Some(c) = sup.cgroups() {
                c.remove();
            }
            let _ = std::fs::remove_file(&args.control);
            console.say(&format!("{kind:?} complete").to_lowercase());
            ExitCode::SUCCESS
        }
        Err(e) => {
            console.say(&format!("cannot run: {e}"));
            ExitCode::from(2)
        }
    }
}

/// CPU time (user and system) of this process's reaped children so far, in ms.
fn children_cpu_ms() -> i64 {
    use nix::sys::resource::{UsageWho, getrusage};
    let ms = |t: nix::sys::time::TimeVal| t.tv_sec() * 1000 + t.tv_usec() / 1000;
    getrusage(UsageWho::RUSAGE_CHILDREN).map(|r| ms(r.user_time()) + ms(r.system_time())).unwrap_or(0)
}

/// Loads the plan's module set `set`, each module with its options, in order; the set holding
/// the drives' driver then waits for udev to name the bays. Every module is tried; the exit
/// status says whether all loaded. Empty bays are not an error.
fn load_modules(plan: &std::path::Path, set: &str) -> ExitCode {
    let plan = match read_plan(plan) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let Some(set) = plan.kernel.module_sets.iter().find(|s| s.service == set) else {
        let known: Vec<&str> = plan.kernel.module_sets.iter().map(|s| s.service.as_str()).collect();
        eprintln!("the plan has no module set {set} (it has: {})", known.join(" "));
        return ExitCode::from(2);
    };
    if set.bays {
        // The drives' driver loaded before udevd ran (in the initramfs or the drives' set):
        // replay only the drives' block devices' add events (their rules name the bays, and
        // libzfs's import waits for udev to have seen each member), not a coldplug of every
        // device. First, so that udev works through them while this set's modules load.
        let t = Instant::now();
        let replay = Tool::new("/usr/bin/udevadm")
            .args(["trigger", "--action=add", "--subsystem-match=block", "--sysname-match=nvme*"])
            .timeout(Duration::from_secs(40));
        match replay.run() {
            Ok(_) => println!("replayed the drives' add events in {} ms", t.elapsed().as_millis()),
            Err(e) => println!("{e}"),
        }
    }
    let mut failed = Vec::new();
    for m in &set.modules {
        let options = plan.kernel.module_options.get(m).into_iter().flatten().map(|(k, v)| format!("{k}={v}"));
        // A module's init can hang on broken hardware; the deadline turns that into a named
        // failure of this service instead of a boot that never becomes ready.
        let modprobe = Tool::new("/usr/sbin/modprobe").arg(m).args(options).timeout(Duration::from_secs(60));
        let (t, cpu) = (Instant::now(), children_cpu_ms());
        match modprobe.run() {
            // On a busy boot the wall time is mostly waiting for the CPU; the CPU time is what
            // the module costs (its init in modprobe's system call; not work it hands to kernel
            // threads, such as a driver's asynchronous probe).
            Ok(_) => println!("loaded {m} in {} ms ({} ms CPU)", t.elapsed().as_millis(), children_cpu_ms() - cpu),
            Err(e) => {
                println!("{e}");
                failed.push(m.clone());
            }
        }
    }
    if set.bays {
        let t = Instant::now();
        let linked = early::wait_for_bays(&plan.bays, Duration::from_secs(10));
        let missing: Vec<&str> =
            plan.bays.iter().map(|b| b.name.as_str()).filter(|b| !linked.iter().any(|l| l == b)).collect();
        println!(
            "{} of {} bays present after {} ms{}",
            linked.len(),
            plan.bays.len(),
            t.elapsed().as_millis(),
            if missing.is_empty() { String::new() } else { format!("; empty: {}", missing.join(" ")) }
        );
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("not loaded: {}", failed.join(" "));
        ExitCode::from(1)
    }
}
