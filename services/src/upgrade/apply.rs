//! `nasctl upgrade apply SOURCE`: installs a signed bundle on the inactive slot.
//!
//! The order is what makes it safe to cut the power anywhere:
//! 1. the manifest's signature, board, version policy and sizes are checked before a byte is
//!    written;
//! 2. every ESP entry but the running one is removed (and the ESP synced), so no entry can name
//!    the slot while it is being overwritten;
//! 3. the root and its verity tree stream onto the inactive slot while being hashed, and the
//!    UKI onto the ESP under a name systemd-boot ignores;
//! 4. after the stream verified, the slot is synced and read back through dm-verity's own check
//!    (`veritysetup verify`) against the signed root hash;
//! 5. only then the slot gets the partition UUID the new UKI names (the slot contract) and the
//!    UKI its entry name with a boot counter, each synced; systemd-boot boots the newest version
//!    with tries left, so that rename is the one step that makes the new version boot.
//!
//! A cut before step 5 leaves the running version the only entry; after it, the new version
//! is on trial and the old one stays as the fallback.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nasos_bundle::{Kind, Manifest, Payload, Running, TrustedKeys, policy, reader};
use nasos_layout::entry;
use nasos_layout::state::State;

use super::esp::{self, Esp};
use super::history::{self, Event};
use super::{slots, source};
use crate::Tool;

pub struct Options {
    pub source: String,
    pub allow_downgrade: bool,
}

/// What was installed.
pub struct Installed {
    pub manifest: Manifest,
    pub slot: &'static str,
    pub entry: String,
    pub took: Duration,
    /// Bytes written to the slot, and how long the stream took.
    pub slot_bytes: u64,
    pub stream: Duration,
}

/// Prints a progress line on the console (nasctl's stdout).
fn say(line: impl AsRef<str>) {
    println!("upgrade: {}", line.as_ref());
    let _ = std::io::stdout().flush();
}

/// One apply at a time, across nasctl processes.
fn lock() -> anyhow::Result<nix::fcntl::Flock<std::fs::File>> {
    std::fs::create_dir_all("/run/nasos")?;
    let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open("/run/nasos/upgrade.lock")?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|_| anyhow::anyhow!("another upgrade is running on this box"))
}

