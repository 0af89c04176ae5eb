//! Stages of a build, cached by content: each stage's key is a hash of everything it reads, and
//! a stage whose key matches the one recorded with its outputs does nothing — once its outputs
//! are checked against the sha256 recorded when they were made: a cached file that was changed
//! since (a flipped bit, a hand edit, a tampered cache) is rebuilt, with a line saying so.
//! Outputs are written under a temporary name and renamed, so a failed or interrupted stage
//! leaves the previous output intact.

use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use sha2::{Digest, Sha256};

/// A content hash under construction.
#[derive(Clone, Default)]
pub struct Key(Sha256);

impl Key {
    pub fn new(stage: &str) -> Self {
        let mut k = Key(Sha256::new());
        k.str(stage);
        k
    }

    pub fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }

    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        // Length-prefixed, so ("ab","c") and ("a","bc") differ.
        self.0.update((b.len() as u64).to_le_bytes());
        self.0.update(b);
        self
    }

    pub fn file(&mut self, path: &Path) -> anyhow::Result<&mut Self> {
        let digest = sha256_file(path)?;
        Ok(self.str(&digest))
    }

    pub fn hex(&self) -> String {
        hex(&self.0.clone().finalize())
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

pub fn sha256_bytes(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

pub fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// One row of the timing table.
pub struct Timing {
    pub stage: &'static str,
    pub took: Duration,
    pub cached: bool,
    pub note: String,
}

/// Records stage keys next to a build's outputs and times the stages.
pub struct Stages {
    dir: PathBuf,
    /// Redo every stage, whatever is recorded (a clean build).
    pub force: bool,
    pub timings: Vec<Timing>,
}

impl Stages {
    pub fn new(dir: &Path) -> anyhow::Result<Self> {
        let dir = dir.join(".stages");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Stages { dir, force: false, timings: Vec::new() })
    }

    /// Runs `work` unless the stage's recorded key equals `key` and all `outputs` exist.
    /// Returns whether the work ran.
    pub fn run(
        &mut self,
        stage: &'static str,
        key: &Key,
        outputs: &[&Path],
        work: impl FnOnce() -> anyhow::Result<String>,
    ) -> anyhow::Result<bool> {
        self.stage(stage, key, outputs, false, work)
    }

    /// Like `run`, for outputs whose paths already contain their key (the shared cache): they
    /// are fresh whenever they exist, whichever build made them.
    pub fn run_keyed(
        &mut self,
        stage: &'static str,
        key: &Key,
        outputs: &[&Path],
        work: impl FnOnce() -> anyhow::Result<String>,
    ) -> anyhow::Result<bool> {
        self.stage(stage, key, outputs, true, work)
    }

    fn stage(
        &mut self,
        stage: &'static str,
        key: &Key,
        outputs: &[&Path],
        keyed: bool,
        work: impl FnOnce() -> anyhow::Result<String>,
    ) -> anyhow::Result<bool> {
        let stamp = self.dir.join(stage);
        // A keyed output lives in the shared cache: its record sits beside it, for every build.
        let record = match outputs.first() {
            Some(first) if keyed => record_beside(first),
            _ => stamp,
        };
        let key = key.hex();
        let t = Instant::now();
        let fresh = !self.force
            && match std::fs::read_to_string(&record) {
                Ok(text) => match check(&text, &key, outputs) {
                    Check::Fresh => true,
                    Check::Stale => false,
                    Check::Changed(why) => {
                        eprintln!("nasos: {stage:<10} {why}; rebuilding");
                        false
                    }
                },
                // No record: a stage never run (nothing to say), or a cache entry made before
                // records were kept, which cannot be checked.
                Err(_) => {
                    if keyed && !outputs.is_empty() && outputs.iter().all(|o| o.exists()) {
                        eprintln!("nasos: {stage:<10} cached output has no record of its hashes; rebuilding");
                    }
                    false
                }
            };
        self.finish(stage, &record, &key, outputs, t, fresh, work)
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        stage: &'static str,
        stamp: &Path,
        key: &str,
        outputs: &[&Path],
        t: Instant,
        fresh: bool,
        work: impl FnOnce() -> anyhow::Result<String>,
    ) -> anyhow::Result<bool> {
        if fresh {
            eprintln!("nasos: {stage:<10} up to date");
            self.timings.push(Timing { stage, took: t.elapsed(), cached: true, note: String::new() });
            return Ok(false);
        }
        // The old stamp goes first: an interrupted stage must not look done next time.
        let _ = std::fs::remove_file(stamp);
        crate::progress::begin(stage);
        let note = match work().with_context(|| format!("stage {stage}")) {
            Ok(note) => note,
            Err(e) => {
                crate::progress::finish(&format!("nasos: {stage:<10} failed after {:.1}s", t.elapsed().as_secs_f64()));
                return Err(e);
            }
        };
        write_atomic(stamp, record_text(key, outputs)?.as_bytes())?;
        let took = t.elapsed();
        crate::progress::finish(&format!(
            "nasos: {stage:<10} done in {:.1}s{}",
            took.as_secs_f64(),
            if note.is_empty() { String::new() } else { format!(" ({note})") }
        ));
        self.timings.push(Timing { stage, took, cached: false, note });
        Ok(true)
    }

    pub fn table(&self) -> String {
        let mut out = String::from("stage        time      \n");
        let mut total = Duration::ZERO;
        for t in &self.timings {
            total += t.took;
            let state = if t.cached { "cached" } else { "built" };
            let _ = writeln!(out, "{:<10} {:>7.1}s  {state:<6}  {}", t.stage, t.took.as_secs_f64(), t.note);
        }
        let _ = writeln!(out, "{:<10} {:>7.1}s", "total", total.as_secs_f64());
        out
    }
}

/// What a stage's record says about its outputs now.
#[derive(Debug, PartialEq)]
enum Check {
    /// The key is the recorded one and every output has its recorded sha256.
    Fresh,
    /// Another key, or an output missing: the stage has work to do (nothing to report).
    Stale,
    /// An output is not what the stage made: why, naming it.
    Changed(String),
}

/// A stage's record: its key, then `sha256  path` for each output.
fn record_text(key: &str, outputs: &[&Path]) -> anyhow::Result<String> {
    let mut out = format!("{key}\n");
    for o in outputs {
        let _ = writeln!(out, "{}  {}", sha256_file(o)?, o.display());
    }
    Ok(out)
}

/// Checks `outputs` against a record made by [`record_text`] (line by line, in order: a cache
/// entry may be linked under another name, with its own record).
fn check(record: &str, key: &str, outputs: &[&Path]) -> Check {
    let mut lines = record.lines();
    if lines.next().map(str::trim) != Some(key) || !outputs.iter().all(|o| o.exists()) {
        return Check::Stale;
    }
    let recorded: Vec<&str> = lines.filter_map(|l| l.split_once("  ").map(|(h, _)| h)).collect();
    for (i, o) in outputs.iter().enumerate() {
        let path = o.display();
        let Some(want) = recorded.get(i) else {
            return Check::Changed(format!("cached output {path} has no recorded hash"));
        };
        match sha256_file(o) {
            Ok(got) if got == *want => {}
            Ok(got) => {
                return Check::Changed(format!(
                    "cached output {path} does not match the sha256 recorded when it was made ({} ≠ {})",
                    &got[..16],
                    &want[..want.len().min(16)]
                ));
            }
            Err(e) => return Check::Changed(format!("cached output {path} cannot be read ({e:#})")),
        }
    }
    Check::Fresh
}

/// Records the hashes of a shared cache entry made outside a stage (a linked copy under
/// another key), so it is checked like one a stage made.
pub fn record_cache_entry(key: &Key, outputs: &[&Path]) -> anyhow::Result<()> {
    let first = outputs.first().context("a cache entry has outputs")?;
    write_atomic(&record_beside(first), record_text(&key.hex(), outputs)?.as_bytes())
}

/// Where the record of a shared cache entry is kept: `NAME.record` beside it.
fn record_beside(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".record");
    path.with_file_name(name)
}

