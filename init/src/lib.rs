//! nasinit, the appliance's PID 1 and service supervisor, and the control API `nasctl` uses.
//!
//! Rules it keeps (after dinit's): it never panics out and never exits as PID 1; it never blocks
//! on a service (every wait is a deadline); services run in their own session and cgroup; output
//! and logs are bounded; a broken request or client cannot stall the supervisor.

pub mod cgroup;
pub mod console;
pub mod control;
pub mod early;
pub mod finish;
pub mod firstboot;
pub mod graph;
pub mod laps;
pub mod logs;
pub mod machine;
pub mod process;
pub mod run;
pub mod state;
pub mod supervisor;
pub mod view;
pub mod watchdog;