pub fn apply(opts: &Options) -> anyhow::Result<Installed> {
    let started = Instant::now();
    let _lock = lock()?;
    let plan = crate::plan()?;
    let st = State::mounted();
    let keys = TrustedKeys::parse(plan.upgrade.trusted_keys.iter().map(|k| k.key.as_str()))
        .context("the image's trusted keys")?;
    let disk = slots::discover(Path::new("/sys"), Path::new("/dev")).map_err(anyhow::Error::msg)?;
    let (Some(running), Some(target)) = (disk.running().cloned(), disk.inactive().cloned()) else {
        bail!("no inactive slot to install to");
    };
    let esp = Esp::mount(&disk.esp)?;
    let running_entry = running_entry(&esp, &plan.image.version);
    // Room on the ESP: free space plus what the entries removed below give back.
    let freed: u64 = esp
        .entries()
        .iter()
        .filter(|(n, _)| Some(n) != running_entry.as_ref())
        .filter_map(|(n, _)| std::fs::metadata(esp.dir().join(n)).ok())
        .map(|m| m.len())
        .sum();
    let partial = esp.dir().join(esp::PARTIAL);
    let freed = freed + std::fs::metadata(&partial).map_or(0, |m| m.len());
    let ctx = Running {
        image: plan.image.name.clone(),
        version: plan.image.version.clone(),
        board: plan.image.board.clone(),
        slot_bytes: target.bytes,
        esp_free_bytes: esp.free_bytes() + freed,
        allow_downgrade: opts.allow_downgrade,
    };

    let src = source::open(&opts.source)?;
    say(format!("reading {}{}", src.describe, src.len.map(|l| format!(" ({} MiB)", l >> 20)).unwrap_or_default()));
    let event = |what: &str, version: &str, detail: String| Event {
        at: history::now(),
        event: what.into(),
        version: version.into(),
        from: plan.image.version.clone(),
        slot: target.name.into(),
        detail,
    };

    let mut slot_file: Option<std::fs::File> = None;
    let mut uki_file: Option<std::fs::File> = None;
    let mut stream_started = Instant::now();
    let mut slot_bytes = 0u64;
    let result = reader::read(
        src.reader,
        &keys,
        |h| {
            let m = &h.manifest;
            say(format!(
                "bundle {} {} for {}, signed by key {} ({})",
                m.image, m.version, m.board, h.signer, h.trusted_comment
            ));
            policy::check(m, &ctx)?;
            if is_downgrade(&m.version, &plan.image.version) {
                // Its first boot is asked for through an EFI variable: the firmware's variables
                // must be writable before anything is.
                super::efivars().map_err(|e| reader::Error::Sink {
                    kind: "efivars",
                    source: std::io::Error::other(format!("{e:#}: a downgrade cannot be booted")),
                })?;
            }
            // Nothing names the slot while it is overwritten: drop every entry but the running one.
            prepare(&esp, running_entry.as_deref())
                .map_err(|e| reader::Error::Sink { kind: "esp", source: std::io::Error::other(format!("{e:#}")) })?;
            say(format!(
                "installing {} on slot {} ({}), the running {} stays on slot {}",
                m.version,
                target.name,
                target.device.display(),
                plan.image.version,
                running.name
            ));
            stream_started = Instant::now();
            Ok(())
        },
        |p: &Payload, r: &mut dyn Read| -> std::io::Result<()> {
            match p.kind {
                Kind::Uki => {
                    let f = uki_file.insert(std::fs::File::create(&partial)?);
                    copy(r, p, "kernel image", |bytes, _| f.write_all(bytes))?;
                    f.sync_all()
                }
                Kind::Root | Kind::Verity => {
                    if slot_file.is_none() {
                        // O_EXCL: a slot the kernel is using (mounted, mapped) is refused.
                        let f = std::fs::OpenOptions::new()
                            .write(true)
                            .custom_flags((nix::fcntl::OFlag::O_EXCL | nix::fcntl::OFlag::O_DIRECT).bits())
                            .open(&target.device)?;
                        slot_file = Some(f);
                    }
                    let Some(f) = slot_file.as_ref() else { return Err(std::io::Error::other("no slot")) };
                    // Each payload starts direct again (an unaligned tail before may have ended it).
                    let _ = set_direct(f, true);
                    let base = if p.kind == Kind::Root { 0 } else { slot_bytes };
                    let what = if p.kind == Kind::Root { "root filesystem" } else { "verity tree" };
                    copy(r, p, what, |bytes, at| write_slot(f, bytes, base + at))?;
                    slot_bytes += p.size;
                    Ok(())
                }
            }
        },
    );
    let header = match result {
        Ok(h) => h,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            // Refused: the sink never ran, so not a byte reached the slot or the ESP.
            let what = if uki_file.is_none() && slot_file.is_none() { "refused" } else { "failed" };
            let _ = history::record(&st, &event(what, "", e.to_string()));
            return Err(anyhow::Error::new(e).context(if what == "refused" {
                "the bundle was refused; nothing was written"
            } else {
                "the upgrade failed; the running version stays the one that boots"
            }));
        }
    };
    let m = header.manifest;
    let fail = |e: anyhow::Error| {
        let _ = std::fs::remove_file(&partial);
        let _ = history::record(&st, &event("failed", &m.version, format!("{e:#}")));
        e.context("the upgrade failed; the running version stays the one that boots")
    };
    if let Some(f) = slot_file.take() {
        f.sync_all().context("syncing the slot").map_err(fail)?;
    }
    // The write phase as a plain `dd … conv=fsync` would be timed: until the slot is durable.
    let stream = stream_started.elapsed();
    say(format!(
        "{} MiB written in {:.1}s ({:.1} MiB/s); checking the slot against its verity tree",
        slot_bytes >> 20,
        stream.as_secs_f64(),
        (slot_bytes as f64 / 1048576.0) / stream.as_secs_f64().max(0.001)
    ));
    verify_slot(&target.device, &m).map_err(fail)?;
    let uuid = nasos_layout::slot::root_partuuid(m.root_hash()).context("the root hash names no UUID").map_err(fail)?;
    slots::set_partuuid(&disk.device, target.number, &uuid).map_err(fail)?;
    // systemd-boot boots the newest version with tries left: an upgrade's entry boots next by
    // itself. An older version would never be picked, so a downgrade gets one try, asked for
    // with LoaderEntryOneShot (which systemd-boot deletes as it boots it): if that boot does not
    // get blessed, the running version is again the newest good entry and boots. Blessed, the
    // downgrade removes the newer entries (see `bless`).
    let downgrade = is_downgrade(&m.version, &plan.image.version);
    let tries = if downgrade { 1 } else { plan.upgrade.boot_tries };
    let name = entry::counted(&m.version, tries);
    std::fs::rename(&partial, esp.dir().join(&name)).context("naming the new boot entry").map_err(fail)?;
    esp.sync().map_err(fail)?;
    if downgrade {
        let id = entry::id(&name).context("the new entry's id").map_err(fail)?;
        entry::set_loader_var(Path::new(entry::EFIVARS), super::ONESHOT, &id, |p| {
            let _ = crate::run("chattr", &["-i", &p.display().to_string()]);
        })
        .with_context(|| format!("setting {} to {id}", super::ONESHOT))
        .map_err(fail)?;
    }
    let what = if downgrade { "a downgrade, " } else { "" };
    let _ = history::record(&st, &event("installed", &m.version, format!("{what}from {}; entry {name}", src.describe)));
    if downgrade {
        say(format!(
            "{} {} installed on slot {} (entry {name}): a downgrade, it boots once next; if it is not \
             ready and healthy in that boot, {} boots again, and once blessed it replaces {}",
            m.image, m.version, target.name, plan.image.version, plan.image.version
        ));
    } else {
        say(format!(
            "{} {} installed on slot {} (entry {name}, {tries} tries); it boots next, and {} stays the fallback",
            m.image, m.version, target.name, plan.image.version
        ));
    }
    Ok(Installed { manifest: m, slot: target.name, entry: name, took: started.elapsed(), slot_bytes, stream })
}

