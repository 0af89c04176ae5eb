//! nasctl: control and inspect nasinit, typically from the serial console.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use nasos_api::{self as api, Client, ServiceInfo, ShutdownKind};
use nasos_layout::state::State;
use nasos_services::inspect;
use nasos_services::snapshots::ops as snapshots;
use serde::Serialize;

mod wait;

#[derive(Parser)]
#[command(name = "nasctl", about = "Control and inspect the nasos appliance")]
struct Args {
    /// nasinit's control socket.
    #[arg(long, env = "NASINIT_SOCKET", default_value = api::DEFAULT_SOCKET, global = true)]
    socket: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The appliance's overall state.
    Status,
    /// Every service with its state, pid, restarts and last exit.
    Services,
    /// A service's recent output.
    Logs {
        name: String,
        /// Keep printing new lines as they come.
        #[arg(short, long)]
        follow: bool,
        /// How many recent lines to show first.
        #[arg(short = 'n', long, default_value_t = 50)]
        lines: u32,
        /// An earlier boot's log, from the state partition: -1 is the previous boot, -2 the one
        /// before (0 is this boot).
        #[arg(long, allow_hyphen_values = true, value_parser = clap::value_parser!(i64).range(..=0))]
        boot: Option<i64>,
    },
    /// The boots the state partition remembers, and how each ended.
    Boots,
    /// Clear this box's state (identity, root password, logs, NFS state) and reboot; the pools
    /// and their data are kept. Asks for the hostname as confirmation.
    FactoryReset,
    /// Start a stopped or failed service; returns once it is ready (or says why it is not).
    Start {
        name: String,
        /// Return once nasinit has the request, without waiting.
        #[arg(long)]
        no_block: bool,
    },
    /// Stop a service (it stays stopped until started); returns once its processes are gone.
    Stop {
        name: String,
        /// Return once nasinit has the request, without waiting.
        #[arg(long)]
        no_block: bool,
    },
    /// Stop and start a service; returns once it is ready again (or says why it is not).
    Restart {
        name: String,
        /// Return once nasinit has the request, without waiting.
        #[arg(long)]
        no_block: bool,
    },
    /// When each service started and became ready.
    Timeline,
    /// ZFS pools: health, space, each member by bay, datasets.
    Pools,
    /// What the NFS server exports now, its listeners and threads.
    Exports,
    /// Tenants: each team's dataset, space used against its quota, networks and exports.
    Tenants,
    /// Kerberos: the realm, the joined keytab and the principal NFS accepts tickets for.
    Kerberos {
        #[command(subcommand)]
        what: Option<Kerberos>,
    },
    /// Fabric links: state, addresses, RDMA ports and RoCE v2 GIDs, DCB as the NIC runs it.
    Fabric,
    /// The firewall as it runs: the ports each link answers on (from the plan) and how many
    /// packets were dropped.
    Firewall,
    /// After a drive was swapped in BAY: resilver the bay's pool member onto the new (blank)
    /// disk, or bring the same disk back online. A disk holding anything else is refused.
    Replace { bay: String },
    /// Snapshots (of DATASET and below): kind, when taken, space, and until when they are held.
    Snapshots { dataset: Option<String> },
    /// Take a snapshot of DATASET now (named manual-TIME unless NAME is given); the policy never
    /// prunes it.
    Snapshot {
        dataset: String,
        name: Option<String>,
        /// Hold it this long (`14d`, `12h`; units s, m, h, d, w): it cannot be destroyed or
        /// released before then.
        #[arg(long)]
        hold: Option<String>,
    },
    /// Destroy a snapshot (DATASET@NAME). Refused while it is held.
    Destroy { snapshot: String },
    /// Release nasos's holds on a snapshot once their time has passed. Refused before.
    Release { snapshot: String },
    /// Roll a dataset back to a snapshot, destroying the snapshots taken after it. Says what
    /// goes and asks for the dataset's name as confirmation; refused past a held snapshot.
    Rollback {
        snapshot: String,
        /// Do not ask (scripts).
        #[arg(long)]
        yes: bool,
    },
    /// Replication: each dataset sent to a peer (newest common snapshot, lag, bytes, last
    /// error) and each replica peers send here.
    Replication {
        #[command(subcommand)]
        what: Option<Replication>,
    },
    /// Health: every check that is not ok, what this machine cannot check, and recent alerts
    /// (kept across reboots).
    Health {
        /// How many recent alerts to show.
        #[arg(short = 'n', long, default_value_t = 20)]
        alerts: usize,
    },
    /// Field upgrades: install a signed bundle on the inactive slot, or show both slots.
    Upgrade {
        #[command(subcommand)]
        what: Upgrade,
    },
    /// Fault injection for development images.
    Debug {
        #[command(subcommand)]
        what: Debug,
    },
    /// Stop all services and reboot. The next boot's kernel is started directly (kexec), skipping
    /// the firmware's POST; boot tries are counted as systemd-boot counts them. Where that cannot
    /// be done it says why and reboots through the firmware.
    Reboot {
        /// Reboot through the firmware (a full reset of the hardware).
        #[arg(long)]
        firmware: bool,
    },
    /// Stop all services and power off.
    Poweroff,
    /// Stop all services and halt.
    Halt,
}

