//! nasos-storage up|export: pools and datasets from the plan (see `nasos_services::storage`).

fn main() -> std::process::ExitCode {
    nasos_services::main("storage", &["up", "export"], |verb| {
        if verb == "up" { nasos_services::storage::up() } else { nasos_services::storage::export() }
    })
}
