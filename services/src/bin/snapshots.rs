//! nasos-snapshots run: takes, holds and prunes the plan's snapshots (see `nasos_services::snapshots`).

fn main() -> std::process::ExitCode {
    nasos_services::main("snapshots", &["run"], |_| nasos_services::snapshots::run())
}
