//! Helpers shared by the integration tests: building the LD_PRELOAD shim,
//! running the host's `dcb` (or this test binary) against it, and reading
//! back what was sent.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use nasos_dcbnl::{App, Ieee, IeeeEts, IeeePfc, Request};

/// Interface name used with the shim; it answers for any name.
pub const IFNAME: &str = "eth9";

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex from shim log")).collect()
}

/// The shim's state string for `ieee` (see the shim's crate docs).
pub fn state_env(ieee: &Ieee) -> String {
    let mut parts = Vec::new();
    if let Some(e) = &ieee.ets {
        parts.push(format!("ets={}", hex(&e.to_bytes())));
    }
    if let Some(p) = &ieee.pfc {
        parts.push(format!("pfc={}", hex(&p.to_bytes())));
    }
    let apps: Vec<String> = ieee.apps.iter().map(|a| hex(&a.to_bytes())).collect();
    parts.push(format!("app={}", apps.join(",")));
    parts.join(";")
}

/// The directory holding this test binary's profile outputs, e.g.
/// `<target>/debug`, and the target directory above it.
fn profile_and_target_dir() -> (PathBuf, PathBuf) {
    // Tests live in <target>/<profile>/deps/<name>-<hash>.
    let from_exe = || {
        let exe = std::env::current_exe().ok()?;
        let deps = exe.parent().filter(|d| d.file_name().is_some_and(|n| n == "deps"))?;
        let profile = deps.parent()?;
        Some((profile.to_path_buf(), profile.parent()?.to_path_buf()))
    };
    if let Some(dirs) = from_exe() {
        return dirs;
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    (target.join("debug"), target)
}

/// Builds `nasos-dcbnl-shim` into the same target directory and profile as
/// this test binary (once per test process) and returns the .so path.
pub fn shim_path() -> &'static Path {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let (profile_dir, target_dir) = profile_and_target_dir();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "nasos-dcbnl-shim"])
            .env("CARGO_TARGET_DIR", &target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => {}
            Some(other) => {
                cmd.args(["--profile", other]);
            }
        }
        let out = cmd.output().expect("spawn cargo to build the shim");
        assert!(out.status.success(), "building nasos-dcbnl-shim failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let so = profile_dir.join("libnasos_dcbnl_shim.so");
        assert!(so.exists(), "{} missing after build", so.display());
        so
    })
}

