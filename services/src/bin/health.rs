//! nasos-health run: checks and reports (see `nasos_services::health`).

fn main() -> std::process::ExitCode {
    nasos_services::main("health", &["run"], |_| nasos_services::health::run())
}