/// Whether installing `new` over the running `now` goes back in versions.
fn is_downgrade(new: &str, now: &str) -> bool {
    super::status::version_order(new, now) == std::cmp::Ordering::Less
}

/// The running version's entry on the ESP (blessed or on trial).
fn running_entry(esp: &Esp, version: &str) -> Option<String> {
    esp.entries().into_iter().find(|(_, e)| e.version == version).map(|(n, _)| n)
}

/// Removes every nasos entry but the running one, and any partial UKI, then syncs.
fn prepare(esp: &Esp, keep: Option<&str>) -> anyhow::Result<()> {
    std::fs::create_dir_all(esp.dir())?;
    for (name, _) in esp.entries() {
        if Some(name.as_str()) != keep {
            say(format!("removing the old entry {name} (its slot is about to be overwritten)"));
            std::fs::remove_file(esp.dir().join(&name)).with_context(|| format!("removing {name}"))?;
        }
    }
    let _ = std::fs::remove_file(esp.dir().join(esp::PARTIAL));
    esp.sync()
}

/// Direct I/O moves whole aligned blocks: the copy buffer starts on a page boundary and every
/// write but a payload's tail is a whole number of pages.
const ALIGN: usize = 4096;
/// Bytes a copy reads before it writes them.
const CHUNK: usize = 4 << 20;

