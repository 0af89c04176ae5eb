//! Bounded histories on the state partition: one JSON object per line, oldest first. Each
//! append rewrites the file through a temporary one and fsyncs both, so a power cut leaves the
//! old history or the new one, never half a line.

use std::io::Write;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Appends `items` to the history at `path`, keeping the newest `keep`.
pub fn append<T: Serialize + DeserializeOwned>(path: &Path, items: &[T], keep: usize) -> std::io::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let mut text = String::new();
    let old: Vec<String> =
        std::fs::read_to_string(path).unwrap_or_default().lines().map(String::from).filter(|l| !l.is_empty()).collect();
    let new: Vec<String> = items.iter().filter_map(|e| serde_json::to_string(e).ok()).collect();
    let all: Vec<&String> = old.iter().chain(new.iter()).collect();
    for line in &all[all.len().saturating_sub(keep)..] {
        text.push_str(line);
        text.push('\n');
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(d) = path.parent() {
        std::fs::File::open(d)?.sync_all()?;
    }
    Ok(())
}

/// Every entry kept, oldest first (lines that do not parse are skipped).
pub fn read<T: DeserializeOwned>(path: &Path) -> Vec<T> {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}