#[derive(Subcommand)]
enum Upgrade {
    /// Check and install a bundle: a path on the box (e.g. on a dataset, copied there over
    /// NFS), `usb:` (the one *.nasos file on a USB stick's FAT filesystem) or an http:// URL
    /// (streamed, never stored whole). Nothing is written before its signature, board and
    /// version are checked; the running version stays the fallback.
    Apply {
        source: String,
        /// Reboot into the new version once it is installed.
        #[arg(long)]
        reboot: bool,
        /// Install an older version than the running one. It boots once; blessed, it stays
        /// (the newer entry is removed); otherwise the running version boots again.
        #[arg(long)]
        allow_downgrade: bool,
    },
    /// Both slots, their versions, which one runs, tries left, and the history.
    Status,
}

#[derive(Subcommand)]
enum Replication {
    /// This box's replication key, for the `key` file of its peers' recipes.
    Key,
    /// Make a replica here writable for a failover; it takes no more sends from its peer.
    Promote { dataset: String },
    /// Send every replicated dataset now, not at its next scheduled round (e.g. before
    /// maintenance); `nasctl logs replication -f` shows it.
    Send,
}

#[derive(Subcommand)]
enum Kerberos {
    /// Keep KEYTAB (a keytab with this box's nfs/ principal, from the realm's kadmin `ktadd` or
    /// AD's `ktpass`) on the state partition, where it survives reboots and upgrades, and
    /// restart NFS so krb5 exports accept tickets for it.
    Join { keytab: PathBuf },
}

#[derive(Subcommand)]
enum Debug {
    /// Stop nasinit's event loop, as a hung PID 1 would: the hardware watchdog must reset the
    /// box. Refused on a non-development image.
    Freeze,
    /// Reboot, and hang the shutdown after the services stopped, before the filesystems are
    /// synced: the hardware watchdog must end it. Refused on a non-development image.
    HangShutdown,
}

