//! Reads a bundle from a stream. The order is the safety argument: the manifest and its
//! signature come first and are verified, then the caller decides (board, version, room) —
//! all before a single payload byte is handed to the sink. Each payload is hashed while it
//! streams; the caller makes nothing bootable until `read` has returned Ok.

use std::io::Read;

use sha2::{Digest, Sha256};

use crate::manifest::{Kind, Manifest, ManifestError, Payload};
use crate::policy::Refusal;
use crate::trust::{TrustError, TrustedKeys};
use crate::{MANIFEST, MAX_MANIFEST, MAX_SIGNATURE, SIGNATURE};

/// A verified manifest and what it was verified with.
#[derive(Debug, Clone)]
pub struct Header {
    pub manifest: Manifest,
    /// The manifest exactly as signed.
    pub manifest_bytes: Vec<u8>,
    /// The `.minisig` text.
    pub signature: String,
    /// The id of the key that signed it.
    pub signer: String,
    /// The signature's trusted comment.
    pub trusted_comment: String,
}

/// The first two entries, not yet verified (for `nasos bundle --inspect`).
#[derive(Debug, Clone)]
pub struct Raw {
    pub manifest: Vec<u8>,
    pub signature: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the bundle: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a nasos bundle: {0}")]
    NotABundle(String),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Trust(#[from] TrustError),
    #[error("refused: {0}")]
    Refused(#[from] Refusal),
    #[error("the bundle ends before its {0} payload: it was cut short (copy it again)")]
    Missing(&'static str),
    #[error("the bundle's entry `{entry}` should be the {kind} payload `{want}`")]
    Order { entry: String, kind: &'static str, want: &'static str },
    #[error("the {kind} payload is {entry} bytes in the bundle but the manifest says {manifest}")]
    Size { kind: &'static str, entry: u64, manifest: u64 },
    #[error("the bundle ends inside its {kind} payload ({got} of {want} bytes): it was cut short (copy it again)")]
    Truncated { kind: &'static str, got: u64, want: u64 },
    #[error(
        "the {kind} payload's sha256 is {got} but the manifest says {want}: the bundle was changed or damaged after signing"
    )]
    Digest { kind: &'static str, got: String, want: String },
    #[error("writing the {kind} payload: {source}")]
    Sink { kind: &'static str, source: std::io::Error },
    #[error("the bundle has an entry `{0}` after its payloads")]
    Extra(String),
}

/// Reads the next entry, which must be a regular file named `name` of at most `max` bytes.
fn small<R: Read>(entries: &mut tar::Entries<'_, R>, name: &str, max: u64) -> Result<Vec<u8>, Error> {
    let mut e = entries.next().ok_or_else(|| Error::NotABundle(format!("it ends before `{name}`")))??;
    let path = e.path()?.to_string_lossy().into_owned();
    if path != name || !e.header().entry_type().is_file() {
        return Err(Error::NotABundle(format!(
            "its first entries must be `{MANIFEST}` and `{SIGNATURE}`, found `{path}`"
        )));
    }
    if e.size() > max {
        return Err(Error::NotABundle(format!("`{name}` is {} bytes, more than the {max} a bundle allows", e.size())));
    }
    let mut buf = Vec::with_capacity(e.size() as usize);
    (&mut e).take(max).read_to_end(&mut buf)?;
    if buf.len() as u64 != e.size() {
        return Err(Error::NotABundle(format!("it ends inside `{name}`")));
    }
    Ok(buf)
}

fn raw_of<R: Read>(entries: &mut tar::Entries<'_, R>) -> Result<Raw, Error> {
    let manifest = small(entries, MANIFEST, MAX_MANIFEST)?;
    let signature = String::from_utf8(small(entries, SIGNATURE, MAX_SIGNATURE)?)
        .map_err(|_| Error::Trust(TrustError::BadSignature))?;
    Ok(Raw { manifest, signature })
}

/// Reads only the manifest and signature, verifying nothing.
pub fn read_raw<R: Read>(src: R) -> Result<Raw, Error> {
    let mut archive = tar::Archive::new(src);
    raw_of(&mut archive.entries()?)
}

/// Verifies a manifest and its signature.
pub fn verify(raw: Raw, keys: &TrustedKeys) -> Result<Header, Error> {
    let (signer, trusted_comment) = keys.verify(&raw.manifest, &raw.signature)?;
    let manifest = Manifest::parse(&raw.manifest)?;
    Ok(Header { manifest, manifest_bytes: raw.manifest, signature: raw.signature, signer, trusted_comment })
}

/// Bytes the reading side gathers before it hands them to the hashing thread.
const HASH_BATCH: usize = 1 << 20;
/// Batches in flight between the reader and the hashing thread (their buffers are reused).
const HASH_BUFFERS: usize = 3;

/// Counts what passes through and hands it, in batches, to a thread that hashes it: the sha256
/// of one batch is computed while the next is read and written. Applying a bundle on the box
/// (no SHA instructions under emulation, often none on the real CPU's hot path either) spends
/// as long hashing as writing; on one thread with the reading that cost stood in line.
struct Hashing<'r> {
    inner: &'r mut dyn Read,
    batch: Vec<u8>,
    to_hasher: std::sync::mpsc::SyncSender<Vec<u8>>,
    spare: std::sync::mpsc::Receiver<Vec<u8>>,
    count: u64,
}

impl Hashing<'_> {
    /// Sends the gathered bytes to the hasher and takes a spare buffer for the next batch.
    fn flush(&mut self) -> std::io::Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        fn gone<E>(_: E) -> std::io::Error {
            std::io::Error::other("the hashing thread stopped")
        }
        let mut next = self.spare.recv().map_err(gone)?;
        next.clear();
        let full = std::mem::replace(&mut self.batch, next);
        self.to_hasher.send(full).map_err(gone)
    }
}

impl Read for Hashing<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.batch.extend_from_slice(&buf[..n]);
        self.count += n as u64;
        if self.batch.len() >= HASH_BATCH {
            self.flush()?;
        }
        Ok(n)
    }
}

