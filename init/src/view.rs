//! What the control API shows of the supervisor: read-only views of the core's state, apart from
//! both the decisions and the effects.

use nasos_api::{ServiceInfo, Status, TimelineEntry};
use nasos_board::Plan;
use nix::unistd::Pid;

use crate::machine::{Core, State};

/// Facts about the box the core does not hold.
pub struct Box<'a> {
    pub hostname: String,
    pub plan: &'a Plan,
    pub pid1: bool,
    pub facts: &'a BootFacts,
}

/// What nasinit learned while the box came up, before the supervisor ran.
#[derive(Debug, Clone, Default)]
pub struct BootFacts {
    /// Kernel boot → nasinit start; -1 when unknown (not PID 1).
    pub kernel_ms: i64,
    /// This boot's number on the state partition; 0 without one.
    pub boot: u64,
    pub last_boot: String,
    pub state_partition: String,
    /// The state partition's mount and the previous boot's number, to settle its record.
    pub previous: Option<(std::path::PathBuf, u64)>,
    /// The state directory (failed-boot counter); `None` without one.
    pub state_root: Option<std::path::PathBuf>,
    /// Why the appliance stays up not ready (the reboot-loop guard stopped rebooting).
    pub why_not_ready: String,
}

/// Milliseconds since nasinit started; -1 for "not yet".
fn ms(core: &Core, t: Option<std::time::Instant>) -> i64 {
    t.map_or(-1, |t| t.duration_since(core.t0).as_millis() as i64)
}

pub fn status(core: &Core, b: &Box<'_>, orphans_reaped: u64) -> Status {
    let failed = core.services.iter().filter(|s| s.state == State::Failed).count() as u32;
    let state = if core.shutdown.is_some() {
        "stopping"
    } else if core.plan_error.is_some() || failed > 0 {
        "degraded"
    } else if core.ready_at.is_some() {
        "ready"
    } else {
        "starting"
    };
    Status {
        state: state.to_string(),
        hostname: b.hostname.clone(),
        image: b.plan.image.name.clone(),
        version: b.plan.image.version.clone(),
        pid1: b.pid1,
        uptime_ms: core.t0.elapsed().as_millis() as i64,
        ready_ms: ms(core, core.ready_at),
        kernel_ms: b.facts.kernel_ms,
        boot: b.facts.boot,
        last_boot: b.facts.last_boot.clone(),
        state_partition: b.facts.state_partition.clone(),
        why_not_ready: b.facts.why_not_ready.clone(),
        services: core.services.len() as u32,
        services_ready: core.services.iter().filter(|s| s.state.is_ready()).count() as u32,
        services_failed: failed,
        orphans_reaped,
    }
}

/// Every service; `pids[i]` is the main process of service `i`, if one runs.
pub fn services(core: &Core, pids: &[Option<Pid>]) -> Vec<ServiceInfo> {
    core.services
        .iter()
        .enumerate()
        .map(|(i, s)| ServiceInfo {
            name: s.spec.name.clone(),
            state: s.state.name().to_string(),
            pid: pids.get(i).copied().flatten().map_or(0, |p| p.as_raw() as u32),
            restarts: s.restarts,
            since_ms: ms(core, Some(s.since)),
            started_ms: ms(core, s.first_start),
            ready_ms: ms(core, s.first_ready),
            last_exit: s.last_exit.clone(),
            detail: s.detail.clone(),
        })
        .collect()
}

pub fn timeline(core: &Core) -> Vec<TimelineEntry> {
    core.services
        .iter()
        .map(|s| TimelineEntry {
            name: s.spec.name.clone(),
            started_ms: ms(core, s.first_start),
            ready_ms: ms(core, s.first_ready),
        })
        .collect()
}