fn main() -> ExitCode {
    // `nasctl logs storage | head` ends quietly when head has read enough, as other commands
    // do, instead of panicking on a closed pipe (Rust ignores SIGPIPE by default).
    // SAFETY: no other thread exists yet, and the default disposition installs no handler.
    unsafe {
        let _ = nix::sys::signal::signal(nix::sys::signal::Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl);
    }
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nasctl: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nasctl: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn print<T: Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn secs(ms: i64) -> String {
    if ms < 0 { "-".to_string() } else { format!("{:.2}s", ms as f64 / 1000.0) }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let json = args.json;
    // These read the running system directly; they work even when nasinit's socket does not.
    match args.command {
        Command::Pools => return show_pools(json),
        Command::Exports => return show_exports(json),
        Command::Fabric => return show_fabric(json),
        Command::Firewall => {
            print!("{}", inspect::firewall(json)?);
            return Ok(());
        }
        Command::Health { alerts } => return show_health(json, alerts),
        Command::Replace { bay } => {
            println!("{}", nasos_services::storage::replace(&bay)?);
            return Ok(());
        }
        Command::Snapshots { dataset } => return show_snapshots(dataset.as_deref(), json),
        Command::Tenants => return show_tenants(json),
        Command::Kerberos { what: None } => return show_kerberos(json),
        Command::Snapshot { dataset, name, hold } => {
            let secs = match &hold {
                Some(h) => Some(nasos_services::snapshots::parse_duration(h).with_context(|| {
                    format!("--hold {h}: write a whole number with a unit (s, m, h, d or w), e.g. 14d")
                })?),
                None => None,
            };
            println!("{}", snapshots::take(&dataset, name.as_deref(), secs)?);
            return Ok(());
        }
        Command::Destroy { snapshot } => {
            println!("{}", snapshots::destroy(&snapshot)?);
            return Ok(());
        }
        Command::Release { snapshot } => {
            println!("{}", snapshots::release(&snapshot)?);
            return Ok(());
        }
        Command::Rollback { snapshot, yes } => return rollback(&snapshot, yes),
        Command::Replication { what: None } => return show_replication(json),
        Command::Replication { what: Some(Replication::Send) } => {}
        Command::Replication { what: Some(Replication::Key) } => {
            println!("{}", nasos_services::replication::identity_public()?);
            return Ok(());
        }
        Command::Replication { what: Some(Replication::Promote { dataset }) } => {
            println!("{}", nasos_services::replication::ops::promote(&dataset)?);
            return Ok(());
        }
        Command::Logs { name, lines, boot: Some(back), .. } => return show_old_log(&name, lines, back),
        Command::Boots => return show_boots(json),
        Command::Upgrade { what: Upgrade::Status } => return show_upgrade(json),
        Command::Upgrade { what: Upgrade::Apply { source, reboot: false, allow_downgrade } } => {
            return apply_upgrade(&source, allow_downgrade);
        }
        _ => {}
    }
    let client = Client::connect(&args.socket).await?;
    match args.command {
        Command::Status => {
            let s = client.status().await?;
            if json {
                return print(&s);
            }
            println!("{} {} on {} — {}", s.image, s.version, s.hostname, s.state);
            println!("services  {} ready, {} failed, {} total", s.services_ready, s.services_failed, s.services);
            println!("uptime    {}", secs(s.uptime_ms));
            println!("ready in  {}", secs(s.ready_ms));
            if s.kernel_ms >= 0 {
                println!("kernel    {} before nasinit", secs(s.kernel_ms));
            }
            if s.boot > 0 {
                let last = if s.last_boot.is_empty() { "none (first boot)" } else { s.last_boot.as_str() };
                println!("boot      {} (last boot ended: {last})", s.boot);
            }
            println!("state     {}", s.state_partition);
            println!("firmware  {}", secure_boot_line(std::path::Path::new("/sys")));
            if !s.why_not_ready.is_empty() {
                println!("NOT READY {}", s.why_not_ready);
            }
        }
        Command::Services => {
            let list = client.services().await?;
            if json {
                return print(&list);
            }
            print_services(&list);
        }
        Command::Logs { name, follow, lines, .. } => {
            let mut page = client.logs(&name, 0, lines).await?;
            loop {
                for l in &page.lines {
                    if json {
                        println!("{}", serde_json::to_string(l)?);
                    } else {
                        println!("{}", l.text);
                    }
                }
                if !follow {
                    break;
                }
                // Client-side polling keeps nasinit free of per-client state and timers.
                tokio::time::sleep(Duration::from_millis(250)).await;
                page = client.logs(&name, page.next, 10_000).await?;
            }
        }
        Command::Start { name, no_block } => {
            client.start(&name).await?;
            if !no_block {
                wait::until(&client, &name, wait::Goal::Up, wait::START_LIMIT).await?;
            }
        }
        Command::Stop { name, no_block } => {
            client.stop(&name).await?;
            if !no_block {
                wait::until(&client, &name, wait::Goal::Down, wait::STOP_LIMIT).await?;
            }
        }
        Command::Restart { name, no_block } => {
            client.restart(&name).await?;
            if !no_block {
                wait::until(&client, &name, wait::Goal::Up, wait::START_LIMIT).await?;
            }
        }
        Command::Timeline => {
            let t = client.timeline().await?;
            let s = client.status().await?;
            if json {
                #[derive(Serialize)]
                struct Timeline<'a> {
                    kernel_ms: i64,
                    ready_ms: i64,
                    services: &'a [api::TimelineEntry],
                }
                return print(&Timeline { kernel_ms: s.kernel_ms, ready_ms: s.ready_ms, services: &t });
            }
            // The name column fits the longest service name (`modules-storage`).
            let w = t.iter().map(|e| e.name.len()).max().unwrap_or(0).max("appliance".len()) + 2;
            if s.kernel_ms >= 0 {
                println!("{:<w$} {:>9}", "kernel", secs(s.kernel_ms));
            }
            println!("{:<w$} {:>9} {:>9} {:>9}", "SERVICE", "STARTED", "READY", "TOOK");
            for e in &t {
                let took =
                    if e.ready_ms >= 0 && e.started_ms >= 0 { secs(e.ready_ms - e.started_ms) } else { "-".into() };
                println!("{:<w$} {:>9} {:>9} {:>9}", e.name, secs(e.started_ms), secs(e.ready_ms), took);
            }
            println!("{:<w$} {:>9} {:>9}", "appliance", "", secs(s.ready_ms));
        }
        Command::FactoryReset => factory_reset(&client).await?,
        Command::Debug { what: Debug::HangShutdown } => {
            client.debug_hang_shutdown().await?;
            println!("rebooting; the shutdown will hang before the sync, and the watchdog resets the box");
        }
        Command::Debug { what: Debug::Freeze } => {
            client.debug_freeze().await?;
            println!("nasinit's loop is frozen; the watchdog resets the box when its timeout passes");
        }
        Command::Kerberos { what: Some(Kerberos::Join { keytab }) } => {
            let plan = nasos_services::plan()?;
            let Some(k) = &plan.kerberos else {
                anyhow::bail!("this box's plan has no Kerberos realm: add [kerberos] to its recipe first");
            };
            let principal = nasos_services::kerberos::join(k, &keytab)?;
            println!("joined {}: NFS accepts tickets for {principal}", k.realm);
            if plan.nfs.as_ref().is_some_and(|n| n.gss) {
                client.restart("nfs").await?;
                println!("restarted nfs; `nasctl logs nfs` shows it");
            }
        }
        Command::Replication { what: Some(Replication::Send) } => {
            let list = client.services().await?;
            let pid = list.iter().find(|s| s.name == "replication").map_or(0, |s| s.pid);
            if pid == 0 {
                anyhow::bail!("the replication service is not running (this box sends nothing, or it stopped)");
            }
            let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).context("pid")?);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR1)
                .context("signalling the replication service")?;
            println!("asked the replication service for a round now; `nasctl logs replication -f` shows it");
        }
        Command::Upgrade { what: Upgrade::Apply { source, reboot: true, allow_downgrade } } => {
            apply_upgrade(&source, allow_downgrade)?;
            prepare_reboot(false);
            client.shutdown(ShutdownKind::Reboot).await?;
        }
        // Answered above, before connecting.
        Command::Pools
        | Command::Exports
        | Command::Fabric
        | Command::Firewall
        | Command::Health { .. }
        | Command::Replace { .. }
        | Command::Snapshots { .. }
        | Command::Tenants
        | Command::Kerberos { what: None }
        | Command::Snapshot { .. }
        | Command::Destroy { .. }
        | Command::Release { .. }
        | Command::Rollback { .. }
        | Command::Replication { .. }
        | Command::Boots
        | Command::Upgrade { .. } => {}
        Command::Reboot { firmware } => {
            prepare_reboot(firmware);
            client.shutdown(ShutdownKind::Reboot).await?;
        }
        Command::Poweroff => client.shutdown(ShutdownKind::Poweroff).await?,
        Command::Halt => client.shutdown(ShutdownKind::Halt).await?,
    }
    Ok(())
}

