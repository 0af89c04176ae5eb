//! Starting one service process: its own session, its cgroup joined before exec, stdout and
//! stderr on one pipe to nasinit, a clean environment, and the readiness channel it asked for.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::unistd::{Pid, User, pipe2};

/// The PATH services get; they run with a clean environment otherwise.
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub struct Spec<'a> {
    pub command: &'a [String],
    pub environment: &'a BTreeMap<String, String>,
    pub user: Option<&'a str>,
    pub working_directory: Option<&'a str>,
    /// `cgroup.procs` of the service's cgroup, opened by the parent.
    pub cgroup_procs: Option<&'a OwnedFd>,
    pub notify_socket: Option<&'a Path>,
    /// Readiness fd number the service writes a newline to.
    pub ready_fd: Option<u32>,
    /// Its niceness (0: as nasinit's).
    pub nice: i8,
}

pub struct Spawned {
    pub pid: Pid,
    /// Read end of the stdout+stderr pipe (non-blocking).
    pub output: OwnedFd,
    /// Read end of the readiness pipe (non-blocking).
    pub ready: Option<OwnedFd>,
}

pub fn spawn(spec: &Spec<'_>) -> io::Result<Spawned> {
    let Some((program, args)) = spec.command.split_first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty command"));
    };
    let (out_r, out_w) = pipe2(OFlag::O_CLOEXEC)?;
    let ready = match spec.ready_fd {
        Some(_) => Some(pipe2(OFlag::O_CLOEXEC)?),
        None => None,
    };
    let mut cmd = Command::new(program);
    cmd.args(args).env_clear().env("PATH", PATH).envs(spec.environment);
    if let Some(sock) = spec.notify_socket {
        cmd.env("NOTIFY_SOCKET", sock);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::from(out_w.try_clone()?)).stderr(Stdio::from(out_w));
    if let Some(dir) = spec.working_directory {
        cmd.current_dir(dir);
    } else {
        cmd.current_dir("/");
    }
    if let Some(name) = spec.user {
        let user = User::from_name(name)
            .map_err(io::Error::from)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no user named {name}")))?;
        cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        cmd.env("HOME", &user.dir).env("USER", name);
    }
    let cgroup_fd = spec.cgroup_procs.map(|fd| fd.as_raw_fd());
    let ready_pair = ready.as_ref().map(|(_, w)| w.as_raw_fd()).zip(spec.ready_fd);
    let nice = spec.nice;
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe system
    // calls (setsid, write, dup2, setpriority) on raw fds and values captured before the fork;
    // it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(io::Error::from)?;
            if nice != 0 && nix::libc::setpriority(nix::libc::PRIO_PROCESS, 0, nice.into()) < 0 {
                return Err(io::Error::last_os_error());
            }
            if let Some(fd) = cgroup_fd {
                // "0" moves the writing process into the cgroup before the program runs, so
                // nothing it forks can start outside it.
                let r = nix::libc::write(fd, b"0".as_ptr().cast(), 1);
                if r != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some((from, to)) = ready_pair {
                // dup2 clears close-on-exec on the new descriptor, so the program inherits it.
                if nix::libc::dup2(from, to as i32) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    // Dropping `child` neither waits nor kills: nasinit reaps every pid itself with waitpid(-1).
    let pid = Pid::from_raw(child.id() as i32);
    drop(child);
    set_nonblocking(&out_r)?;
    let ready = match ready {
        Some((r, _w)) => {
            set_nonblocking(&r)?;
            Some(r)
        }
        None => None,
    };
    Ok(Spawned { pid, output: out_r, ready })
}

/// Runs a helper command (a stop command, a readiness check) with no output capture.
pub fn spawn_helper(command: &[String], environment: &BTreeMap<String, String>) -> io::Result<Pid> {
    let Some((program, args)) = command.split_first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty command"));
    };
    let mut cmd = Command::new(program);
    cmd.args(args).env_clear().env("PATH", PATH).envs(environment);
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).current_dir("/");
    let child = cmd.spawn()?;
    Ok(Pid::from_raw(child.id() as i32))
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}
