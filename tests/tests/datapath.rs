//! The data path between two VMs on one private QEMU network: the qemu-dev appliance and a
//! stand-in GPU node built from qemu-client.toml. The client mounts one export over RDMA
//! (soft-RoCE) and one over TCP, writes, drops its caches, reads back and compares sha256;
//! root_squash holds.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nasos_qemu::{Link, Serial, Spec, Vm};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("repo root")
}

fn nasos(args: &[&str]) -> String {
    let bin = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"))
        .join("release/nasos");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .args(["build", "--release", "--workspace", "--bins", "--locked"])
        .current_dir(repo())
        .status()
        .expect("cargo");
    assert!(st.success());
    let out = Command::new(bin).args(args).current_dir(repo()).output().expect("nasos");
    assert!(out.status.success(), "nasos {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn board() -> nasos_board::Board {
    let (file, text) = nasos_board::find_board("qemu-q35").expect("board");
    nasos_board::load_board(&nasos_board::SourceFile::new(file, text)).expect("valid").0
}

fn vm(dir: &Path, tag: &str, base: &Path, link: Link) -> Vm {
    let state = dir.join(format!("vm-{tag}"));
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state).expect("state");
    let disk = state.join("run.qcow2");
    let st = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
        .arg(base.canonicalize().expect("base"))
        .arg(&disk)
        .status()
        .expect("qemu-img");
    assert!(st.success());
    let spec = Spec {
        board: board(),
        disk,
        state: state.clone(),
        memory_mib: 1536,
        serial: Serial::Socket(state.join("console.sock")),
        qmp: Some(state.join("qmp.sock")),
        links: vec![link],
    };
    Vm::start(&spec, &dir.join(format!("console-{tag}.log"))).expect("start QEMU")
}

/// The sha256 digest in a command's output.
fn digest(out: &str) -> String {
    out.split_whitespace()
        .find(|w| w.len() == 64 && w.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(|| panic!("no sha256 in {out:?}"))
        .to_string()
}

/// Runs a command on a console and insists it succeeds.
fn ok(vm: &mut Vm, cmd: &str) -> String {
    let (out, code) = vm.run(cmd, Duration::from_secs(300)).unwrap_or_else(|e| panic!("`{cmd}`: {e}"));
    assert_eq!(code, 0, "`{cmd}` failed:\n{out}");
    out
}

#[test]
fn a_client_reads_back_what_it_wrote_over_rdma_and_tcp() {
    let dir = repo().join("build/e2e/datapath");
    std::fs::create_dir_all(&dir).expect("dir");
    nasos(&["build", "recipes/qemu-dev.toml", "--out", &dir.join("qemu-dev").display().to_string()]);
    nasos(&["build", "recipes/qemu-client.toml", "--out", &dir.join("qemu-client").display().to_string()]);
    let net = dir.join("fabric.sock");
    let _ = std::fs::remove_file(&net);
    let mut nas = vm(
        &dir,
        "nas",
        &dir.join("qemu-dev/disk.qcow2"),
        Link { port: "roce0".into(), socket: net.clone(), listen: true },
    );
    // The appliance listens on the private network; the client connects to it.
    std::thread::sleep(Duration::from_secs(2));
    let mut gpu =
        vm(&dir, "gpu", &dir.join("qemu-client/disk.qcow2"), Link { port: "roce1".into(), socket: net, listen: false });
    nas.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("appliance ready");
    gpu.wait_for("nasinit: ready in ", Duration::from_secs(600)).expect("client ready");

    // A directory a non-root user owns, on each export (root is squashed on both).
    ok(&mut nas, "install -d -o 1000 -g 1000 /export/tank/train/job /export/tank/scratch/job");

    // One transport at a time: an NFSv4.1+ client trunks a second mount of the same server onto
    // the transport it already has, so a TCP mount beside an RDMA one would ride RDMA too.
    for (m, export, opts) in
        [("rdma", "train", "vers=4.2,proto=rdma,port=20049"), ("tcp", "scratch", "vers=4.2,proto=tcp")]
    {
        let dir = format!("/tmp/mnt-{m}");
        ok(&mut gpu, &format!("mkdir -p {dir} && mount -t nfs -o {opts} 10.77.0.1:/export/tank/{export} {dir}"));
        let mount = ok(&mut gpu, &format!("grep ' {dir} ' /proc/mounts"));
        assert!(mount.contains(&format!("proto={m}")), "{m}: {mount}");
        let xprt = ok(
            &mut gpu,
            &format!(
                "awk -v d='mounted on {dir} ' 'index($0, d) {{f=1}} f && /xprt:/ {{print; exit}}' /proc/self/mountstats"
            ),
        );
        assert!(xprt.contains(&format!("xprt:\t{m}")) || xprt.contains(&format!("xprt: {m}")), "{m}: {xprt}");

        let as_user = "setpriv --reuid=1000 --regid=1000 --clear-groups";
        ok(&mut gpu, &format!("{as_user} dd if=/dev/urandom of={dir}/job/blob bs=1M count=16 status=none"));
        let local = digest(&ok(&mut gpu, &format!("sync; sha256sum < {dir}/job/blob")));
        ok(&mut gpu, "sync; echo 3 > /proc/sys/vm/drop_caches");
        let again = digest(&ok(&mut gpu, &format!("sha256sum < {dir}/job/blob")));
        assert_eq!(local, again, "{m}: the data read back differs");
        let there = digest(&ok(&mut nas, &format!("sha256sum < /export/tank/{export}/job/blob")));
        assert_eq!(local, there, "{m}: the appliance holds different bytes");
        // root_squash: root on the client cannot write as root.
        let (out, code) = gpu.run(&format!("touch {dir}/rootfile"), Duration::from_secs(120)).expect("touch");
        assert_ne!(code, 0, "root wrote through root_squash on {m}: {out}");
        assert!(out.contains("Permission denied"), "{out}");
        ok(&mut gpu, &format!("umount {dir}"));
    }
    gpu.kill();
    nas.kill();
}
