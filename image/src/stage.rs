//! Stages of a build, cached by content: each stage's key is a hash of everything it reads, and
//! a stage whose key matches the one recorded with its outputs does nothing. Outputs are written
//! under a temporary name and renamed, so a failed or interrupted stage leaves the previous
//! output intact.

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
        let key = key.hex();
        let t = Instant::now();
        let recorded = keyed || std::fs::read_to_string(&stamp).is_ok_and(|k| k.trim() == key);
        let fresh = !self.force && recorded && outputs.iter().all(|o| o.exists());
        self.finish(stage, &stamp, &key, t, fresh, work)
    }

    fn finish(
        &mut self,
        stage: &'static str,
        stamp: &Path,
        key: &str,
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
        write_atomic(stamp, key.as_bytes())?;
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

/// Writes a file by writing a temporary sibling and renaming it over the target.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = tmp_path(path);
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} into place", tmp.display()))?;
    Ok(())
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
        let dir = std::env::temp_dir().join(format!("nasos-stage-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
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
}