/// Loads the next boot's kernel for a fast reboot, or makes sure none is loaded (`firmware`);
/// says which reboot follows.
fn prepare_reboot(firmware: bool) {
    use nasos_services::upgrade::kexec;
    if firmware {
        let _ = kexec::unload();
        println!("reboot: through the firmware");
        return;
    }
    match kexec::prepare() {
        Ok(l) => println!("reboot: fast (kexec) into nasos {} ({}), skipping the firmware", l.version, l.entry),
        Err(e) => {
            let _ = kexec::unload();
            println!("reboot: through the firmware; a fast reboot cannot be done: {e:#}");
        }
    }
}

fn apply_upgrade(source: &str, allow_downgrade: bool) -> anyhow::Result<()> {
    use nasos_services::upgrade::apply;
    let done = apply::apply(&apply::Options { source: source.to_string(), allow_downgrade })?;
    println!(
        "upgrade: done in {:.1}s; reboot to start {} (nasctl reboot)",
        done.took.as_secs_f64(),
        done.manifest.version
    );
    Ok(())
}

fn show_snapshots(dataset: Option<&str>, json: bool) -> anyhow::Result<()> {
    let list = snapshots::list(dataset)?;
    if json {
        return print(&list);
    }
    if list.is_empty() {
        println!("no snapshots{}", dataset.map(|d| format!(" of {d}")).unwrap_or_default());
        return Ok(());
    }
    let w = list.iter().map(|v| v.name.len()).max().unwrap_or(0).max("SNAPSHOT".len());
    println!("{:<w$} {:<10} {:<19} {:>6} {:>6}  HELD", "SNAPSHOT", "KIND", "TAKEN (UTC)", "USED", "REFER");
    let now = nasos_services::unix_now();
    for v in &list {
        let mut held: Vec<String> = Vec::new();
        if let Some(u) = v.held_until {
            held.push(if u > now { format!("until {} UTC", utc(u)) } else { "hold expired".to_string() });
        }
        held.extend(v.held_by.iter().map(|t| format!("by {t}")));
        println!(
            "{:<w$} {:<10} {:<19} {:>6} {:>6}  {}",
            v.name,
            v.kind,
            utc(v.created),
            gib(Some(v.used_bytes)),
            gib(Some(v.referenced_bytes)),
            if held.is_empty() { "-".to_string() } else { held.join(", ") }
        );
    }
    Ok(())
}

