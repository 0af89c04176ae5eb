//! What a long build shows while it works: on a terminal, a spinner per stage with its elapsed
//! time and the latest line of the tool it runs, and byte bars where the total is known; in a
//! log (CI, a pipe), the plain lines, because a redrawn bar in a log file is noise.
//!
//! The stage's spinner is kept here rather than threaded through every stage closure: there is
//! one build per process and one stage at a time.

use std::collections::VecDeque;
use std::io::{BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};

static CURRENT: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Lines of a failed tool's output kept for its error message.
const TAIL: usize = 40;

/// Starts the spinner of a stage; `finish` ends it.
pub fn begin(stage: &str) {
    let bar = ProgressBar::new_spinner().with_prefix(stage.to_string());
    bar.set_style(
        ProgressStyle::with_template("nasos: {prefix:<10} {spinner} {elapsed:>4} {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    if bar.is_hidden() {
        eprintln!("nasos: {stage:<10} ...");
    }
    if let Ok(mut c) = CURRENT.lock() {
        *c = Some(bar);
    }
}

/// Ends the current stage's spinner and prints its closing line.
pub fn finish(line: &str) {
    let bar = CURRENT.lock().ok().and_then(|mut c| c.take());
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    eprintln!("{line}");
}

/// Prints a line above the spinner (or plainly in a log).
pub fn say(line: &str) {
    match current() {
        Some(bar) if !bar.is_hidden() => bar.println(line),
        _ => eprintln!("{line}"),
    }
}

fn current() -> Option<ProgressBar> {
    CURRENT.lock().ok().and_then(|c| c.clone())
}

/// Shows what the current stage is doing now.
pub fn status(msg: &str) {
    if let Some(bar) = current() {
        bar.set_message(msg.to_string());
    }
}

/// A bar over a known number of bytes, drawn only on a terminal.
pub fn bytes(label: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total).with_prefix(label.to_string());
    bar.set_style(
        ProgressStyle::with_template("nasos: {prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar
}

/// Runs a long-running tool: its output becomes the spinner's message on a terminal and passes
/// through as lines in a log; warnings and errors are always printed. On failure the error
/// carries the tool's last lines, so nothing has to be scrolled back for.
pub fn run_tool(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {what}"))?;
    // (line, is_frame): a frame ends in a carriage return (a tool redrawing its progress) and
    // is only worth showing on a terminal; a line ends in a newline.
    let (tx, rx) = std::sync::mpsc::channel::<(String, bool)>();
    let mut readers = Vec::new();
    let out: Option<Box<dyn Read + Send>> = child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>);
    let err: Option<Box<dyn Read + Send>> = child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>);
    for stream in [out, err].into_iter().flatten() {
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            let mut r = BufReader::new(stream);
            let mut buf = [0u8; 4096];
            let mut line = Vec::new();
            let send = |line: &mut Vec<u8>, frame: bool| {
                let text = String::from_utf8_lossy(line).trim().to_string();
                line.clear();
                text.is_empty() || tx.send((text, frame)).is_ok()
            };
            loop {
                let n = match r.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                for &b in &buf[..n] {
                    match b {
                        b'\n' | b'\r' => {
                            if !send(&mut line, b == b'\r') {
                                return;
                            }
                        }
                        _ => line.push(b),
                    }
                }
            }
            send(&mut line, false);
        }));
    }
    drop(tx);
    let shown = current().is_some_and(|b| !b.is_hidden());
    let mut tail = VecDeque::with_capacity(TAIL);
    for (line, frame) in rx {
        if shown && !is_notice(&line) {
            status(&line);
        } else if !frame {
            say(&format!("  {line}"));
        }
        if frame {
            continue;
        }
        if tail.len() == TAIL {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    for r in readers {
        let _ = r.join();
    }
    let st = child.wait().with_context(|| format!("waiting for {what}"))?;
    if !st.success() {
        let last: Vec<String> = tail.into_iter().collect();
        bail!("{what} failed ({st}); its last lines:\n  {}", last.join("\n  "));
    }
    Ok(())
}

/// Lines a person must see even while a spinner hides the rest.
fn is_notice(line: &str) -> bool {
    let l = line.trim_start();
    l.starts_with("W:")
        || l.starts_with("E:")
        || ["error:", "Error:", "ERROR:", "warning:"].iter().any(|w| l.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_carries_the_last_lines() {
        let err = run_tool(Command::new("sh").args(["-c", "echo first; echo second >&2; exit 3"]), "a tool")
            .expect_err("exit 3 must fail");
        let msg = format!("{err:#}");
        assert!(msg.contains("a tool failed"), "{msg}");
        assert!(msg.contains("first") && msg.contains("second"), "{msg}");
    }

    #[test]
    fn success_is_ok_and_keeps_only_a_bounded_tail() {
        run_tool(Command::new("sh").args(["-c", "seq 1 1000"]), "seq").expect("seq succeeds");
        let err = run_tool(Command::new("sh").args(["-c", "seq 1 1000; exit 1"]), "seq").expect_err("fails");
        let msg = format!("{err:#}");
        assert!(msg.contains("\n  1000") && !msg.contains("\n  900\n"), "{msg}");
    }

    #[test]
    fn progress_frames_are_not_logged_as_lines() {
        // A tool redrawing with carriage returns, then finishing a line: only the line counts.
        let err =
            run_tool(Command::new("sh").args(["-c", "printf ' (10/100%%)\\r (90/100%%)\\rdone\\n'; exit 1"]), "t")
                .expect_err("fails");
        let msg = format!("{err:#}");
        assert!(msg.contains("done") && !msg.contains("90/100"), "{msg}");
    }

    #[test]
    fn notices_are_recognised() {
        assert!(is_notice("W: Download is performed unsandboxed"));
        assert!(is_notice("E: Unable to locate package"));
        assert!(!is_notice("I: running --customize-hook"));
        assert!(!is_notice("Setting up liberror-perl (0.17029-2) ..."));
        assert!(is_notice("make: *** [Makefile] error: 2"));
    }
}