/// Streams `e` through `sink` (and whatever the sink leaves unread to nowhere) while another
/// thread hashes it. Returns the byte count and the sha256 in lower-case hex.
fn hash_through(
    e: &mut dyn Read,
    p: &Payload,
    sink: &mut impl FnMut(&Payload, &mut dyn Read) -> std::io::Result<()>,
) -> Result<(u64, String), Error> {
    let kind = p.kind.as_str();
    let (to_hasher, batches) = std::sync::mpsc::sync_channel::<Vec<u8>>(HASH_BUFFERS);
    let (give_back, spare) = std::sync::mpsc::channel::<Vec<u8>>();
    for _ in 0..HASH_BUFFERS {
        let _ = give_back.send(Vec::with_capacity(HASH_BATCH + (64 << 10)));
    }
    std::thread::scope(|scope| {
        let hasher = scope.spawn(move || {
            let mut hash = Sha256::new();
            for batch in batches {
                hash.update(&batch);
                // The reader may be gone (an error): the buffer is then simply dropped.
                let _ = give_back.send(batch);
            }
            format!("{:x}", hash.finalize())
        });
        let streamed = (|| -> Result<u64, Error> {
            let mut h =
                Hashing { inner: e, batch: Vec::with_capacity(HASH_BATCH + (64 << 10)), to_hasher, spare, count: 0 };
            sink(p, &mut h).map_err(|source| Error::Sink { kind, source })?;
            // Whatever the sink left unread still counts (and must be there).
            std::io::copy(&mut h, &mut std::io::sink())?;
            h.flush()?;
            Ok(h.count)
            // `h` (and its sender) drops here: the hasher finishes the last batch and returns.
        })();
        let digest = hasher.join().map_err(|_| Error::Io(std::io::Error::other("the hashing thread panicked")));
        Ok((streamed?, digest?))
    })
}

/// Reads a whole bundle: verifies the manifest with `keys`, asks `decide` whether to go on,
/// then hands each payload to `sink` as a stream, checking its size and sha256 after the sink
/// returns. An error from anywhere stops the read; what the sink wrote is then not to be used.
pub fn read<R: Read>(
    src: R,
    keys: &TrustedKeys,
    decide: impl FnOnce(&Header) -> Result<(), Error>,
    sink: impl FnMut(&Payload, &mut dyn Read) -> std::io::Result<()>,
) -> Result<Header, Error> {
    let mut archive = tar::Archive::new(src);
    let mut entries = archive.entries()?;
    let header = verify(raw_of(&mut entries)?, keys)?;
    decide(&header)?;
    payloads(&mut entries, &header.manifest, sink)?;
    Ok(header)
}

/// Checks that a bundle's payloads are what its manifest says, without judging the signature:
/// for `nasos bundle --inspect` on the host, which reports the signature on its own. Never
/// the way to apply a bundle.
pub fn check_payloads<R: Read>(src: R) -> Result<Manifest, Error> {
    let mut archive = tar::Archive::new(src);
    let mut entries = archive.entries()?;
    let manifest = Manifest::parse(&raw_of(&mut entries)?.manifest)?;
    payloads(&mut entries, &manifest, |_, _| Ok(()))?;
    Ok(manifest)
}