/// The host's iproute2 `dcb`; the byte-for-byte tests are meaningless
/// without it, so its absence is a failure, not a skip.
pub fn dcb_path() -> PathBuf {
    let find =
        || ["/usr/sbin/dcb", "/sbin/dcb", "/usr/bin/dcb", "/bin/dcb"].into_iter().find(|p| Path::new(p).exists());
    if let Some(p) = find() {
        return PathBuf::from(p);
    }
    // As root on a fresh machine, install it, as nasos installs its own host tools.
    if is_root() {
        static INSTALL: std::sync::Once = std::sync::Once::new();
        INSTALL.call_once(|| {
            let _ = std::process::Command::new("apt-get")
                // Wait for dpkg's lock: a test lane may be installing its own tool.
                .args(["-o", "DPkg::Lock::Timeout=600", "install", "-y", "--no-install-recommends", "iproute2"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status();
        });
        if let Some(p) = find() {
            return PathBuf::from(p);
        }
    }
    panic!(
        "iproute2's `dcb` was not found (looked in /usr/sbin, /sbin, /usr/bin, /bin). \
         These tests compare our messages with dcb's byte for byte; install it with \
         `apt-get install iproute2` (iproute2 >= 5.11 for `dcb app`)."
    );
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A fresh log file path for the shim.
pub fn log_path() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "nasos-dcbnl-shim-{}-{}.log",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Reads and removes a shim log: one request per line.
pub fn take_log(path: &Path) -> Vec<Vec<u8>> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let _ = std::fs::remove_file(path);
    text.lines().filter(|l| !l.is_empty()).map(unhex).collect()
}

/// Runs `cmd` with the shim preloaded, simulating a NIC in state `state`;
/// returns the process output and the requests it sent.
pub fn run_with_shim(mut cmd: Command, state: &Ieee, extra_env: &[(&str, &str)]) -> (Output, Vec<Vec<u8>>) {
    let log = log_path();
    cmd.env("LD_PRELOAD", shim_path())
        .env("NASOS_DCBNL_SHIM_STATE", state_env(state))
        .env("NASOS_DCBNL_SHIM_LOG", &log);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawn process under the shim");
    (out, take_log(&log))
}

/// Runs `dcb ARGS…` against the simulated NIC and returns what it sent;
/// panics if dcb fails.
pub fn run_dcb(state: &Ieee, args: &[&str]) -> Vec<Vec<u8>> {
    let mut cmd = Command::new(dcb_path());
    cmd.args(args);
    let (out, sent) = run_with_shim(cmd, state, &[]);
    assert!(
        out.status.success(),
        "dcb {} failed ({}):\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    sent
}

/// Runs `dcb` and returns its stdout (for the `show` commands).
pub fn dcb_show(state: &Ieee, args: &[&str]) -> String {
    let mut cmd = Command::new(dcb_path());
    cmd.args(args);
    let (out, _) = run_with_shim(cmd, state, &[]);
    assert!(out.status.success(), "dcb {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs several dcb commands in one `dcb -b` process, so the simulated NIC
/// carries its state from one command to the next.
pub fn run_dcb_batch(state: &Ieee, lines: &[String]) -> Vec<Vec<u8>> {
    let batch = log_path().with_extension("batch");
    std::fs::write(&batch, lines.join("\n") + "\n").expect("write dcb batch file");
    let sent = run_dcb(state, &["-b", batch.to_str().expect("utf-8 temp path")]);
    let _ = std::fs::remove_file(&batch);
    sent
}

pub fn seq_of(msg: &[u8]) -> u32 {
    u32::from_ne_bytes([msg[8], msg[9], msg[10], msg[11]])
}

/// Asserts that `sent` (messages captured from a program) equals our
/// encoding of `expected`, message by message, each with the program's own
/// sequence number.
pub fn assert_same_messages(what: &str, sent: &[Vec<u8>], expected: &[Request]) {
    let ours: Vec<Vec<u8>> =
        sent.iter().zip(expected).map(|(m, r)| r.encode(IFNAME, seq_of(m)).expect("encode")).collect();
    for (i, (theirs, mine)) in sent.iter().zip(&ours).enumerate() {
        if theirs != mine {
            let at = theirs.iter().zip(mine).position(|(a, b)| a != b).unwrap_or(theirs.len().min(mine.len()));
            panic!(
                "{what}: message {i} ({:?}) differs at byte {at}\n sent: {}\n ours: {}",
                expected[i],
                hex(theirs),
                hex(mine)
            );
        }
    }
    assert_eq!(
        sent.len(),
        expected.len(),
        "{what}: {} messages sent, expected {expected:?}; sent:\n{}",
        sent.len(),
        sent.iter().map(|m| hex(m)).collect::<Vec<_>>().join("\n")
    );
}

/// A NIC as a ConnectX would report it before the recipe ran: PFC off, one
/// strict TC, no APP entries.
pub fn blank_nic() -> Ieee {
    Ieee {
        ets: Some(IeeeEts {
            ets_cap: 8,
            tc_tx_bw: [100, 0, 0, 0, 0, 0, 0, 0],
            tc_reco_bw: [100, 0, 0, 0, 0, 0, 0, 0],
            ..IeeeEts::default()
        }),
        pfc: Some(IeeePfc { pfc_cap: 8, ..IeeePfc::default() }),
        apps: vec![],
    }
}

/// A NIC somebody configured differently before: PFC on 0, 4 and 6 with
/// non-default mbc/delay, frame counters running, a willing ETS config with
/// recommendation fields set, a stale DSCP entry (26→5) and one the recipe
/// does not mention (46→5) plus an EtherType entry.
pub fn used_nic() -> Ieee {
    Ieee {
        ets: Some(IeeeEts {
            willing: 1,
            ets_cap: 8,
            cbs: 0,
            tc_tx_bw: [50, 50, 0, 0, 0, 0, 0, 0],
            tc_rx_bw: [10, 20, 30, 40, 0, 0, 0, 0],
            tc_tsa: [2, 2, 0, 0, 0, 0, 0, 0],
            prio_tc: [0, 0, 1, 1, 0, 0, 0, 0],
            tc_reco_bw: [30, 70, 0, 0, 0, 0, 0, 0],
            tc_reco_tsa: [2, 2, 0, 0, 0, 0, 0, 0],
            reco_prio_tc: [1, 1, 0, 0, 0, 0, 0, 0],
        }),
        pfc: Some(IeeePfc {
            pfc_cap: 8,
            pfc_en: 0b0101_0001,
            mbc: 1,
            delay: 0x1234,
            requests: [1, 2, 3, 4, 5, 6, 7, 0x0102_0304_0506_0708],
            indications: [100, 0, 0, 0, 1 << 40, 0, 0, u64::MAX],
        }),
        apps: vec![App::dscp(26, 5), App::dscp(46, 5), App { selector: 1, priority: 4, protocol: 0x8915 }],
    }
}

/// The recipe's RoCE configuration.
pub fn roce_desired() -> nasos_dcbnl::Desired {
    nasos_dcbnl::Desired {
        lossless_priority: 3,
        ets_bandwidth: Some([20, 0, 0, 50, 0, 0, 10, 20]),
        dscp: vec![(26, 3), (48, 6)],
    }
}
