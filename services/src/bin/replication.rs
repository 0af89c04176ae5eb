//! nasos-replication run|sshd|serve: sends datasets to peers, runs sshd for peers, and is the
//! forced command their keys log in to (see `nasos_services::replication`).

fn main() -> std::process::ExitCode {
    use nasos_services::replication;
    nasos_services::main("replication", &["run", "sshd", "serve"], |verb| match verb {
        "run" => replication::run(),
        "sshd" => replication::sshd(),
        // The peer reads why a request failed from ssh's stderr.
        _ => replication::serve::serve().inspect_err(|e| eprintln!("nasos-replication on this box: {e:#}")),
    })
}
