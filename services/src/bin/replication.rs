//! nasos-replication run|sshd|serve: sends datasets to peers, runs sshd for peers, and is the
//! forced command their keys log in to (see `nasos_services::replication`).

fn main() -> std::process::ExitCode {
    use nasos_services::replication;
    nasos_services::main("replication", &["run", "sshd", "serve"], |verb| match verb {
        "run" => replication::run(),
        "sshd" => replication::sshd(),
        _ => replication::serve::serve(),
    })
}