fn show_replication(json: bool) -> anyhow::Result<()> {
    let v = nasos_services::replication::ops::view()?;
    if json {
        return print(&v);
    }
    let age = |s: Option<u64>| s.map_or("-".to_string(), nasos_services::snapshots::human_span);
    if v.jobs.is_empty() && v.replicas.is_empty() {
        println!("no replication in this box's plan");
    }
    for j in &v.jobs {
        let s = &j.state;
        let late = j.lag_seconds.is_some_and(|l| l > j.lag_alert_seconds);
        println!(
            "{} → {} ({}) every {} min: lag {}{}",
            j.dataset,
            j.peer,
            j.target,
            j.every_minutes,
            age(j.lag_seconds),
            if late { format!(" — LATE (alert after {})", age(Some(j.lag_alert_seconds))) } else { String::new() }
        );
        println!(
            "  common snapshot {}; last send {} ({}), {} in all, {} resumed",
            s.common.as_ref().map_or("none yet", |c| c.name.as_str()),
            if s.last_success > 0 { format!("{} UTC", utc(s.last_success)) } else { "never".into() },
            gib(Some(s.last_bytes)),
            gib(Some(s.total_bytes)),
            s.resumed
        );
        if let Some(e) = &s.last_error {
            println!("  last error: {e}");
        }
    }
    for r in &v.replicas {
        let what = match (&r.newest, r.exists) {
            (_, false) => "not received yet".to_string(),
            (None, true) => "no snapshot".to_string(),
            (Some(n), true) => format!("newest {n} ({} old)", age(r.age_seconds)),
        };
        let state = if r.promoted { "PROMOTED, writable" } else { "read-only replica" };
        println!("{} from {}: {state}, {what}", r.dataset, r.from);
    }
    Ok(())
}

/// Says what a rollback discards and destroys, asks for the dataset's name, then rolls back.
fn rollback(snapshot: &str, yes: bool) -> anyhow::Result<()> {
    let (dataset, _) = snapshots::split(snapshot).map_err(anyhow::Error::msg)?;
    let (taken, later) = snapshots::rollback_preview(snapshot)?;
    if !yes {
        println!("Rolling {dataset} back to {snapshot} discards every change made since {} UTC;", utc(taken));
        if later.is_empty() {
            println!("no later snapshot exists.");
        } else {
            println!("it destroys the {} snapshot(s) taken since: {}.", later.len(), later.join(", "));
        }
        println!("NFS clients see their files change under them. Type the dataset's name ({dataset}) to go on:");
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if answer.trim() != dataset {
            anyhow::bail!("not confirmed: nothing was changed");
        }
    }
    println!("{}", snapshots::rollback(snapshot)?);
    Ok(())
}

fn show_health(json: bool, n: usize) -> anyhow::Result<()> {
    use nasos_services::health;
    let report = health::report();
    let all = health::history(&State::mounted());
    let recent = &all[all.len().saturating_sub(n)..];
    if json {
        #[derive(Serialize)]
        struct Health<'a> {
            report: &'a Option<health::alerts::Report>,
            alerts: &'a [health::alerts::Alert],
        }
        return print(&Health { report: &report, alerts: recent });
    }
    match &report {
        None => println!("health: no report yet (the health service has not run a check this boot)"),
        Some(r) => {
            println!(
                "health: {} — {} not ok, {} ok (checked {} UTC)",
                r.overall.to_string().to_uppercase(),
                r.checks.len(),
                r.ok,
                utc(r.at)
            );
            for c in &r.checks {
                println!("  {:<9} {}", c.severity.to_string().to_uppercase(), c.message);
            }
            for u in &r.unchecked {
                println!("  not checked: {u}");
            }
        }
    }
    if recent.is_empty() {
        println!("no alerts recorded");
    } else {
        println!("recent alerts (of {} kept):", all.len());
        for a in recent {
            println!("  {}  {}", utc(a.at), a.line());
        }
    }
    Ok(())
}