/// A page-aligned buffer of one chunk (O_DIRECT takes whole pages from aligned memory).
struct Chunk {
    raw: Vec<u8>,
    off: usize,
}

impl Chunk {
    fn new() -> Chunk {
        let raw = vec![0u8; CHUNK + ALIGN];
        let off = raw.as_ptr().align_offset(ALIGN).min(ALIGN);
        Chunk { raw, off }
    }
    fn buf(&mut self) -> &mut [u8] {
        &mut self.raw[self.off..self.off + CHUNK]
    }
}

/// Streams a payload from `r` to `write(bytes, offset)` in whole chunks, saying its progress.
/// Reading (the bundle hashes what is read on a thread of its own) and writing overlap: a
/// writer thread takes each filled chunk while the next one is read, as `dd`'s page cache lets a
/// plain copy overlap them. Returns once every chunk is written (or the first error).
fn copy(
    r: &mut dyn Read,
    p: &Payload,
    what: &str,
    write: impl FnMut(&[u8], u64) -> std::io::Result<()> + Send,
) -> std::io::Result<()> {
    use std::sync::mpsc::{channel, sync_channel};
    let (to_writer, filled_chunks) = sync_channel::<(Chunk, usize, u64)>(1);
    let (give_back, free_chunks) = channel::<Chunk>();
    for _ in 0..2 {
        let _ = give_back.send(Chunk::new());
    }
    std::thread::scope(|scope| {
        let writer = scope.spawn(move || -> std::io::Result<()> {
            let mut write = write;
            for (mut chunk, len, at) in filled_chunks {
                write(&chunk.buf()[..len], at)?;
                if give_back.send(chunk).is_err() {
                    break;
                }
            }
            Ok(())
        });
        let read = (|| -> std::io::Result<()> {
            let (mut done, mut next) = (0u64, p.size / 10);
            let t = Instant::now();
            // No chunk back: the writer stopped on an error, which its join reports.
            while let Ok(mut chunk) = free_chunks.recv() {
                // Fill the chunk: the source hands out what it has (a socket, a tar entry), the
                // slot takes whole pages.
                let buf = chunk.buf();
                let mut filled = 0;
                while filled < buf.len() {
                    match r.read(&mut buf[filled..])? {
                        0 => break,
                        n => filled += n,
                    }
                }
                if filled == 0 {
                    return Ok(());
                }
                let last = filled < CHUNK;
                if to_writer.send((chunk, filled, done)).is_err() {
                    return Ok(());
                }
                done += filled as u64;
                if p.size >= (16 << 20) && done >= next && done < p.size {
                    say(format!(
                        "{what} {}% ({} of {} MiB, {:.1} MiB/s)",
                        done * 100 / p.size,
                        done >> 20,
                        p.size >> 20,
                        (done as f64 / 1048576.0) / t.elapsed().as_secs_f64().max(0.001)
                    ));
                    next += p.size / 10;
                }
                if last {
                    return Ok(());
                }
            }
            Ok(())
        })();
        drop(to_writer);
        let written = writer.join().unwrap_or_else(|_| Err(std::io::Error::other("the slot writer panicked")));
        // The writer's error first: a read that stopped because the writer did says less.
        written.and(read)
    })
}

/// Turns O_DIRECT on or off for an open file.
fn set_direct(f: &std::fs::File, on: bool) -> std::io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(f, FcntlArg::F_GETFL)?);
    let flags = if on { flags | OFlag::O_DIRECT } else { flags - OFlag::O_DIRECT };
    fcntl(f, FcntlArg::F_SETFL(flags))?;
    Ok(())
}

