//! The box's Kerberos keytab: what `nasctl kerberos join FILE` checks and keeps on the state
//! partition, and which service principal the NFS agent accepts tickets for. The keytab format
//! is MIT's (version 0x0502, what kadmin's `ktadd` and AD's `ktpass` write); only the names are
//! read, never the keys.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use nasos_board::plan::KerberosPlan;
use nasos_layout::state::{KEYTAB, State};
use serde::Serialize;

/// One key of a keytab, without the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeytabEntry {
    /// `nfs/box.example.com@EXAMPLE.COM`.
    pub principal: String,
    pub realm: String,
    pub kvno: u32,
    pub enctype: u16,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeytabError {
    #[error("not a keytab (it starts with {0:02x} {1:02x}; a keytab starts with 05 02)")]
    Magic(u8, u8),
    #[error("the keytab ends in the middle of an entry (at byte {0})")]
    Truncated(usize),
    #[error("a name in the keytab is not UTF-8 (at byte {0})")]
    Name(usize),
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], KeytabError> {
        let b: &'a [u8] = self.b;
        let end = self.at.checked_add(n).filter(|e| *e <= b.len()).ok_or(KeytabError::Truncated(self.at))?;
        let s = &b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, KeytabError> {
        let s = self.take(2)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, KeytabError> {
        let s = self.take(4)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn text(&mut self) -> Result<String, KeytabError> {
        let at = self.at;
        let n = usize::from(self.u16()?);
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| KeytabError::Name(at))
    }
}

/// The entries of a keytab (holes, which deleted entries leave, are skipped).
pub fn parse_keytab(b: &[u8]) -> Result<Vec<KeytabEntry>, KeytabError> {
    match b {
        [0x05, 0x02, ..] => {}
        [x, y, ..] => return Err(KeytabError::Magic(*x, *y)),
        _ => return Err(KeytabError::Truncated(0)),
    }
    let mut r = Reader { b, at: 2 };
    let mut out = Vec::new();
    while r.at < b.len() {
        let size = r.u32()? as i32;
        if size < 0 {
            r.take(size.unsigned_abs() as usize)?;
            continue;
        }
        let base = r.at;
        let mut e = Reader { b: r.take(size as usize)?, at: 0 };
        let rebase = |err: KeytabError| match err {
            KeytabError::Truncated(a) => KeytabError::Truncated(base + a),
            KeytabError::Name(a) => KeytabError::Name(base + a),
            other => other,
        };
        let parsed = (|| {
            let n = e.u16()?;
            let realm = e.text()?;
            let parts = (0..n).map(|_| e.text()).collect::<Result<Vec<_>, _>>()?;
            let _name_type = e.u32()?;
            let _timestamp = e.u32()?;
            let vno8 = e.take(1)?[0];
            let enctype = e.u16()?;
            let len = usize::from(e.u16()?);
            e.take(len)?;
            // A 32-bit kvno follows when the entry has room for it (kvno above 255).
            let kvno = if e.b.len() - e.at >= 4 { e.u32()? } else { u32::from(vno8) };
            Ok(KeytabEntry { principal: format!("{}@{realm}", parts.join("/")), realm, kvno, enctype })
        })();
        out.push(parsed.map_err(rebase)?);
    }
    Ok(out)
}

/// The service principal the box accepts NFS tickets for: the keytab's `nfs/…` of the plan's
/// realm, newest key first.
pub fn nfs_principal(entries: &[KeytabEntry], realm: &str) -> Option<String> {
    entries
        .iter()
        .filter(|e| e.realm == realm && e.principal.starts_with("nfs/"))
        .max_by_key(|e| e.kvno)
        .map(|e| e.principal.clone())
}

/// Where the joined keytab lives.
pub fn keytab_path() -> PathBuf {
    State::mounted().path(KEYTAB)
}

/// Checks a keytab for the plan's realm and keeps it on the state partition (written whole,
/// then renamed: a failed join leaves the previous keytab). Returns the principal it serves.
pub fn join(plan: &KerberosPlan, from: &Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(from).with_context(|| format!("reading {}", from.display()))?;
    let entries = parse_keytab(&bytes).with_context(|| from.display().to_string())?;
    let Some(principal) = nfs_principal(&entries, &plan.realm) else {
        let names: Vec<&str> = entries.iter().map(|e| e.principal.as_str()).collect();
        bail!(
            "{} holds no nfs/ principal of {} (it holds: {}); export one with kadmin: ktadd -k FILE nfs/HOSTNAME.DOMAIN",
            from.display(),
            plan.realm,
            if names.is_empty() { "nothing".to_string() } else { names.join(", ") }
        );
    };
    let dest = keytab_path();
    let dir = dest.parent().context("keytab path")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dest.with_extension("tmp");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &dest).with_context(|| format!("keeping {}", dest.display()))?;
    Ok(principal)
}

