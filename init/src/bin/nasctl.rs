//! nasctl: control and inspect nasinit from the serial console (being built: see init/README.md).

fn main() -> std::process::ExitCode {
    eprintln!("nasctl: the control client is not built yet");
    std::process::ExitCode::from(2)
}
