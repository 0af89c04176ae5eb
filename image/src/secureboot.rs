//! UEFI Secure Boot with the builder's own keys: making them (`nasos keygen --secure-boot`),
//! signing systemd-boot and the UKI with the db key (sbsign), and signing the out-of-tree kernel
//! modules with the same key so a kernel in lockdown loads them (Debian's kernel trusts the UEFI
//! db for modules; ../shared/REFERENCE.md).
//!
//! Signatures are reproducible: a module's is CMS without signed attributes (what the kernel's
//! `sign-file` makes: RSA PKCS#1 v1.5 over the digest, no time in it), and sbsign's signing
//! time is pinned to the build's epoch with faketime, so the same inputs and key give the same
//! bytes on any host.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The three keys a Secure Boot machine needs; a box enrolls the db certificate (and its owner's
/// PK and KEK); images are signed with db.
pub const ROLES: [&str; 3] = ["PK", "KEK", "db"];

/// The files `keygen` writes in its directory for a role.
pub fn cert_path(dir: &Path, role: &str) -> PathBuf {
    dir.join(format!("{role}.crt"))
}
pub fn key_path(dir: &Path, role: &str) -> PathBuf {
    dir.join(format!("{role}.key"))
}
/// The owner GUID the variables are enrolled under.
pub fn owner_path(dir: &Path) -> PathBuf {
    dir.join("owner.guid")
}

