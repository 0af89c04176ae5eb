//! A nasinit under test: started as a child subreaper with its own plan, socket and directories,
//! driven through the real control API.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nasos_api::{Client, ServiceInfo, ShutdownKind};
use nasos_board::Plan;
use nasos_board::plan::{Readiness, Restart, RestartPolicy, Service};

pub struct Nasinit {
    pub dir: PathBuf,
    pub child: Child,
    pub rt: tokio::runtime::Runtime,
    pub client: Client,
}

pub fn sh(name: &str, script: &str) -> Service {
    Service {
        name: name.into(),
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        after: Vec::new(),
        readiness: Readiness::Started,
        restart: RestartPolicy {
            when: Restart::OnFailure,
            backoff_initial_ms: 100,
            backoff_max_ms: 1000,
            start_limit: 5,
            start_limit_window_ms: 60_000,
        },
        stop_command: None,
        stop_timeout_ms: 3000,
        start_timeout_ms: None,
        environment: BTreeMap::new(),
        user: None,
        working_directory: None,
        boot_nice: 0,
    }
}

pub fn after(mut s: Service, deps: &[&str]) -> Service {
    s.after = deps.iter().map(|d| d.to_string()).collect();
    s
}

impl Nasinit {
    pub fn start(tag: &str, services: Vec<Service>) -> Nasinit {
        let dir = std::env::temp_dir().join(format!("nasinit-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut plan = Plan::empty("test");
        plan.services = services;
        Nasinit::start_plan(dir, plan, &[])
    }

    /// Starts nasinit on a whole plan in `dir` (kept if it exists: a state directory in it
    /// survives from one run to the next), with extra arguments.
    pub fn start_plan(dir: PathBuf, plan: Plan, extra: &[&str]) -> Nasinit {
        std::fs::create_dir_all(&dir).expect("test dir");
        std::fs::write(dir.join("plan.json"), serde_json::to_string(&plan).expect("plan json")).expect("write plan");
        let out = std::fs::File::create(dir.join("console.log")).expect("console log");
        let child = Command::new(env!("CARGO_BIN_EXE_nasinit"))
            .arg("--plan")
            .arg(dir.join("plan.json"))
            .arg("--control")
            .arg(dir.join("control.sock"))
            .arg("--run-dir")
            .arg(dir.join("run"))
            .arg("--log-dir")
            .arg(dir.join("log"))
            .args(extra)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup"))
            .stderr(out)
            .spawn()
            .expect("start nasinit");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let sock = dir.join("control.sock");
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = loop {
            if let Ok(c) = rt.block_on(Client::connect(&sock)) {
                break c;
            }
            assert!(Instant::now() < deadline, "nasinit did not open its control socket");
            std::thread::sleep(Duration::from_millis(20));
        };
        Nasinit { dir, child, rt, client }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn services(&self) -> Vec<ServiceInfo> {
        self.rt.block_on(self.client.services()).expect("services")
    }

    pub fn service(&self, name: &str) -> ServiceInfo {
        self.services().into_iter().find(|s| s.name == name).expect("service exists")
    }

    /// Waits until `cond` holds for the named service; panics with the last state on timeout.
    pub fn wait_for(&self, name: &str, timeout: Duration, cond: impl Fn(&ServiceInfo) -> bool) -> ServiceInfo {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.service(name);
            if cond(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "timed out waiting on {name}: {s:?}\nconsole:\n{}", self.console());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn console(&self) -> String {
        std::fs::read_to_string(self.dir.join("console.log")).unwrap_or_default()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// Waits for nasinit to exit by itself; returns its exit status code.
    pub fn wait_exit(mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status.code();
            }
            assert!(Instant::now() < deadline, "nasinit did not exit:\n{}", self.console());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Requests poweroff and waits for nasinit to exit; returns its exit status code.
    pub fn poweroff(mut self) -> Option<i32> {
        self.rt.block_on(self.client.shutdown(ShutdownKind::Poweroff)).expect("shutdown");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status.code();
            }
            assert!(Instant::now() < deadline, "nasinit did not exit after poweroff:\n{}", self.console());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Nasinit {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SIGTERM: a test-mode nasinit stops its services and exits.
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether a process exists (and is not a zombie).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit(')').next().and_then(|r| r.split_whitespace().next()) != Some("Z"),
        Err(_) => false,
    }
}

/// Zombie children of a process.
pub fn zombies_of(parent: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let rest: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
        if rest.first() == Some(&"Z") && rest.get(1).and_then(|p| p.parse::<i32>().ok()) == Some(parent) {
            out.push(pid);
        }
    }
    out
}

pub fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

pub fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

pub fn read_pids(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect()
}
