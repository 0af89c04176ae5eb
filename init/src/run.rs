//! The event loop: signals, child exits, service I/O, control requests and deadlines, all on one
//! thread. When nothing is due it sleeps in epoll with no timeout: zero wakeups while idle.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::time::Instant;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::console::Console;
use crate::control;
use crate::supervisor::{Config, ShutdownKind, Supervisor};
use crate::watchdog::Watchdog;

/// Service output events handled in one turn of the loop before it looks at everything else.
const OUTPUT_BATCH: usize = 64;

#[derive(Clone)]
pub struct Options {
    pub config: Config,
    pub control_socket: PathBuf,
}

/// Runs the supervisor until a shutdown has stopped every service; returns the kind requested.
/// The watchdog, if any, is fed from this loop and from nothing else.
pub fn run(
    opts: Options,
    t0: Instant,
    console: Console,
    watchdog: Option<&mut Watchdog>,
) -> std::io::Result<(ShutdownKind, Supervisor)> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(event_loop(opts, t0, console, watchdog))
}

async fn event_loop(
    opts: Options,
    t0: Instant,
    console: Console,
    mut watchdog: Option<&mut Watchdog>,
) -> std::io::Result<(ShutdownKind, Supervisor)> {
    let pid1 = opts.config.pid1;
    let mut sigchld = signal(SignalKind::child())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let rtmin = nix::libc::SIGRTMIN();
    let mut sig_halt = signal(SignalKind::from_raw(rtmin + 3))?;
    let mut sig_poweroff = signal(SignalKind::from_raw(rtmin + 4))?;
    let mut sig_reboot = signal(SignalKind::from_raw(rtmin + 5))?;

    let (ev_tx, mut ev_rx) = mpsc::channel(1024);
    let (req_tx, mut req_rx) = mpsc::channel(64);
    if let Err(e) = control::serve(&opts.control_socket, req_tx, console.clone()) {
        console.say(&format!("control socket {} unavailable: {e}", opts.control_socket.display()));
    }
    let mut sup = Supervisor::new(opts.config, t0, console.clone(), ev_tx);
    guarded(&console, "start", || {
        sup.reap();
        sup.schedule();
    });

    loop {
        if let Some(kind) = sup.shutdown_complete() {
            // Let the reply to the request that asked for this reach its client.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            return Ok((kind, sup));
        }
        if sup.frozen() {
            // `nasctl debug freeze` on a development image: PID 1's loop stops here, as a hung
            // PID 1 would, and only the hardware watchdog can end it.
            console.say("debug freeze: the event loop stops now; the watchdog will reset the box");
            // Let the reply reach nasctl first.
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        let deadline = sup.next_deadline();
        let due = async move {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        let feed_at = watchdog.as_ref().and_then(|w| w.next());
        let feed = async move {
            match feed_at {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = sigchld.recv() => guarded(&console, "reap", || sup.reap()),
            _ = sigint.recv() => {
                // Ctrl-Alt-Del reaches PID 1 as SIGINT: reboot, as every init does.
                let kind = if pid1 { ShutdownKind::Reboot } else { ShutdownKind::Poweroff };
                guarded(&console, "shutdown", || sup.begin_shutdown(kind));
            }
            _ = sigterm.recv() => {
                if pid1 {
                    console.say("ignoring SIGTERM (use nasctl poweroff or reboot)");
                } else {
                    guarded(&console, "shutdown", || sup.begin_shutdown(ShutdownKind::Poweroff));
                }
            }
            _ = sig_halt.recv() => guarded(&console, "shutdown", || sup.begin_shutdown(ShutdownKind::Halt)),
            _ = sig_poweroff.recv() => guarded(&console, "shutdown", || sup.begin_shutdown(ShutdownKind::Poweroff)),
            _ = sig_reboot.recv() => guarded(&console, "shutdown", || sup.begin_shutdown(ShutdownKind::Reboot)),
            // Control requests and deadlines come before service output: services printing
            // without pause must not starve an operator, a stop deadline or a shutdown. Output
            // is taken in bounded batches so everything else gets its turn in between.
            _ = feed => guarded(&console, "watchdog", || {
                if let Some(w) = watchdog.as_deref_mut() {
                    // Health reports; PID 1 decides: a fatal condition past its grace stops the
                    // feeding (the watchdog then resets the box), nothing else does.
                    if w.armed() && sup.health_starves_watchdog(crate::supervisor::unix_now()) {
                        w.starve();
                    } else if w.tick(Instant::now(), &console) == Some(true) {
                        sup.watchdog_reset_before_this_boot();
                    }
                }
            }),
            Some(req) = req_rx.recv() => guarded(&console, "request", || sup.request(req)),
            _ = due => guarded(&console, "deadline", || sup.on_deadline()),
            Some(ev) = ev_rx.recv() => guarded(&console, "event", || {
                sup.event(ev);
                for _ in 0..OUTPUT_BATCH {
                    match ev_rx.try_recv() {
                        Ok(ev) => sup.event(ev),
                        Err(_) => break,
                    }
                }
            }),
        }
    }
}

/// Runs one step of the supervisor; a panic in it is reported and the loop goes on, because the
/// alternative for PID 1 is a kernel panic.
fn guarded(console: &Console, what: &str, f: impl FnOnce()) {
    if let Err(p) = catch_unwind(AssertUnwindSafe(f)) {
        let msg = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
        console.say(&format!("BUG: panic while handling {what}: {}", msg.unwrap_or_default()));
    }
}
