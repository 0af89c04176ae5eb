//! The NFS agent. serve: writes the exports table from the plan, sets grace and lease times, starts
//! nfsdcld (NFSv4 client records, kept on the state partition) and rpc.mountd (and rpcbind and
//! rpc.statd only for NFSv3), starts the kernel nfsd on TCP and on
//! RDMA, checks both listeners, and reports ready. It then stays up watching mountd and nfsd:
//! a restarted nfsd comes back with TCP only (the kernel makes its default sockets), so the
//! RDMA listener is re-added whenever it is missing while nfsd runs. On SIGTERM it stops nfsd
//! and mountd.

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use crate::nfsd::{self, NFSD_FS, has_listener};
use crate::signals::{Sig, Signals};
use crate::{mounts, notify_ready, plan, run, say};
use anyhow::{Context, bail};
use nasos_board::plan::NfsPlan;

/// How often the listeners are checked. A restarted nfsd serves TCP at once; RDMA clients
/// reconnect within their retry interval, so two seconds without the RDMA listener is the
/// longest they wait, and a portlist read every two seconds costs nothing.
const WATCH: Duration = Duration::from_secs(2);

pub fn serve() -> anyhow::Result<()> {
    let plan = plan()?;
    let addresses = nasos_board::plan::firewall::nfs_addresses(&plan);
    let Some(nfs) = plan.nfs else { bail!("the plan has no NFS server") };
    // SIGTERM and SIGCHLD are taken in the watch loop below, not by default handlers.
    let signals = Signals::take(&[Sig::SIGTERM, Sig::SIGCHLD])?;

    if !Path::new(NFSD_FS).join("portlist").exists() {
        let _ = run("modprobe", &["nfsd"]);
        nix::mount::mount(Some("nfsd"), NFSD_FS, Some("nfsd"), nix::mount::MsFlags::empty(), None::<&str>)
            .context("mounting the nfsd filesystem")?;
    }
    // Never serve what is not there: an export whose dataset is not what is mounted at its path
    // (a dataset that failed to mount leaves the tmpfs under it) stays off, and says why.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    let mut off = Vec::new();
    for e in &nfs.exports {
        if let Err(why) = mounts::dataset_mounted(&mountinfo, &e.dataset, &e.path) {
            say(format!("export of {} stays off: {why}", e.dataset));
            off.push(e.dataset.clone());
        }
    }
    let table = nfs.exports_table_of(|e| !off.contains(&e.dataset));
    std::fs::write("/etc/exports", table).context("writing /etc/exports")?;
    let mut daemons: Vec<Child> = Vec::new();
    if nfs.rpcbind {
        daemons.push(Command::new("rpcbind").args(["-f", "-w"]).spawn().context("starting rpcbind")?);
        std::thread::sleep(Duration::from_millis(300));
        daemons.push(Command::new("rpc.statd").arg("-F").spawn().context("starting rpc.statd")?);
    }
    // nfsd keeps its NFSv4 client records through nfsdcld when the daemon has its pipe open
    // as nfsd starts (the kernel tries it first, and waits only half a second for it). Its
    // database lives in /var/lib/nfs, which is on the state partition.
    let nfsdcld = start_nfsdcld()?;
    let nfsdcld_pid = nfsdcld.id();
    daemons.push(nfsdcld);
    if nfs.gss {
        daemons.extend(start_gss(plan.kerberos.as_ref())?);
    }
    let mut mountd = Command::new("rpc.mountd");
    mountd.arg("-F");
    if !nfs.rpcbind {
        mountd.args(["-N", "2", "-N", "3"]);
    }
    daemons.push(mountd.spawn().context("starting rpc.mountd")?);
    run("exportfs", &["-ra"])?;
    start_nfsd(&nfs, &addresses)?;
    if holds(nfsdcld_pid, |t| t == Path::new(CLD_PIPE)) {
        say("NFSv4 client records kept by nfsdcld on the state partition");
    } else {
        say(format!(
            "nfsd did not take nfsdcld's pipe {CLD_PIPE}: it tracks clients the legacy way, and a client that first mounts during a grace period cannot reclaim after the next reboot"
        ));
    }
    let bound = nfsd::parse_nfsdctl_listeners(&run("nfsdctl", &["listener"]).unwrap_or_default());
    let ports: Vec<String> = if bound.is_empty() {
        nfsd::listeners().iter().map(|l| format!("{} {}", l.transport, l.port)).collect()
    } else {
        bound.iter().map(|l| l.replacen(':', " ", 1)).collect()
    };
    say(format!("nfsd listening: {}", ports.join(", ")));
    let off_note =
        if off.is_empty() { String::new() } else { format!("; not serving {} (not mounted)", off.join(", ")) };
    notify_ready(&format!("serving {} exports on {}{off_note}", nfs.exports.len() - off.len(), ports.join(", ")))?;

    // Wait for SIGTERM or a daemon's death, checking the listeners in between.
    let mut said: Option<String> = None;
    let status = loop {
        let signal = match signals.wait(WATCH) {
            Ok(None) => {
                watch_listeners(&nfs, &mut said);
                serve_newly_mounted(&nfs, &mut off);
                continue;
            }
            Ok(Some(s)) => s,
            Err(e) => break Err(e),
        };
        if signal == Sig::SIGTERM {
            break Ok(());
        }
        if let Some((i, s)) =
            daemons.iter_mut().enumerate().find_map(|(i, d)| d.try_wait().ok().flatten().map(|s| (i, s)))
        {
            break Err(anyhow::anyhow!("daemon {i} of the NFS service exited ({s})"));
        }
    };
    let _ = run("rpc.nfsd", &["0"]);
    for d in &mut daemons {
        let _ = d.kill();
        let _ = d.wait();
    }
    say("nfsd stopped");
    status
}