fn show_upgrade(json: bool) -> anyhow::Result<()> {
    let v = nasos_services::upgrade::status::read()?;
    if json {
        return print(&v);
    }
    println!("{:<5} {:<11} {:<9} {:<8} STATE", "SLOT", "DEVICE", "VERSION", "");
    for s in &v.slots {
        let version = s.version.as_deref().unwrap_or("-");
        let running = if s.running { "running" } else { "" };
        println!("{:<5} {:<11} {:<9} {:<8} {}", s.slot, s.device, version, running, s.state);
    }
    println!("boots next: {}", v.boots_next.as_deref().unwrap_or("nothing (no entry with tries left)"));
    if !v.history.is_empty() {
        println!("history:");
        for e in &v.history {
            let slot = if e.slot.is_empty() { String::new() } else { format!(" slot {}", e.slot) };
            let version = if e.version.is_empty() { "-" } else { e.version.as_str() };
            println!("  {}  {:<11} {version:<8} (running {}){slot}  {}", utc(e.at), e.event, e.from, e.detail);
        }
    }
    Ok(())
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS` UTC (the civil-from-days algorithm).
fn utc(secs: u64) -> String {
    let (days, rem) = ((secs / 86400) as i64, secs % 86400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod utc_tests {
    #[test]
    fn utc_dates() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00");
        assert_eq!(super::utc(951_782_400), "2000-02-29 00:00:00");
        // As `date -u -d @1796116131` prints it.
        assert_eq!(super::utc(1_796_116_131), "2026-12-01 09:08:51");
    }
}

/// The last `lines` lines of a service's log in an earlier boot (0: this one), read from the
/// state partition (the rotated file first).
fn show_old_log(name: &str, lines: u32, back: i64) -> anyhow::Result<()> {
    let st = State::mounted();
    let seq = st
        .boot_back(back.unsigned_abs() as usize)
        .with_context(|| format!("the state partition keeps {} boot(s); there is no boot {back}", st.boots().len()))?;
    let file = st.log_file(seq, name);
    let mut text = std::fs::read_to_string(file.with_extension("log.1")).unwrap_or_default();
    text.push_str(
        &std::fs::read_to_string(&file)
            .with_context(|| format!("no log of `{name}` in boot {seq} ({})", file.display()))?,
    );
    let all: Vec<&str> = text.lines().collect();
    for l in &all[all.len().saturating_sub(lines as usize)..] {
        println!("{l}");
    }
    Ok(())
}

fn show_boots(json: bool) -> anyhow::Result<()> {
    let st = State::mounted();
    #[derive(Serialize)]
    struct Boot {
        boot: u64,
        end: String,
    }
    let boots: Vec<Boot> = st
        .boots()
        .into_iter()
        .map(|b| Boot { boot: b, end: st.boot_end(b).map_or("unknown", |e| e.as_str()).to_string() })
        .collect();
    if json {
        return print(&boots);
    }
    let current = boots.last().map(|b| b.boot);
    for b in &boots {
        let how = if Some(b.boot) == current {
            "this boot".to_string()
        } else {
            nasos_layout::state::BootEnd::parse(&b.end).map_or("unknown", |e| e.describe()).to_string()
        };
        println!("{:>5}  {how}", b.boot);
    }
    Ok(())
}

/// Marks the state partition to be made afresh on the next boot, then reboots.
async fn factory_reset(client: &Client) -> anyhow::Result<()> {
    let status = client.status().await?;
    println!("A factory reset clears this box's identity, its root password, the logs of earlier boots and");
    println!("the NFS state (clients cannot reclaim locks across it). The pools and their data are kept.");
    println!("The box reboots at once. Type its hostname ({}) to go on:", status.hostname);
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    if answer.trim() != status.hostname {
        anyhow::bail!("not confirmed: nothing was changed");
    }
    let marker = State::mounted().path(nasos_layout::state::FACTORY_RESET);
    std::fs::write(&marker, b"requested by nasctl factory-reset\n")
        .with_context(|| format!("writing {} (is the state partition mounted?)", marker.display()))?;
    println!("factory reset on the next boot; rebooting");
    client.shutdown(ShutdownKind::Reboot).await?;
    Ok(())
}

fn print_services(list: &[ServiceInfo]) {
    let w = list.iter().map(|s| s.name.len()).max().unwrap_or(0).max("SERVICE".len());
    println!(
        "{:<w$} {:<9} {:>7} {:>8} {:>9}  {:<12} DETAIL",
        "SERVICE", "STATE", "PID", "RESTARTS", "SINCE", "LAST EXIT"
    );
    for s in list {
        let pid = if s.pid == 0 { "-".to_string() } else { s.pid.to_string() };
        println!(
            "{:<w$} {:<9} {:>7} {:>8} {:>9}  {:<12} {}",
            s.name,
            s.state,
            pid,
            s.restarts,
            secs(s.since_ms),
            if s.last_exit.is_empty() { "-" } else { &s.last_exit },
            s.detail
        );
    }
}

/// Bytes as `zfs list` prints them: 1024-based, three significant digits, the largest unit
/// that fits (`512B`, `1.31M`, `47.0G`, `192K`).
fn gib(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| "-".into(), nasos_board::units::human_size)
}

fn show_pools(json: bool) -> anyhow::Result<()> {
    let pools = inspect::pools()?;
    if json {
        return print(&pools);
    }
    if pools.is_empty() {
        println!("no pools imported");
    }
    for p in &pools {
        println!(
            "{}  {}  size {}  allocated {}  free {}  errors {}",
            p.name,
            p.state,
            gib(p.size),
            gib(p.allocated),
            gib(p.free),
            p.errors
        );
        if let Some(s) = &p.scan {
            println!("  {} in progress: {:.1}% done", s.function, s.percent);
        }
        for m in &p.members {
            let spare = m.spare_for.as_ref().map(|d| format!("  hot spare in for {d}")).unwrap_or_default();
            println!("  {:<8} {:<10} {:<8} errors {}{spare}", m.disk, m.group, m.state, m.errors);
        }
        for d in &p.datasets {
            println!(
                "  {:<24} used {:>7}  avail {:>7}  quota {:>7}  {}{}",
                d.name,
                gib(d.used),
                gib(d.available),
                if d.quota.unwrap_or(0) == 0 { "none".to_string() } else { gib(d.quota) },
                d.mountpoint,
                if d.mounted { "" } else { " (not mounted)" }
            );
        }
    }
    Ok(())
}

fn show_kerberos(json: bool) -> anyhow::Result<()> {
    let plan = nasos_services::plan()?;
    let Some(k) = &plan.kerberos else {
        println!("no Kerberos realm in this box's plan");
        return Ok(());
    };
    let v = nasos_services::kerberos::view(k);
    if json {
        return print(&v);
    }
    println!("realm      {}", v.realm);
    match (&v.principal, &v.error) {
        (_, Some(e)) => println!("keytab     unreadable: {e}"),
        (Some(p), None) => println!("accepting  {p}"),
        (None, None) if v.keytab.is_some() => println!("keytab     holds no nfs/ principal of {}", v.realm),
        (None, None) => println!("keytab     none yet: nasctl kerberos join FILE"),
    }
    for e in &v.entries {
        println!("  kvno {:<4} enctype {:<3} {}", e.kvno, e.enctype, e.principal);
    }
    let users: Vec<String> = k.users.iter().map(|(n, u, g)| format!("{n} ({u}:{g})")).collect();
    println!("users      {}", if users.is_empty() { "none".to_string() } else { users.join(", ") });
    Ok(())
}

fn show_tenants(json: bool) -> anyhow::Result<()> {
    let plan = nasos_services::plan()?;
    let list = inspect::tenants(&plan)?;
    if json {
        return print(&list);
    }
    if list.is_empty() {
        println!("no tenants in this box's plan");
        return Ok(());
    }
    let w = list.iter().map(|t| t.name.len()).max().unwrap_or(0).max("TENANT".len());
    let d = list.iter().map(|t| t.dataset.len()).max().unwrap_or(0).max("DATASET".len());
    println!(
        "{:<w$} {:<d$} {:>7} {:>7} {:>5} {:>7}  NETWORKS / EXPORTS",
        "TENANT", "DATASET", "USED", "QUOTA", "USE%", "AVAIL"
    );
    for t in &list {
        let quota = if t.quota.unwrap_or(0) == 0 { "none".to_string() } else { gib(t.quota) };
        let pct = t.percent().map_or("-".to_string(), |p| format!("{p:.0}%"));
        let state = if t.used.is_none() { "  (dataset not there yet)" } else { "" };
        println!(
            "{:<w$} {:<d$} {:>7} {:>7} {:>5} {:>7}  {}{state}",
            t.name,
            t.dataset,
            gib(t.used),
            quota,
            pct,
            gib(t.available),
            t.networks.join(" ")
        );
        let exports = if t.exports.is_empty() { "none".to_string() } else { t.exports.join(" ") };
        println!("{:<w$} {:<d$} {:>39}  exports {exports}, squash {}", "", "", "", t.squash);
    }
    Ok(())
}

fn show_exports(json: bool) -> anyhow::Result<()> {
    let s = inspect::exports();
    if json {
        return print(&s);
    }
    let listeners: Vec<String> = s.listeners.iter().map(|l| format!("{} {}", l.transport, l.port)).collect();
    println!(
        "nfsd  {} threads, listening on {}",
        s.threads,
        if listeners.is_empty() { "nothing".to_string() } else { listeners.join(", ") }
    );
    for e in &s.exports {
        println!("  {:<28} {:<18} {}", e.path, e.client, e.options.join(","));
    }
    Ok(())
}

fn show_fabric(json: bool) -> anyhow::Result<()> {
    let links = inspect::fabric()?;
    if json {
        return print(&links);
    }
    for l in &links {
        println!("{}  {}  mtu {}  {}", l.link, l.operstate, l.mtu, l.addresses.join(" "));
        for p in &l.rdma {
            let v2: Vec<String> =
                p.gids.iter().filter(|g| g.kind == "RoCE v2").map(|g| format!("[{}] {}", g.index, g.gid)).collect();
            println!("  rdma {}/{}  {}  {}  RoCE v2 GIDs: {}", p.device, p.port, p.state, p.link_layer, v2.join(", "));
        }
        match &l.dcb {
            inspect::DcbView::Applied { pfc_enabled, ets_bandwidth, dscp } => {
                println!("  dcb  PFC on {:?}  ETS {:?}  DSCP→prio {:?}", pfc_enabled, ets_bandwidth, dscp)
            }
            inspect::DcbView::NotSupported => println!("  dcb  not supported by this NIC (RoCE runs lossy)"),
            inspect::DcbView::Error { message } => println!("  dcb  error: {message}"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_zfs_list() {
        assert_eq!(gib(None), "-");
        assert_eq!(gib(Some(512)), "512B");
        assert_eq!(gib(Some(1_374_912)), "1.31M");
        assert_eq!(gib(Some(2 << 30)), "2.00G");
        assert_eq!(gib(Some(50_465_865_728)), "47.0G");
        assert_eq!(gib(Some(196_416)), "192K");
    }
}

/// Whether the firmware enforces Secure Boot (its `SecureBoot` variable) and how the kernel is
/// locked down, as one line of `nasctl status`.
fn secure_boot_line(sys: &std::path::Path) -> String {
    // efivarfs is mounted on first use (nasinit mounts it only to judge a boot on trial).
    if sys.join("firmware/efi").exists() {
        let _ = nasos_services::upgrade::efivars();
    }
    let var = sys.join("firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c");
    let lockdown = std::fs::read_to_string(sys.join("kernel/security/lockdown")).ok();
    describe_secure_boot(sys.join("firmware/efi").exists(), std::fs::read(var).ok().as_deref(), lockdown.as_deref())
}

/// `var`: the variable as efivarfs gives it (4 bytes of attributes, then one byte: 1 = on).
/// `lockdown`: `none [integrity] confidentiality`, the bracketed mode being the current one.
fn describe_secure_boot(efi: bool, var: Option<&[u8]>, lockdown: Option<&str>) -> String {
    if !efi {
        return "legacy BIOS boot (no UEFI, no Secure Boot)".into();
    }
    let mode = lockdown
        .and_then(|l| l.split_whitespace().find(|w| w.starts_with('[')))
        .map(|w| w.trim_matches(['[', ']']).to_string());
    match (var.and_then(|v| v.get(4)), mode.as_deref()) {
        (Some(1), Some(m)) if m != "none" => format!("UEFI, Secure Boot on, kernel locked down ({m})"),
        (Some(1), _) => "UEFI, Secure Boot on, kernel NOT locked down".into(),
        (Some(_), _) => "UEFI, Secure Boot off: the boot chain is not verified".into(),
        (None, _) => "UEFI, Secure Boot state unknown (efivarfs not mounted)".into(),
    }
}

#[cfg(test)]
mod secure_boot_tests {
    use super::describe_secure_boot;

    #[test]
    fn reads_the_variable_and_the_lockdown_mode() {
        let on = [7, 0, 0, 0, 1];
        let off = [6, 0, 0, 0, 0];
        assert_eq!(
            describe_secure_boot(true, Some(&on), Some("none [integrity] confidentiality\n")),
            "UEFI, Secure Boot on, kernel locked down (integrity)"
        );
        assert_eq!(
            describe_secure_boot(true, Some(&on), Some("[none] integrity confidentiality")),
            "UEFI, Secure Boot on, kernel NOT locked down"
        );
        assert!(describe_secure_boot(true, Some(&off), Some("[none] integrity")).contains("Secure Boot off"));
        assert!(describe_secure_boot(true, None, None).contains("unknown"));
        assert!(describe_secure_boot(false, None, None).contains("legacy"));
    }
}
