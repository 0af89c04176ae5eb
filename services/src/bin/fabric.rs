//! nasos-fabric up: links, RoCE v2 and DCB from the plan (see `nasos_services::fabric`).

fn main() -> std::process::ExitCode {
    nasos_services::main("fabric", &["up"], |_| nasos_services::fabric::up(&nasos_services::plan()?))
}