/// Kerberos for the `sec=krb5*` exports: rpc.idmapd (owners as `name@domain`, and the
/// realm's principals as the accounts of their names) and rpc.svcgssd accepting tickets for
/// the joined keytab's `nfs/` principal. Without a keytab the krb5 exports refuse every client
/// until `nasctl kerberos join`, and the service says so; `sec=sys` exports serve regardless.
fn start_gss(kerberos: Option<&nasos_board::plan::KerberosPlan>) -> anyhow::Result<Vec<Child>> {
    let Some(k) = kerberos else { bail!("the plan has krb5 exports but no Kerberos realm") };
    let mut out = Vec::new();
    out.push(Command::new("rpc.idmapd").args(["-f", "-S"]).spawn().context("starting rpc.idmapd")?);
    let view = crate::kerberos::view(k);
    if let Some(e) = &view.error {
        say(format!("kerberos: the joined keytab cannot be read ({e}); krb5 exports refuse every client"));
        return Ok(out);
    }
    let Some(principal) = view.principal else {
        say(format!(
            "kerberos: no keytab for {} yet; krb5 exports refuse every client until `nasctl kerberos join FILE`",
            k.realm
        ));
        return Ok(out);
    };
    let keytab = crate::kerberos::keytab_path();
    out.push(
        Command::new("rpc.svcgssd")
            .args(["-f", "-p", &principal])
            .env("KRB5_KTNAME", format!("FILE:{}", keytab.display()))
            .spawn()
            .context("starting rpc.svcgssd")?,
    );
    say(format!("kerberos: accepting tickets for {principal}"));
    Ok(out)
}

/// Where nfsdcld and the kernel meet: rpc_pipefs where Debian's nfs.conf puts it, and the pipe
/// nfsd makes in it when it starts.
const PIPEFS: &str = "/run/rpc_pipefs";
const CLD_PIPE: &str = "/run/rpc_pipefs/nfsd/cld";

