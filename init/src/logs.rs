//! Service output: a bounded ring of recent lines per service, and a size-capped file when the log
//! directory is writable. Neither can grow without bound, whatever a service prints.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;

use nasos_api::{LogLine, LogPage};

/// Longest line kept; the rest of a longer line is dropped with a marker.
pub const MAX_LINE: usize = 4096;

pub struct Ring {
    lines: VecDeque<LogLine>,
    bytes: usize,
    max_bytes: usize,
    next_seq: u64,
    file: Option<CappedFile>,
}

impl Ring {
    pub fn new(max_bytes: usize, file: Option<CappedFile>) -> Self {
        Ring { lines: VecDeque::new(), bytes: 0, max_bytes, next_seq: 1, file }
    }

    pub fn push(&mut self, line: &str) {
        let mut text = line.trim_end_matches(['\n', '\r']).to_string();
        if text.len() > MAX_LINE {
            let mut cut = MAX_LINE;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str(" [line truncated]");
        }
        if let Some(f) = &mut self.file {
            f.write_line(&text);
        }
        self.bytes += text.len();
        self.lines.push_back(LogLine { seq: self.next_seq, text });
        self.next_seq += 1;
        while self.bytes > self.max_bytes {
            match self.lines.pop_front() {
                Some(old) => self.bytes -= old.text.len(),
                None => break,
            }
        }
    }

    /// Lines with a sequence number above `cursor`, at most `max` (the newest ones if there are more).
    pub fn page(&self, cursor: u64, max: u32) -> LogPage {
        let after: Vec<&LogLine> = self.lines.iter().filter(|l| l.seq > cursor).collect();
        let skip = after.len().saturating_sub(max as usize);
        let lines: Vec<LogLine> = after[skip..].iter().map(|l| (*l).clone()).collect();
        let next = lines.last().map_or(cursor.max(self.next_seq.saturating_sub(1)), |l| l.seq);
        LogPage { lines, next }
    }
}

/// A log file that is rotated once (to `NAME.log.1`) when it reaches its cap.
pub struct CappedFile {
    path: PathBuf,
    file: File,
    size: u64,
    cap: u64,
}

impl CappedFile {
    pub fn open(path: PathBuf, cap: u64) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        let size = file.metadata()?.len();
        Ok(CappedFile { path, file, size, cap })
    }

    fn write_line(&mut self, text: &str) {
        if self.size + text.len() as u64 + 1 > self.cap {
            let old = self.path.with_extension("log.1");
            // A failed rotation (full disk) must not stop logging to the ring: give up on the file.
            if std::fs::rename(&self.path, &old).is_ok()
                && let Ok(f) = OpenOptions::new().create(true).append(true).open(&self.path)
            {
                self.file = f;
                self.size = 0;
            }
        }
        if writeln!(self.file, "{text}").is_ok() {
            self.size += text.len() as u64 + 1;
        }
    }
}

/// Splits a byte stream into lines, holding back an incomplete last line and cutting runaway ones.
#[derive(Default)]
pub struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    pub fn feed(&mut self, bytes: &[u8], mut out: impl FnMut(&str)) {
        for &b in bytes {
            if b == b'\n' {
                out(&String::from_utf8_lossy(&self.pending));
                self.pending.clear();
            } else if self.pending.len() < MAX_LINE + 1 {
                self.pending.push(b);
            }
        }
    }

    pub fn finish(&mut self, mut out: impl FnMut(&str)) {
        if !self.pending.is_empty() {
            out(&String::from_utf8_lossy(&self.pending));
            self.pending.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_is_bounded_and_pages_by_cursor() {
        let mut r = Ring::new(100, None);
        for i in 0..50 {
            r.push(&format!("line {i:02}"));
        }
        // 7 bytes a line, 100 bytes kept: the newest 14 lines.
        let all = r.page(0, 1000);
        assert_eq!(all.lines.len(), 14);
        assert_eq!(all.lines.last().map(|l| l.text.as_str()), Some("line 49"));
        assert_eq!(all.next, 50);
        let tail = r.page(0, 3);
        assert_eq!(tail.lines.iter().map(|l| l.seq).collect::<Vec<_>>(), vec![48, 49, 50]);
        r.push("new");
        let more = r.page(all.next, 10);
        assert_eq!(more.lines.len(), 1);
        assert_eq!(more.lines[0].text, "new");
        assert_eq!(r.page(more.next, 10).lines.len(), 0);
        assert_eq!(r.page(more.next, 10).next, more.next);
    }

    #[test]
    fn long_lines_are_truncated() {
        let mut r = Ring::new(1 << 20, None);
        r.push(&"x".repeat(10_000));
        let p = r.page(0, 1);
        assert!(p.lines[0].text.len() < MAX_LINE + 32);
        assert!(p.lines[0].text.ends_with("[line truncated]"));
    }

    #[test]
    fn splitter_holds_partial_lines() {
        let mut s = LineSplitter::default();
        let mut got = Vec::new();
        s.feed(b"ab\ncd", |l| got.push(l.to_string()));
        s.feed(b"e\n\nf", |l| got.push(l.to_string()));
        s.finish(|l| got.push(l.to_string()));
        assert_eq!(got, vec!["ab", "cde", "", "f"]);
    }

    #[test]
    fn file_is_capped_and_rotated_once() {
        let dir = std::env::temp_dir().join(format!("nasinit-logs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("svc.log");
        let mut r = Ring::new(1000, Some(CappedFile::open(path.clone(), 200).expect("open")));
        for i in 0..100 {
            r.push(&format!("line number {i:03}"));
        }
        let size = std::fs::metadata(&path).expect("log").len();
        let old = std::fs::metadata(dir.join("svc.log.1")).expect("rotated").len();
        assert!(size <= 200 && old <= 200, "{size} {old}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
