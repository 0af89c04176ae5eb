//! nasos-upgrade bless: marks the running boot entry good (see `nasos_services::upgrade`).

fn main() -> std::process::ExitCode {
    nasos_services::main("upgrade", &["bless"], |_| nasos_services::upgrade::bless())
}
