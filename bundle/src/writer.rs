//! Writes a bundle: the manifest, its signature, then the payloads from files, as an
//! uncompressed tar with fixed times and owners, so the same inputs give the same bytes.

use std::io::{Read, Write};

use crate::manifest::{Kind, Manifest};
use crate::{MANIFEST, SIGNATURE};

pub(crate) fn header(name: &str, size: u64) -> std::io::Result<tar::Header> {
    let mut h = tar::Header::new_ustar();
    h.set_path(name)?;
    h.set_size(size);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    Ok(h)
}

/// Writes a bundle to `out`. `payload` opens each payload (in [`Kind::ORDER`]), which must be
/// exactly as long as the manifest says.
pub fn write<W: Write, P: Read>(
    out: W,
    manifest: &Manifest,
    manifest_bytes: &[u8],
    signature: &str,
    mut payload: impl FnMut(Kind) -> std::io::Result<P>,
) -> std::io::Result<W> {
    let mut b = tar::Builder::new(out);
    b.append(&header(MANIFEST, manifest_bytes.len() as u64)?, manifest_bytes)?;
    b.append(&header(SIGNATURE, signature.len() as u64)?, signature.as_bytes())?;
    for p in &manifest.payloads {
        let src = payload(p.kind)?;
        b.append(&header(p.kind.entry(), p.size)?, src.take(p.size))?;
    }
    b.into_inner()
}