fn payloads<R: Read>(
    entries: &mut tar::Entries<'_, R>,
    manifest: &Manifest,
    mut sink: impl FnMut(&Payload, &mut dyn Read) -> std::io::Result<()>,
) -> Result<(), Error> {
    for p in &manifest.payloads {
        let kind = p.kind.as_str();
        let mut e = entries.next().ok_or(Error::Missing(kind))??;
        let path = e.path()?.to_string_lossy().into_owned();
        if path != p.kind.entry() || !e.header().entry_type().is_file() {
            return Err(Error::Order { entry: path, kind, want: p.kind.entry() });
        }
        if e.size() != p.size {
            return Err(Error::Size { kind, entry: e.size(), manifest: p.size });
        }
        let (count, got) = hash_through(&mut e, p, &mut sink)?;
        if count != p.size {
            return Err(Error::Truncated { kind, got: count, want: p.size });
        }
        if got != p.sha256 {
            return Err(Error::Digest { kind, got, want: p.sha256.clone() });
        }
    }
    if let Some(Ok(e)) = entries.next() {
        return Err(Error::Extra(e.path().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default()));
    }
    Ok(())
}

impl Kind {
    /// The kinds a sink writes to the root slot, in order, and where in the slot.
    pub fn slot_offset(self, m: &Manifest) -> Option<u64> {
        match self {
            Kind::Uki => None,
            Kind::Root => Some(0),
            Kind::Verity => m.hash_offset().ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Payload;
    use crate::trust::tests::{keypair, sign};
    use crate::writer;

    struct Made {
        bytes: Vec<u8>,
        keys: TrustedKeys,
        manifest: Manifest,
        payloads: Vec<Vec<u8>>,
    }

    fn digest(b: &[u8]) -> String {
        format!("{:x}", Sha256::digest(b))
    }

    /// A small bundle with real signatures: 10 bytes of UKI, 16 KiB of root, 4 KiB of tree.
    fn made(edit: impl FnOnce(&mut Manifest)) -> Made {
        made_sized([10, 16384, 4096], edit)
    }

    fn made_sized(sizes: [usize; 3], edit: impl FnOnce(&mut Manifest)) -> Made {
        let (pk, sk) = keypair();
        let payloads: Vec<Vec<u8>> =
            sizes.iter().enumerate().map(|(i, n)| (0..*n).map(|j| (j * 7 + i) as u8).collect()).collect();
        let mut manifest = crate::manifest::tests::sample();
        for (p, data) in manifest.payloads.iter_mut().zip(&payloads) {
            *p = Payload { kind: p.kind, size: data.len() as u64, sha256: digest(data) };
        }
        edit(&mut manifest);
        let json = manifest.to_json();
        let sig = sign(&sk, &json);
        let bytes = writer::write(Vec::new(), &manifest, &json, &sig, |k| {
            let i = Kind::ORDER.iter().position(|x| *x == k).unwrap_or(0);
            Ok(std::io::Cursor::new(payloads[i].clone()))
        })
        .expect("write");
        Made { bytes, keys: TrustedKeys::parse([pk.as_str()]).expect("keys"), manifest, payloads }
    }

    /// Reads into memory; returns what each payload's sink received.
    fn read_all(bytes: &[u8], keys: &TrustedKeys) -> Result<(Header, Vec<Vec<u8>>), Error> {
        let mut got = Vec::new();
        let h = read(
            bytes,
            keys,
            |_| Ok(()),
            |_, r| {
                let mut v = Vec::new();
                r.read_to_end(&mut v)?;
                got.push(v);
                Ok(())
            },
        )?;
        Ok((h, got))
    }

    #[test]
    fn a_bundle_round_trips_and_its_payloads_stream_in_order() {
        let m = made(|_| {});
        let (h, got) = read_all(&m.bytes, &m.keys).expect("reads");
        assert_eq!(h.manifest, m.manifest);
        assert_eq!(h.signer, m.keys.keys[0].id);
        assert_eq!(got, m.payloads);
        let raw = read_raw(&m.bytes[..]).expect("raw");
        assert_eq!(raw.manifest, m.manifest.to_json());
    }

    /// Payloads of several hashing batches, with a tail that fills none, hash right whether
    /// the sink reads all, part or none of them; a byte flipped in the last batch is caught.
    #[test]
    fn payloads_larger_than_a_hashing_batch_hash_whole_however_the_sink_reads() {
        // Whole pages (a slot's filesystem is), but not whole batches: the last batch is short.
        let root = 3 * HASH_BATCH + 3 * 4096;
        let m = made_sized([10, root, 4096], |m| m.verity = m.verity.replace(":16384", &format!(":{root}")));
        let (_, got) = read_all(&m.bytes, &m.keys).expect("reads all");
        assert_eq!(got, m.payloads);
        for leave in [0usize, 1, HASH_BATCH + 7] {
            let r = read(
                &m.bytes[..],
                &m.keys,
                |_| Ok(()),
                |p, r| {
                    let want = (p.size as usize).saturating_sub(leave) as u64;
                    std::io::copy(&mut r.take(want), &mut std::io::sink()).map(|_| ())
                },
            );
            assert!(r.is_ok(), "leaving {leave} bytes to the reader: {r:?}");
        }
        let root_at = m.bytes.len() - 1024 - 4096 - 512 - root.next_multiple_of(512);
        let mut flipped = m.bytes.clone();
        flipped[root_at + root - 3] ^= 0x40;
        let e = read_all(&flipped, &m.keys).map(|_| ());
        assert!(matches!(e, Err(Error::Digest { kind: "root", .. })), "{e:?}");
    }

    #[test]
    fn nothing_reaches_the_sink_before_the_manifest_is_verified_and_accepted() {
        let m = made(|_| {});
        let (other, _) = keypair();
        let stranger = TrustedKeys::parse([other.as_str()]).expect("keys");
        let mut called = false;
        let e = read(
            &m.bytes[..],
            &stranger,
            |_| Ok(()),
            |_, _| {
                called = true;
                Ok(())
            },
        );
        assert!(matches!(e, Err(Error::Trust(TrustError::Untrusted { .. }))), "{e:?}");
        let e = read(
            &m.bytes[..],
            &m.keys,
            |_| Err(Refusal::Same("0.2.0".into()).into()),
            |_, _| {
                called = true;
                Ok(())
            },
        );
        assert!(matches!(e, Err(Error::Refused(Refusal::Same(_)))), "{e:?}");
        assert!(!called);
    }

    #[test]
    fn a_changed_manifest_fails_its_signature() {
        let m = made(|_| {});
        let mut bytes = m.bytes.clone();
        // The manifest is the first entry's data, right after its 512-byte header.
        let at = 512 + bytes[512..].windows(7).position(|w| w == b"qemu-q3").expect("board");
        bytes[at] = b'Q';
        let e = read_all(&bytes, &m.keys).map(|_| ());
        assert!(matches!(e, Err(Error::Trust(TrustError::Invalid { .. }))), "{e:?}");
    }

    #[test]
    fn a_flipped_payload_byte_and_a_truncated_bundle_are_refused() {
        let m = made(|_| {});
        let root_at = m.bytes.len() - 1024 - 4096 - 512 - 16384;
        let mut flipped = m.bytes.clone();
        flipped[root_at + 100] ^= 1;
        let e = read_all(&flipped, &m.keys).map(|_| ());
        assert!(matches!(e, Err(Error::Digest { kind: "root", .. })), "{e:?}");
        for cut in [root_at + 5000, m.bytes.len() - 1024 - 100, root_at - 512 - 600] {
            let e = read_all(&m.bytes[..cut], &m.keys).map(|_| ());
            assert!(
                matches!(e, Err(Error::Truncated { .. }) | Err(Error::Missing(_)) | Err(Error::Io(_))),
                "cut at {cut}: {e:?}"
            );
        }
    }

    #[test]
    fn payload_sizes_must_match_the_manifest() {
        // A signed manifest that claims a larger root than the bundle's entry holds.
        let m = made(|_| {});
        let (pk, sk) = keypair();
        let mut claims = m.manifest.clone();
        claims.payloads[1].size = 20000;
        claims.verity = claims.verity.replace(":16384", ":20000");
        let json = claims.to_json();
        let sig = sign(&sk, &json);
        let mut b = tar::Builder::new(Vec::new());
        b.append(&writer::header(MANIFEST, json.len() as u64).expect("h"), &json[..]).expect("m");
        b.append(&writer::header(SIGNATURE, sig.len() as u64).expect("h"), sig.as_bytes()).expect("s");
        for (k, data) in Kind::ORDER.iter().zip(&m.payloads) {
            b.append(&writer::header(k.entry(), data.len() as u64).expect("h"), &data[..]).expect("p");
        }
        let bytes = b.into_inner().expect("tar");
        let keys = TrustedKeys::parse([pk.as_str()]).expect("keys");
        let e = read_all(&bytes, &keys).map(|_| ());
        assert!(matches!(e, Err(Error::Size { kind: "root", entry: 16384, manifest: 20000 })), "{e:?}");
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        use proptest::prelude::*;
        let m = made(|_| {});
        proptest!(ProptestConfig::with_cases(200), |(cut in 0usize..m.bytes.len(), at in 0usize..m.bytes.len(), x: u8)| {
            let mut b = m.bytes[..cut].to_vec();
            if at < b.len() { b[at] ^= x; }
            let _ = read_all(&b, &m.keys);
        });
    }
}