/// What `nasctl kerberos` shows.
#[derive(Debug, Serialize)]
pub struct KerberosView {
    pub realm: String,
    pub keytab: Option<String>,
    /// The principal NFS accepts tickets for; none until a keytab is joined.
    pub principal: Option<String>,
    pub entries: Vec<KeytabEntry>,
    pub error: Option<String>,
}

pub fn view(plan: &KerberosPlan) -> KerberosView {
    let path = keytab_path();
    let mut v =
        KerberosView { realm: plan.realm.clone(), keytab: None, principal: None, entries: Vec::new(), error: None };
    match std::fs::read(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => v.error = Some(format!("{}: {e}", path.display())),
        Ok(b) => {
            v.keytab = Some(path.display().to_string());
            match parse_keytab(&b) {
                Ok(entries) => {
                    v.principal = nfs_principal(&entries, &plan.realm);
                    v.entries = entries;
                }
                Err(e) => v.error = Some(format!("{}: {e}", path.display())),
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry as MIT's krb5_kt_add_entry writes it.
    fn entry(realm: &str, parts: &[&str], vno8: u8, enctype: u16, kvno32: Option<u32>) -> Vec<u8> {
        let mut e = Vec::new();
        e.extend((parts.len() as u16).to_be_bytes());
        e.extend((realm.len() as u16).to_be_bytes());
        e.extend(realm.as_bytes());
        for p in parts {
            e.extend((p.len() as u16).to_be_bytes());
            e.extend(p.as_bytes());
        }
        e.extend(1u32.to_be_bytes()); // KRB5_NT_PRINCIPAL
        e.extend(1_764_000_000u32.to_be_bytes());
        e.push(vno8);
        e.extend(enctype.to_be_bytes());
        e.extend(32u16.to_be_bytes());
        e.extend([7u8; 32]);
        if let Some(k) = kvno32 {
            e.extend(k.to_be_bytes());
        }
        let mut out = (e.len() as u32).to_be_bytes().to_vec();
        out.extend(e);
        out
    }

    #[test]
    fn a_keytab_gives_its_principals_and_the_nfs_one_is_picked() {
        let mut kt = vec![0x05, 0x02];
        kt.extend(entry("NASOS.TEST", &["host", "box.nasos.test"], 2, 18, None));
        // A hole left by a deleted entry.
        kt.extend((-6i32).to_be_bytes());
        kt.extend([0u8; 6]);
        kt.extend(entry("NASOS.TEST", &["nfs", "box.nasos.test"], 2, 18, Some(2)));
        kt.extend(entry("NASOS.TEST", &["nfs", "box.nasos.test"], 3, 17, Some(300)));
        kt.extend(entry("OTHER.TEST", &["nfs", "box.other.test"], 9, 18, None));
        let e = parse_keytab(&kt).expect("parses");
        assert_eq!(e.len(), 4);
        assert_eq!(e[0].principal, "host/box.nasos.test@NASOS.TEST");
        assert_eq!((e[2].kvno, e[2].enctype), (300, 17));
        assert_eq!(nfs_principal(&e, "NASOS.TEST").as_deref(), Some("nfs/box.nasos.test@NASOS.TEST"));
        assert_eq!(nfs_principal(&e, "ELSEWHERE"), None);
    }

    #[test]
    fn what_is_not_a_keytab_says_so() {
        assert_eq!(parse_keytab(b"\x05\x01rest"), Err(KeytabError::Magic(5, 1)));
        assert_eq!(parse_keytab(b"-----BEGIN"), Err(KeytabError::Magic(b'-', b'-')));
        let mut kt = vec![0x05, 0x02];
        kt.extend(entry("NASOS.TEST", &["nfs", "box"], 1, 18, None));
        kt.truncate(kt.len() - 10);
        assert!(matches!(parse_keytab(&kt), Err(KeytabError::Truncated(_))));
        assert_eq!(parse_keytab(&[0x05, 0x02]), Ok(Vec::new()));
    }
}
