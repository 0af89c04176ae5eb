//! The one way agents take signals: blocked, and read from a signalfd where the agent waits
//! anyway, so a signal is an event in its loop rather than a flag set behind its back.
//! (Children started through `std::process::Command` get an empty signal mask again.)

use std::os::fd::AsFd;
use std::time::Duration;

use anyhow::Context;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

pub use nix::sys::signal::Signal as Sig;

pub struct Signals {
    fd: SignalFd,
}

impl Signals {
    /// Blocks `signals` for this thread (and threads it starts later) and opens a signalfd for
    /// them. Call it first in `main`, before any thread is started.
    pub fn take(signals: &[Signal]) -> anyhow::Result<Signals> {
        let mut set = SigSet::empty();
        for s in signals {
            set.add(*s);
        }
        set.thread_block().context("blocking signals")?;
        let fd =
            SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK).context("opening a signalfd")?;
        Ok(Signals { fd })
    }

    /// Waits up to `timeout` for one of the signals; `None` when the time passed first.
    pub fn wait(&self, timeout: Duration) -> anyhow::Result<Option<Signal>> {
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => return Ok(None),
            Ok(_) => {}
            Err(e) => return Err(anyhow::anyhow!("waiting for signals: {e}")),
        }
        match self.fd.read_signal() {
            Ok(Some(info)) => Ok(Signal::try_from(info.ssi_signo as i32).ok()),
            Ok(None) => Ok(None),
            Err(e) => Err(anyhow::anyhow!("reading a signal: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_signal_is_an_event_and_silence_a_timeout() {
        // Tests run on several threads: deliver to this thread only.
        let s = Signals::take(&[Signal::SIGUSR2]).expect("signalfd");
        let t = Instant::now();
        assert_eq!(s.wait(Duration::from_millis(50)).expect("wait"), None);
        assert!(t.elapsed() >= Duration::from_millis(40));
        nix::sys::pthread::pthread_kill(nix::sys::pthread::pthread_self(), Signal::SIGUSR2).expect("raise");
        assert_eq!(s.wait(Duration::from_secs(5)).expect("wait"), Some(Signal::SIGUSR2));
    }
}
