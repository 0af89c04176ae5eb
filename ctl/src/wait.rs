//! `nasctl start|stop|restart` return when the service got there, as `systemctl` does: a script
//! (or an operator) that stops nfs and then touches nfsd must not race the service's own
//! shutdown of it. nasinit bounds every stop (stop command, SIGTERM, SIGKILL, then it gives up
//! on the process), so a stop always ends; a start may wait on its dependencies, so it has a
//! time limit after which nasctl says where the service is and leaves it to nasinit.

use std::time::{Duration, Instant};

use nasos_api::{Client, ServiceInfo};

/// Where the operator asked the service to go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Goal {
    /// Running and ready (a oneshot: done).
    Up,
    /// Stopped (or failed: no process left either way).
    Down,
}

/// Longest a start waits (its dependencies may be starting too) before nasctl stops watching.
pub const START_LIMIT: Duration = Duration::from_secs(120);
/// Past nasinit's own stop bounds (stop command and SIGTERM timeouts, SIGKILL grace).
pub const STOP_LIMIT: Duration = Duration::from_secs(300);
/// Before this, state changes are not printed: most starts and stops are quicker.
const QUIET: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(100);

/// Whether `s` has reached `goal`: `None` while on its way, `Some(Err)` when it will not get
/// there without someone acting (a failed start).
pub fn reached(goal: Goal, s: &ServiceInfo) -> Option<Result<(), String>> {
    let how = |what: &str| {
        let mut why = format!("{}: {what}", s.name);
        for part in [&s.last_exit, &s.detail] {
            if !part.is_empty() {
                why.push_str(&format!(" ({part})"));
            }
        }
        format!("{why}; `nasctl logs {}` says why", s.name)
    };
    match (goal, s.state.as_str()) {
        (Goal::Up, "running" | "done") => Some(Ok(())),
        (Goal::Up, "failed") => Some(Err(how("failed"))),
        (Goal::Up, "backoff") => Some(Err(how("its start failed, nasinit tries again"))),
        (Goal::Up, "stopped") => Some(Err(format!("{}: was stopped while starting", s.name))),
        (Goal::Down, "stopped" | "failed") => Some(Ok(())),
        _ => None,
    }
}

/// Polls the service until it reaches `goal` or `limit` passes.
pub async fn until(client: &Client, name: &str, goal: Goal, limit: Duration) -> anyhow::Result<()> {
    let t = Instant::now();
    let mut last = String::new();
    loop {
        let services = client.services().await?;
        let s = services
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| anyhow::anyhow!("nasinit no longer lists a service named {name}"))?;
        if let Some(r) = reached(goal, s) {
            return r.map_err(anyhow::Error::msg);
        }
        if t.elapsed() >= limit {
            anyhow::bail!(
                "{name} is still {} after {}s ({}); nasinit carries on, `nasctl services` shows it",
                s.state,
                limit.as_secs(),
                if s.detail.is_empty() { "no detail" } else { &s.detail }
            );
        }
        let now = format!("{} {}", s.state, s.detail);
        if t.elapsed() >= QUIET && now != last {
            eprintln!(
                "{name}: {}{}",
                s.state,
                if s.detail.is_empty() { String::new() } else { format!(" ({})", s.detail) }
            );
            last = now;
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(state: &str, last_exit: &str, detail: &str) -> ServiceInfo {
        ServiceInfo {
            name: "nfs".into(),
            state: state.into(),
            pid: 0,
            restarts: 0,
            since_ms: 0,
            started_ms: 0,
            ready_ms: 0,
            last_exit: last_exit.into(),
            detail: detail.into(),
        }
    }

    #[test]
    fn a_stop_ends_when_no_process_is_left() {
        for on_the_way in ["running", "stopping", "starting"] {
            assert_eq!(reached(Goal::Down, &svc(on_the_way, "", "")), None, "{on_the_way}");
        }
        assert_eq!(reached(Goal::Down, &svc("stopped", "", "")), Some(Ok(())));
        assert_eq!(reached(Goal::Down, &svc("failed", "exit 1", "")), Some(Ok(())));
    }

    #[test]
    fn a_start_ends_ready_or_failed_with_why() {
        for on_the_way in ["waiting", "starting", "stopping"] {
            assert_eq!(reached(Goal::Up, &svc(on_the_way, "", "")), None, "{on_the_way}");
        }
        assert_eq!(reached(Goal::Up, &svc("running", "", "")), Some(Ok(())));
        assert_eq!(reached(Goal::Up, &svc("done", "exit 0", "")), Some(Ok(())));
        let failed = reached(Goal::Up, &svc("backoff", "exit 1", "")).expect("settled").expect_err("a failure");
        assert_eq!(failed, "nfs: its start failed, nasinit tries again (exit 1); `nasctl logs nfs` says why");
        let failed = reached(Goal::Up, &svc("failed", "exit 1", "5 failed starts in 60s"))
            .expect("settled")
            .expect_err("a failure");
        assert!(failed.contains("(exit 1) (5 failed starts in 60s)"), "{failed}");
    }
}
