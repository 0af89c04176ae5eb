//! Running a tool with a deadline, and typed readers of what some tools print. See README.md.

pub mod blkid;
pub mod kexec;

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// Where tools are looked up when the caller has no PATH (the kernel starts PID 1 without one).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long a tool may run unless the caller says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Lines of stderr an error carries.
const TAIL_LINES: usize = 20;
/// Bytes of stderr kept while reading (the tail is cut from these).
const STDERR_KEEP: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot run `{command}`: {source}")]
    Spawn { command: String, source: std::io::Error },
    #[error("`{command}` did not finish within {}s and was killed{}", after.as_secs_f64(), tail(stderr))]
    Timeout { command: String, after: Duration, stderr: String },
    #[error("`{command}` failed ({status}){}", tail(stderr))]
    Failed { command: String, status: ExitStatus, stderr: String },
}

impl Error {
    /// The tool's stderr (its last lines), empty when it printed nothing or never ran.
    pub fn stderr(&self) -> &str {
        match self {
            Error::Spawn { .. } => "",
            Error::Timeout { stderr, .. } | Error::Failed { stderr, .. } => stderr,
        }
    }
}

fn tail(stderr: &str) -> String {
    if stderr.is_empty() { String::new() } else { format!(": {stderr}") }
}

/// What a tool printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
}

/// A tool to run: program, arguments, deadline, extra environment.
#[derive(Debug, Clone)]
pub struct Tool {
    program: OsString,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    timeout: Duration,
}

impl Tool {
    pub fn new(program: impl Into<OsString>) -> Tool {
        Tool { program: program.into(), args: Vec::new(), env: Vec::new(), timeout: DEFAULT_TIMEOUT }
    }

