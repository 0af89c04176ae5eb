//! nasinit: the appliance's PID 1 and service supervisor (being built: see init/README.md).

fn main() -> std::process::ExitCode {
    eprintln!("nasinit: the supervisor is not built yet");
    std::process::ExitCode::from(2)
}