/// Writes a file by writing a temporary sibling and renaming it over the target.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = tmp_path(path);
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} into place", tmp.display()))?;
    Ok(())
}

/// A temporary output, removed when dropped: a build that fails (or bails) before renaming it
/// into place leaves nothing behind (a rootfs tarball is some 400 MB, a disk image 2 GB).
/// Once renamed, the name is gone and the removal does nothing.
pub struct Scratch(PathBuf);

impl Scratch {
    /// The temporary sibling of `path` ([`tmp_path`]).
    pub fn beside(path: &Path) -> Scratch {
        Scratch(tmp_path(path))
    }

    /// Under an explicit name (one whose extension a tool reads, such as mmdebstrap's `.tar`).
    pub fn at(path: PathBuf) -> Scratch {
        Scratch(path)
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The temporary name an output is built under before it is renamed into place.
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".tmp.{}", std::process::id()));
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An empty folder of this test process's own, named for the test.
    fn fresh_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nasos-stage-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }

    #[test]
    fn a_scratch_output_is_gone_unless_renamed_into_place() {
        let dir = fresh_dir("scratch");
        let out = dir.join("root.img");
        {
            let tmp = Scratch::beside(&out);
            std::fs::write(&*tmp, b"half written").expect("write");
            assert!(tmp.exists());
            // A failure here: the scratch file is dropped with the error.
        }
        assert_eq!(std::fs::read_dir(&dir).expect("read_dir").count(), 0, "a half-written output was left");
        {
            let tmp = Scratch::beside(&out);
            std::fs::write(&*tmp, b"whole").expect("write");
            std::fs::rename(&tmp, &out).expect("rename");
        }
        assert_eq!(std::fs::read(&out).expect("read"), b"whole");
        assert_eq!(std::fs::read_dir(&dir).expect("read_dir").count(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn keys_are_length_prefixed_and_stable() {
        let mut a = Key::new("s");
        a.str("ab").str("c");
        let mut b = Key::new("s");
        b.str("a").str("bc");
        assert_ne!(a.hex(), b.hex());
        let mut c = Key::new("s");
        c.str("ab").str("c");
        assert_eq!(a.hex(), c.hex());
    }

    #[test]
    fn a_stage_runs_once_per_key_and_a_failure_leaves_no_stamp() {
        let dir = fresh_dir("once");
        let out = dir.join("out");
        let mut st = Stages::new(&dir).expect("stages");
        let key = Key::new("x");
        let mut runs = 0;
        for _ in 0..2 {
            st.run("x", &key, &[&out], || {
                runs += 1;
                std::fs::write(&out, "1")?;
                Ok(String::new())
            })
            .expect("run");
        }
        assert_eq!(runs, 1);
        let other = Key::new("y");
        assert!(st.run("x", &other, &[&out], || anyhow::bail!("boom")).is_err());
        // After a failure the stage is not considered done, even for the old key.
        assert!(st.run("x", &key, &[&out], || Ok(String::new())).expect("rerun"));
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn a_changed_output_is_rebuilt_for_build_stages_and_shared_cache_entries() {
        let dir = fresh_dir("tamper");
        let mut st = Stages::new(&dir).expect("stages");
        for keyed in [false, true] {
            let out = dir.join(format!("out-{keyed}"));
            let key = Key::new("k");
            let mut runs = 0;
            let mut go = |st: &mut Stages| {
                let work = || {
                    runs += 1;
                    std::fs::write(&out, "made by the stage")?;
                    Ok(String::new())
                };
                if keyed { st.run_keyed("x", &key, &[&out], work) } else { st.run("y", &key, &[&out], work) }
                    .expect("stage")
            };
            assert!(go(&mut st), "first run");
            assert!(!go(&mut st), "fresh with its recorded hash");
            std::fs::write(&out, "made by the stage, then changed").expect("tamper");
            assert!(go(&mut st), "a changed output is rebuilt");
            assert_eq!(std::fs::read_to_string(&out).expect("out"), "made by the stage");
            assert!(!go(&mut st), "fresh again");
            assert_eq!(runs, 2, "keyed={keyed}");
        }
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn a_check_names_the_changed_output() {
        let dir = fresh_dir("check");
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::write(&a, "a").expect("a");
        std::fs::write(&b, "b").expect("b");
        let record = record_text("key", &[&a, &b]).expect("record");
        assert_eq!(check(&record, "key", &[&a, &b]), Check::Fresh);
        assert_eq!(check(&record, "other", &[&a, &b]), Check::Stale);
        std::fs::write(&b, "B").expect("tamper");
        assert!(
            matches!(check(&record, "key", &[&a, &b]), Check::Changed(w) if w.contains(&b.display().to_string())),
            "the changed output is named"
        );
        std::fs::remove_file(&b).expect("rm");
        assert_eq!(check(&record, "key", &[&a, &b]), Check::Stale);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
