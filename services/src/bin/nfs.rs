//! nasos-nfs serve: the kernel NFS server from the plan (see `nasos_services::nfs`).

fn main() -> std::process::ExitCode {
    nasos_services::main("nfs", &["serve"], |_| nasos_services::nfs::serve())
}
