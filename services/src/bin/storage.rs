//! nasos-storage up|export: pools and datasets from the plan (see `nasos_services::storage`).

fn main() -> std::process::ExitCode {
    nasos_services::main("storage", &["up", "export", "probe"], |verb| match verb {
        "up" => nasos_services::storage::up(),
        "probe" => nasos_services::storage::probe(),
        _ => nasos_services::storage::export(),
    })
}