/// Makes PK, KEK and db (self-signed RSA-2048 X.509, SHA-256, ten years) in `dir`, and an owner
/// GUID. Never overwrites a key.
pub fn keygen(dir: &Path, name: &str) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    for role in ROLES {
        for p in [cert_path(dir, role), key_path(dir, role)] {
            if p.exists() {
                bail!("{} exists: nasos never overwrites a key (move it away first)", p.display());
            }
        }
    }
    for role in ROLES {
        let (crt, key) = (cert_path(dir, role), key_path(dir, role));
        let o = Command::new("openssl")
            .args(["req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "3650"])
            .arg("-subj")
            .arg(format!("/CN={name} Secure Boot {role}/"))
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&crt)
            .output()
            .context("running openssl (package openssl)")?;
        if !o.status.success() {
            bail!("openssl req for {role} failed: {}", String::from_utf8_lossy(&o.stderr));
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
        written.push(crt);
        written.push(key);
    }
    let guid = std::fs::read_to_string("/proc/sys/kernel/random/uuid").context("making the owner GUID")?;
    std::fs::write(owner_path(dir), guid.trim().to_string() + "\n")?;
    written.push(owner_path(dir));
    Ok(written)
}

/// The db certificate a recipe names, as a path (it is relative to the recipe).
pub fn db_cert(recipe: &Path, plan: &nasos_board::Plan) -> Option<PathBuf> {
    let db = plan.image.secure_boot_db.as_ref()?;
    Some(recipe.parent().unwrap_or(Path::new(".")).join(db))
}

/// The db key a build signs with: the certificate the recipe names and its secret key.
#[derive(Debug, Clone)]
pub struct Signer {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Signer {
    /// The certificate's subject, as `modinfo -F signer` and the kernel show it (its CN).
    pub fn subject_cn(&self) -> anyhow::Result<String> {
        let o = Command::new("openssl")
            .args(["x509", "-noout", "-subject", "-nameopt", "multiline"])
            .arg("-in")
            .arg(&self.cert)
            .output()
            .context("running openssl")?;
        if !o.status.success() {
            bail!("{} is not an X.509 certificate: {}", self.cert.display(), String::from_utf8_lossy(&o.stderr));
        }
        let text = String::from_utf8_lossy(&o.stdout);
        text.lines()
            .find_map(|l| {
                l.trim().strip_prefix("commonName").map(|v| v.trim().trim_start_matches('=').trim().to_string())
            })
            .with_context(|| format!("{} has no common name", self.cert.display()))
    }

    /// Checks that the key is the certificate's (a mismatch would sign everything uselessly).
    pub fn check(&self) -> anyhow::Result<()> {
        if !self.key.exists() {
            bail!(
                "the Secure Boot db key {} is not there: this recipe's images are signed with the key of {}; \
                 pass it with --secure-boot-key FILE (a product's key is kept on the release signer); \
                 nothing was built",
                self.key.display(),
                self.cert.display()
            );
        }
        let public = |args: &[&str], file: &Path| -> anyhow::Result<Vec<u8>> {
            let o = Command::new("openssl").args(args).arg(file).output().context("running openssl")?;
            if !o.status.success() {
                bail!("openssl could not read {}: {}", file.display(), String::from_utf8_lossy(&o.stderr));
            }
            Ok(o.stdout)
        };
        let from_cert = public(&["x509", "-noout", "-pubkey", "-in"], &self.cert)?;
        let from_key = public(&["pkey", "-pubout", "-in"], &self.key)?;
        if from_cert != from_key {
            bail!("{} is not the key of the certificate {}", self.key.display(), self.cert.display());
        }
        Ok(())
    }

    /// When the certificate becomes valid (its notBefore), in seconds since the epoch.
    fn not_before(&self) -> anyhow::Result<u64> {
        let o = Command::new("openssl")
            .args(["x509", "-noout", "-startdate", "-dateopt", "iso_8601", "-in"])
            .arg(&self.cert)
            .output()
            .context("running openssl x509 -startdate")?;
        let text = String::from_utf8_lossy(&o.stdout);
        let date = text.trim().strip_prefix("notBefore=").with_context(|| format!("no notBefore in {text:?}"))?;
        let o = Command::new("date").args(["-u", "-d", date, "+%s"]).output().context("running date")?;
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .with_context(|| format!("{} starts at {date:?}, which date cannot read", self.cert.display()))
    }

    /// Signs an EFI binary (systemd-boot, the UKI) in place of `out`, then checks the signature.
    pub fn sign_efi(&self, input: &Path, out: &Path, epoch: u64) -> anyhow::Result<()> {
        // sbsign puts the signing time in the signature: pin it to the build's epoch, or to when
        // the certificate became valid if that is later — the kernel refuses a kexec'd kernel
        // "signed outside of the X.509 validity window" (the firmware does not look).
        // `-f` with an absolute date: libfaketime's frozen clock, not one started at that time.
        let at = epoch.max(self.not_before()?);
        let o = Command::new("faketime")
            .arg("-f")
            .arg(faketime_stamp(at))
            .arg("sbsign")
            .arg("--key")
            .arg(&self.key)
            .arg("--cert")
            .arg(&self.cert)
            .arg("--output")
            .arg(out)
            .arg(input)
            .env("TZ", "UTC")
            .output()
            .context("running faketime sbsign (packages faketime, sbsigntool)")?;
        if !o.status.success() {
            bail!("sbsign {} failed: {}", input.display(), String::from_utf8_lossy(&o.stderr));
        }
        let o = Command::new("sbverify").arg("--cert").arg(&self.cert).arg(out).output().context("running sbverify")?;
        if !o.status.success() {
            bail!("sbverify refused the signed {}: {}", out.display(), String::from_utf8_lossy(&o.stderr));
        }
        Ok(())
    }

    /// Signs an EFI binary that comes signed by someone else (Debian's kernel) for the db only:
    /// the kernel checks a kexec'd kernel's first signature, so the other is removed first.
    pub fn resign_efi(&self, input: &Path, out: &Path, epoch: u64) -> anyhow::Result<()> {
        let bare = out.with_extension("unsigned");
        std::fs::copy(input, &bare).with_context(|| format!("copying {}", input.display()))?;
        // sbattach --remove fails on a binary with no signature: only one that has some is changed.
        let listed = Command::new("sbverify").arg("--list").arg(&bare).output().context("running sbverify --list")?;
        if String::from_utf8_lossy(&listed.stdout).contains("signature 1") {
            let o = Command::new("sbattach").arg("--remove").arg(&bare).output().context("running sbattach")?;
            if !o.status.success() {
                bail!("sbattach --remove {} failed: {}", bare.display(), String::from_utf8_lossy(&o.stderr));
            }
        }
        self.sign_efi(&bare, out, epoch)?;
        std::fs::remove_file(&bare)?;
        Ok(())
    }

    /// A kernel module signed the way the kernel's `sign-file` does: the module, a detached CMS
    /// signature over it (no signed attributes, no certificates), the signature's trailer.
    pub fn sign_module(&self, module: &[u8], scratch: &Path) -> anyhow::Result<Vec<u8>> {
        let input = scratch.join("module.unsigned");
        std::fs::write(&input, module)?;
        let o = Command::new("openssl")
            .args(["cms", "-sign", "-binary", "-noattr", "-nocerts", "-outform", "DER", "-md", "sha256"])
            .arg("-signer")
            .arg(&self.cert)
            .arg("-inkey")
            .arg(&self.key)
            .arg("-in")
            .arg(&input)
            .output()
            .context("running openssl cms")?;
        let _ = std::fs::remove_file(&input);
        if !o.status.success() {
            bail!("openssl cms -sign failed: {}", String::from_utf8_lossy(&o.stderr));
        }
        if is_signed(module) {
            bail!("the module is signed already");
        }
        Ok(append_signature(module, &o.stdout))
    }
}

/// `faketime`'s absolute, frozen time for a Unix epoch (UTC).
fn faketime_stamp(epoch: u64) -> String {
    let days = epoch / 86_400;
    let secs = epoch % 86_400;
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

/// Days since 1970-01-01 to (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The marker the kernel looks for at a signed module's end.
pub const MODULE_SIG_MAGIC: &[u8] = b"~Module signature appended~\n";

/// Whether a module already ends in a signature.
pub fn is_signed(module: &[u8]) -> bool {
    module.ends_with(MODULE_SIG_MAGIC)
}

/// module ‖ signature ‖ struct module_signature ‖ magic. The struct (include/linux/module_signature.h):
/// algo, hash, id_type (2: PKCS#7), signer_len, key_id_len, three pad bytes, then the
/// signature's length, big-endian; for PKCS#7 everything but id_type and the length is zero.
pub fn append_signature(module: &[u8], cms: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(module.len() + cms.len() + 12 + MODULE_SIG_MAGIC.len());
    out.extend_from_slice(module);
    out.extend_from_slice(cms);
    out.extend_from_slice(&[0, 0, 2, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&(cms.len() as u32).to_be_bytes());
    out.extend_from_slice(MODULE_SIG_MAGIC);
    out
}

/// Signs the modules `names` in `from` (uncompressed: see `zfs::prepare`) into `dest`.
pub fn sign_modules(signer: &Signer, from: &Path, names: &[String], dest: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dest)?;
    for name in names {
        let path = from.join(name);
        let raw = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let signed = signer.sign_module(&raw, dest).with_context(|| format!("signing {name}"))?;
        std::fs::write(dest.join(name), signed).with_context(|| format!("writing the signed {name}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trailer_is_the_kernels() {
        let signed = append_signature(b"MODULE", &[0xAA; 300]);
        assert!(is_signed(&signed));
        assert!(!is_signed(b"MODULE"));
        let tail = &signed[signed.len() - MODULE_SIG_MAGIC.len() - 12..signed.len() - MODULE_SIG_MAGIC.len()];
        assert_eq!(tail, &[0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 44]);
        assert_eq!(&signed[..6], b"MODULE");
        assert_eq!(signed.len(), 6 + 300 + 12 + 28);
    }

    #[test]
    fn faketime_stamps_are_utc_dates() {
        assert_eq!(faketime_stamp(0), "1970-01-01 00:00:00");
        assert_eq!(faketime_stamp(1_764_547_200), "2025-12-01 00:00:00");
        assert_eq!(faketime_stamp(951_782_400 + 3661), "2000-02-29 01:01:01");
    }
}