/// Starts nfsdcld and waits until it watches for nfsd's pipe. nfsd makes the pipe as it starts
/// and gives the daemon half a second to open it before it falls back to the legacy tracking
/// directory, which forgets, when a grace period ends, every client that first came during it
/// (such a client cannot reclaim its locks after the next reboot). nfsdcld keeps them (and
/// imports once what a legacy directory held).
fn start_nfsdcld() -> anyhow::Result<Child> {
    let mounted = std::fs::read_to_string("/proc/self/mounts")
        .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(1) == Some(PIPEFS)));
    if !mounted {
        std::fs::create_dir_all(PIPEFS).with_context(|| format!("making {PIPEFS}"))?;
        nix::mount::mount(Some("rpc_pipefs"), PIPEFS, Some("rpc_pipefs"), nix::mount::MsFlags::empty(), None::<&str>)
            .with_context(|| format!("mounting rpc_pipefs on {PIPEFS}"))?;
    }
    let mut child = Command::new("nfsdcld").args(["-F", "-p", PIPEFS]).spawn().context("starting nfsdcld")?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if holds(child.id(), |t| t == Path::new(CLD_PIPE) || t == Path::new("anon_inode:inotify")) {
            return Ok(child);
        }
        if let Ok(Some(status)) = child.try_wait() {
            bail!("nfsdcld exited before it was ready ({status})");
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("nfsdcld did not start watching {PIPEFS}/nfsd within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` has an open file whose link target passes `what`.
fn holds(pid: u32, what: impl Fn(&Path) -> bool) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| what(&t)))
}

/// Serves an export that stayed off once its dataset is mounted: a dataset mounted by hand, or a
/// replica that a peer's first send just made.
fn serve_newly_mounted(nfs: &NfsPlan, off: &mut Vec<String>) {
    if off.is_empty() {
        return;
    }
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else { return };
    let now: Vec<String> = off
        .iter()
        .filter(|ds| {
            nfs.exports
                .iter()
                .find(|e| &e.dataset == *ds)
                .is_some_and(|e| mounts::dataset_mounted(&mountinfo, &e.dataset, &e.path).is_ok())
        })
        .cloned()
        .collect();
    if now.is_empty() {
        return;
    }
    off.retain(|d| !now.contains(d));
    let table = nfs.exports_table_of(|e| !off.contains(&e.dataset));
    let done = std::fs::write("/etc/exports", table)
        .map_err(anyhow::Error::from)
        .and_then(|()| run("exportfs", &["-ra"]).map(drop).map_err(anyhow::Error::from));
    match done {
        Ok(()) => say(format!("serving {} now: mounted", now.join(", "))),
        Err(e) => {
            say(format!("serving {} failed: {e:#}; trying again", now.join(", ")));
            off.extend(now);
        }
    }
}

/// Puts the RDMA listener back when nfsd was restarted without it. Says once when nfsd was
/// stopped by hand (it is not restarted behind an operator's back) and once per failure streak,
/// so a lasting problem does not flood the bounded log.
fn watch_listeners(nfs: &NfsPlan, said: &mut Option<String>) {
    let Some(port) = nfs.rdma_port else { return };
    let news = if nfsd::threads() == 0 {
        Some("nfsd has no threads: it was stopped outside nasos; clients wait until it runs again".to_string())
    } else {
        match nfsd::ensure_listener("rdma", port) {
            Ok(false) => None,
            Ok(true) => {
                say(format!(
                    "nfsd was restarted without its RDMA listener: re-added rdma {port} (on every address, as nfsd's own \
                     sockets are after a restart outside nasos; `nasctl restart nfs` binds them to the data links again)"
                ));
                None
            }
            Err(e) => Some(format!("nfsd lost its RDMA listener and it could not be re-added: {e}")),
        }
    };
    if news.is_some() && news != *said {
        say(news.as_deref().unwrap_or_default());
    }
    *said = news;
}