/// Writes `bytes` at `at` on the slot, opened with O_DIRECT: the whole pages straight from the
/// buffer (no copy into the page cache: under one vCPU that copy costs as much as hashing), an
/// unaligned tail — or everything, where the device refuses direct I/O — through the page cache.
/// The slot is synced once at the end either way.
fn write_slot(f: &std::fs::File, bytes: &[u8], at: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let whole = if at.is_multiple_of(ALIGN as u64) && bytes.as_ptr().align_offset(ALIGN) == 0 {
        bytes.len() / ALIGN * ALIGN
    } else {
        0
    };
    let (head, tail) = bytes.split_at(whole);
    if !head.is_empty() {
        match f.write_all_at(head, at) {
            Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => {
                set_direct(f, false)?;
                return f.write_all_at(bytes, at);
            }
            r => r?,
        }
    }
    if !tail.is_empty() {
        set_direct(f, false)?;
        f.write_all_at(tail, at + whole as u64)?;
    }
    Ok(())
}

/// Reads the whole slot back through dm-verity's check: every data block against the tree, the
/// tree against the signed root hash.
fn verify_slot(dev: &Path, m: &Manifest) -> anyhow::Result<()> {
    let v = m.verity()?;
    let d = dev.display().to_string();
    Tool::new("veritysetup")
        .args(["verify", &d, &d, &v.root_hash])
        .arg(format!("--hash-offset={}", v.hash_offset))
        .timeout(Duration::from_secs(1800))
        .run()
        .with_context(|| format!("the slot {d} does not verify against root hash {}", v.root_hash))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    /// A reader that hands out at most `step` bytes a call, as a socket or a tar entry does.
    struct Dribble<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl Read for Dribble<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.data.len().min(self.step).min(buf.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn payloads_land_whole_at_their_offsets_direct_or_not() {
        let path = std::env::temp_dir().join(format!("nasos-slot-{}", std::process::id()));
        // A root of whole pages over several chunks, then a tree with an unaligned tail.
        let root: Vec<u8> = (0..(CHUNK * 2 + 3 * ALIGN)).map(|i| (i % 251) as u8).collect();
        let tree: Vec<u8> = (0..(ALIGN * 3 + 123)).map(|i| (i % 13) as u8).collect();
        std::fs::write(&path, vec![0xee; root.len() + tree.len() + 4096]).expect("slot");
        let f = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_DIRECT.bits())
            .open(&path)
            .expect("O_DIRECT on ext4");
        for (data, base, step) in [(&root, 0u64, 1 << 20), (&tree, root.len() as u64, 1000)] {
            let _ = set_direct(&f, true);
            let p = Payload { kind: Kind::Root, size: data.len() as u64, sha256: String::new() };
            copy(&mut Dribble { data, step }, &p, "test", |b, at| write_slot(&f, b, base + at)).expect("copy");
        }
        f.sync_all().expect("sync");
        let got = std::fs::read(&path).expect("read");
        assert!(got[..root.len()] == root[..], "the root differs");
        assert!(got[root.len()..root.len() + tree.len()] == tree[..], "the tree differs");
        assert!(got[root.len() + tree.len()..].iter().all(|b| *b == 0xee), "written past the payloads");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_failed_write_or_read_ends_the_copy_with_its_error() {
        let data: Vec<u8> = vec![7; CHUNK * 4];
        let p = Payload { kind: Kind::Root, size: data.len() as u64, sha256: String::new() };
        let mut calls = 0;
        let e = copy(&mut Dribble { data: &data, step: 1 << 20 }, &p, "test", |_, at| {
            calls += 1;
            if at >= CHUNK as u64 { Err(std::io::Error::other("the slot is gone")) } else { Ok(()) }
        })
        .expect_err("a write failed");
        assert_eq!(e.to_string(), "the slot is gone");
        assert_eq!(calls, 2, "nothing is written after the failed chunk");

        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("the stick was pulled"))
            }
        }
        let e = copy(&mut Broken, &p, "test", |_, _| Ok(())).expect_err("the read failed");
        assert_eq!(e.to_string(), "the stick was pulled");
    }
}
