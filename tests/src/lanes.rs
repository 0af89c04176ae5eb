//! Lanes: the end-to-end suites in groups that share no VM, output folder or bundle, run side by
//! side, one process per lane. A TCG guest keeps about one of the machine's two cores busy, and
//! one after the other the suites took an hour of CI.
//!
//! Each lane runs its suites in order and prints as it goes; its lines come out prefixed with its
//! letter (`A| `), whole lines at a time. The arguments (a filter such as `datapath::`, `--skip`,
//! `--list`) go to every suite. `NASOS_E2E_LANES=1` runs every suite in this process, one after
//! the other: on a one-core machine, or to time a suite on its own.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use libtest_mimic::Arguments;

use crate::suite::Suite;

/// The suites of one lane, in the order they run.
pub type Lane = &'static [fn() -> Suite];

/// Set in a lane's process: which lane it runs.
const LANE_ENV: &str = "NASOS_E2E_LANE";
/// `1`: no lanes, every suite in order in one process.
const LANES_ENV: &str = "NASOS_E2E_LANES";

pub fn main(lanes: &[Lane]) -> ExitCode {
    let args = Arguments::from_args();
    if let Some(lane) = std::env::var(LANE_ENV).ok().and_then(|l| l.parse::<usize>().ok()) {
        let Some(suites) = lanes.get(lane) else {
            eprintln!("e2e: {LANE_ENV}={lane}, but there are {} lanes", lanes.len());
            return ExitCode::FAILURE;
        };
        // A lane ends with the run that started it, rather than booting VMs for nobody.
        let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM);
        return exit(in_order(suites, &args));
    }
    let one = std::env::var(LANES_ENV).is_ok_and(|v| v.trim() == "1");
    if one || args.list || lanes.len() < 2 {
        let all: Vec<fn() -> Suite> = lanes.iter().flat_map(|l| l.iter().copied()).collect();
        return exit(in_order(&all, &args));
    }
    side_by_side(lanes)
}

fn exit(passed: bool) -> ExitCode {
    if passed { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn letter(lane: usize) -> char {
    char::from(b'A' + (lane % 26) as u8)
}

fn names(lane: Lane) -> String {
    lane.iter().map(|s| s().name()).collect::<Vec<_>>().join(", ")
}

/// Runs `suites` one after the other (a failed one does not stop the next); whether all passed.
fn in_order(suites: &[fn() -> Suite], args: &Arguments) -> bool {
    let mut passed = true;
    for make in suites {
        let suite = make();
        let name = suite.name();
        let t = Instant::now();
        eprintln!("=== suite {name}");
        let ok = suite.run(args);
        eprintln!("=== suite {name} {} in {:.0}s", if ok { "passed" } else { "FAILED" }, t.elapsed().as_secs_f64());
        passed &= ok;
    }
    passed
}

fn side_by_side(lanes: &[Lane]) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("e2e: cannot find this test binary to run its lanes: {e}");
            return ExitCode::FAILURE;
        }
    };
    let plan: Vec<String> = lanes.iter().enumerate().map(|(i, l)| format!("{} = {}", letter(i), names(l))).collect();
    eprintln!(
        "e2e: {} lanes side by side: {} (NASOS_E2E_LANES=1 runs them one after the other)",
        lanes.len(),
        plan.join("; ")
    );
    let start = Instant::now();
    let mut running = Vec::new();
    for (i, lane) in lanes.iter().enumerate() {
        let spawned = Command::new(&exe)
            .args(std::env::args_os().skip(1))
            .env(LANE_ENV, i.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        match spawned {
            Ok(mut child) => {
                let tag = format!("{}| ", letter(i));
                let out = child.stdout.take().map(|p| relay(p, tag.clone(), false));
                let err = child.stderr.take().map(|p| relay(p, tag, true));
                running.push((i, *lane, child, [out, err]));
            }
            Err(e) => {
                eprintln!("e2e: starting lane {} ({}): {e}", letter(i), names(lane));
                return ExitCode::FAILURE;
            }
        }
    }
    let mut passed = true;
    let mut summary = Vec::new();
    for (i, lane, mut child, relays) in running {
        let status = child.wait();
        for r in relays.into_iter().flatten() {
            let _ = r.join();
        }
        let ok = status.as_ref().is_ok_and(|s| s.success());
        passed &= ok;
        let how = match status {
            Ok(s) if s.success() => "passed".to_string(),
            Ok(s) => format!("FAILED ({s})"),
            Err(e) => format!("FAILED (waiting for it: {e})"),
        };
        summary.push(format!(
            "lane {} ({}) {how}, done at {:.0}s",
            letter(i),
            names(lane),
            start.elapsed().as_secs_f64()
        ));
    }
    for line in summary {
        eprintln!("e2e: {line}");
    }
    eprintln!("e2e: all lanes took {:.0}s", start.elapsed().as_secs_f64());
    exit(passed)
}

/// Copies a lane's output to ours line by line, each line prefixed with `tag` and written whole,
/// so two lanes' lines never mix. Bytes that are not UTF-8 (a guest's console) are shown as such.
fn relay(from: impl Read + Send + 'static, tag: String, stderr: bool) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(from);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&line);
                    let text = text.trim_end_matches('\n');
                    // One write of the whole line: the standard streams' locks keep it together.
                    let whole = format!("{tag}{text}\n");
                    let _ = if stderr {
                        std::io::stderr().lock().write_all(whole.as_bytes())
                    } else {
                        std::io::stdout().lock().write_all(whole.as_bytes())
                    };
                }
            }
        }
    })
}