/// Starts nfsd with the planned threads and versions, listening on `addresses` only (the data
/// links', see `firewall::nfs_addresses`): nfsdctl sets the versions and the TCP and RDMA
/// listeners over netlink before the threads start, so the kernel makes no wildcard socket.
/// Without addresses (no data link has one) nfsd listens on every address, as rpc.nfsd does.
fn start_nfsd(nfs: &NfsPlan, addresses: &[String]) -> anyhow::Result<()> {
    if addresses.is_empty() {
        say("no data link has an address: nfsd listens on every address");
        return start_nfsd_everywhere(nfs);
    }
    let wanted = nfsd::bound_listeners(addresses, nfs.tcp_port, nfs.rdma_port);
    if nfsd::threads() > 0 {
        // Left running by a service that died: versions and listeners cannot change while
        // threads run (EBUSY). Serving as planned already: keep it, clients see nothing.
        let have = nfsd::parse_nfsdctl_listeners(&run("nfsdctl", &["listener"]).unwrap_or_default());
        let mut sorted = wanted.clone();
        sorted.sort();
        if have == sorted {
            run("nfsdctl", &["threads", &nfs.threads.to_string()]).context("nfsdctl threads")?;
            say("nfsd was still serving as planned: kept it");
            return Ok(());
        }
        say(format!("nfsd was running with other listeners ({}): restarting it", have.join(", ")));
        run("rpc.nfsd", &["0"]).context("stopping nfsd")?;
    }
    set_times(nfs)?;
    let versions = version_args(nfs);
    run("nfsdctl", &versions.iter().map(String::as_str).collect::<Vec<_>>()).context("nfsdctl version")?;
    let mut args = vec!["listener".to_string()];
    args.extend(wanted.iter().map(|l| format!("+{l}")));
    run("nfsdctl", &args.iter().map(String::as_str).collect::<Vec<_>>())
        .map_err(|e| anyhow::anyhow!("{e} (is rpcrdma loaded?)"))
        .context("nfsdctl listener")?;
    run("nfsdctl", &["threads", &nfs.threads.to_string()]).context("nfsdctl threads")?;
    let have = nfsd::parse_nfsdctl_listeners(&run("nfsdctl", &["listener"]).unwrap_or_default());
    let missing: Vec<&String> = wanted.iter().filter(|w| !have.contains(w)).collect();
    if !missing.is_empty() {
        bail!("nfsd lacks the listeners {missing:?} (it has {have:?})");
    }
    Ok(())
}

/// Sets the grace and lease times of a server about to start (the 90 s default grace delays
/// first access). The kernel takes them only while no nfsd server exists: a start that failed
/// half-way (a listener nfsd could not bind) leaves one with listeners and no threads, and every
/// later start would fail on it with EBUSY. That one is cleared first.
fn set_times(nfs: &NfsPlan) -> anyhow::Result<()> {
    let write = || -> std::io::Result<()> {
        std::fs::write(Path::new(NFSD_FS).join("nfsv4gracetime"), nfs.grace_seconds.to_string())?;
        std::fs::write(Path::new(NFSD_FS).join("nfsv4leasetime"), nfs.lease_seconds.to_string())
    };
    match write() {
        Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) && nfsd::threads() == 0 => {
            say("nfsd has a server with no threads, left by a start that failed: clearing it");
            run("rpc.nfsd", &["0"]).context("clearing nfsd")?;
            write().context("setting the grace and lease times")
        }
        r => r.context("setting the grace and lease times"),
    }
}

/// `nfsdctl version` arguments: each version on or off as the plan says.
fn version_args(nfs: &NfsPlan) -> Vec<String> {
    let mut args = vec!["version".to_string()];
    for v in ["3", "4.0", "4.1", "4.2"] {
        let on = nfs.versions.iter().any(|x| x.as_str() == v);
        args.push(format!("{}{v}", if on { '+' } else { '-' }));
    }
    args
}

/// rpc.nfsd's way: every address, TCP first, then the RDMA listener through portlist.
fn start_nfsd_everywhere(nfs: &NfsPlan) -> anyhow::Result<()> {
    if nfsd::threads() == 0 {
        set_times(nfs)?;
    }
    let mut args: Vec<String> = Vec::new();
    for v in ["3", "4.0", "4.1", "4.2"] {
        let on = nfs.versions.iter().any(|x| x.as_str() == v);
        // rpc.nfsd speaks "4" for 4.0.
        let v = if v == "4.0" { "4" } else { v };
        args.extend([if on { "-V" } else { "-N" }.to_string(), v.to_string()]);
    }
    args.push(nfs.threads.to_string());
    run("rpc.nfsd", &args.iter().map(String::as_str).collect::<Vec<_>>())?;
    if let Some(port) = nfs.rdma_port {
        nfsd::ensure_listener("rdma", port).map_err(|e| anyhow::anyhow!("{e} (is rpcrdma loaded?)"))?;
    }
    if !has_listener(&nfsd::listeners(), "tcp", nfs.tcp_port) {
        bail!("nfsd has no TCP listener on {}", nfs.tcp_port);
    }
    Ok(())
}