    pub fn arg(mut self, a: impl Into<OsString>) -> Tool {
        self.args.push(a.into());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(mut self, args: I) -> Tool {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, k: impl Into<OsString>, v: impl Into<OsString>) -> Tool {
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn timeout(mut self, t: Duration) -> Tool {
        self.timeout = t;
        self
    }

    /// The command line, as errors and logs show it.
    pub fn command_line(&self) -> String {
        std::iter::once(&self.program).chain(&self.args).map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ")
    }

    /// Runs it to the end (or the deadline) and returns its stdout; anything but exit 0 is an
    /// error.
    pub fn run(&self) -> Result<String, Error> {
        self.output().map(|o| o.stdout)
    }

    /// Whether it ran and exited 0, for probes where failure is an answer.
    pub fn succeeds(&self) -> bool {
        self.output().is_ok()
    }

    /// Runs it and returns both outputs; anything but exit 0 is an error.
    pub fn output(&self) -> Result<Output, Error> {
        let command = self.command_line();
        let mut cmd = Command::new(&self.program);
        if std::env::var_os("PATH").is_none() {
            // Also what the program is looked up in.
            cmd.env("PATH", DEFAULT_PATH);
        }
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so a deadline kills whatever it started too.
            .process_group(0);
        let mut child = cmd.spawn().map_err(|source| Error::Spawn { command: command.clone(), source })?;
        let pid = Pid::from_raw(child.id() as i32);
        let stdout = child.stdout.take().map(|mut s| {
            std::thread::spawn(move || {
                let mut b = Vec::new();
                let _ = s.read_to_end(&mut b);
                b
            })
        });
        let stderr = child.stderr.take().map(|mut s| {
            std::thread::spawn(move || {
                let mut keep = Vec::new();
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    keep.extend_from_slice(&buf[..n]);
                    if keep.len() > 2 * STDERR_KEEP {
                        keep.drain(..keep.len() - STDERR_KEEP);
                    }
                }
                keep
            })
        });
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        let (status, timed_out) = match rx.recv_timeout(self.timeout) {
            Ok(s) => (s, false),
            Err(_) => {
                let _ = killpg(pid, Signal::SIGKILL);
                (rx.recv().unwrap_or_else(|_| Err(std::io::Error::other("waiter thread gone"))), true)
            }
        };
        // The pipes close when the group is gone; a grandchild that left the group and keeps
        // them open would block these joins, which is why the deadline kills the whole group.
        let out = stdout.and_then(|h| h.join().ok()).unwrap_or_default();
        let err = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
        let stderr = last_lines(&String::from_utf8_lossy(&err), TAIL_LINES);
        let status = status.map_err(|source| Error::Spawn { command: command.clone(), source })?;
        if timed_out {
            return Err(Error::Timeout { command, after: self.timeout, stderr });
        }
        if !status.success() {
            return Err(Error::Failed { command, status, stderr });
        }
        Ok(Output { stdout: String::from_utf8_lossy(&out).into_owned(), stderr })
    }
}

/// Runs `program args…` with the default deadline and returns its stdout.
pub fn run(program: &str, args: &[&str]) -> Result<String, Error> {
    Tool::new(program).args(args).run()
}

/// Whether `program args…` exits 0 within the default deadline.
pub fn probe(program: &str, args: &[&str]) -> bool {
    Tool::new(program).args(args).succeeds()
}

/// The last `n` non-empty lines of `text`, trimmed.
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n").trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn returns_stdout_of_a_tool_that_succeeds() {
        assert_eq!(run("sh", &["-c", "echo hello; echo noise >&2"]).expect("runs"), "hello\n");
        assert!(probe("true", &[]));
        assert!(!probe("false", &[]));
        assert!(!probe("/nonexistent/tool", &[]));
    }

    #[test]
    fn a_failure_names_the_command_and_the_end_of_its_stderr() {
        let script = "for i in $(seq 1 100); do echo line$i >&2; done; exit 3";
        let e = run("sh", &["-c", script]).expect_err("fails");
        let text = e.to_string();
        assert!(text.starts_with("`sh -c for i in"), "{text}");
        assert!(text.contains("exit status: 3"), "{text}");
        assert!(text.contains("line100") && text.contains("line81") && !text.contains("line80\n"), "{text}");
        assert_eq!(e.stderr().lines().count(), TAIL_LINES);
    }

    #[test]
    fn a_tool_past_its_deadline_is_killed_with_its_children() {
        let t = Instant::now();
        // The background sleep keeps stdout open: only killing the group ends the reads.
        let e = Tool::new("sh")
            .args(["-c", "echo started >&2; sleep 30 & sleep 30"])
            .timeout(Duration::from_millis(300))
            .run()
            .expect_err("times out");
        assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        assert!(e.to_string().contains("did not finish within 0.3s and was killed: started"), "{e}");
    }

    #[test]
    fn a_missing_program_says_so() {
        let e = run("/nonexistent/tool", &["x"]).expect_err("missing");
        assert!(e.to_string().starts_with("cannot run `/nonexistent/tool x`"), "{e}");
    }

    #[test]
    fn a_caller_without_path_still_finds_tools() {
        // As PID 1 is started: no environment at all.
        let out = Command::new(std::env::current_exe().expect("self"))
            .args(["--exact", "tests::finds_sbin_tools_from_an_empty_environment", "--nocapture"])
            .env_clear()
            .env("NASOS_EXEC_CHILD", "1")
            .output()
            .expect("run");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    }

    #[test]
    fn finds_sbin_tools_from_an_empty_environment() {
        if std::env::var_os("NASOS_EXEC_CHILD").is_none() {
            return;
        }
        assert_eq!(std::env::var_os("PATH"), None);
        // In /usr/sbin, which the C library's fallback search path (/bin:/usr/bin) leaves out.
        assert!(run("blkid", &["-V"]).expect("blkid is found").contains("blkid"));
    }

    #[test]
    fn environment_is_passed() {
        let out = Tool::new("sh").args(["-c", "echo $NASOS_X"]).env("NASOS_X", "42").run().expect("runs");
        assert_eq!(out, "42\n");
    }
}
