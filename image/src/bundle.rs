//! Keys and bundles on the host: `nasos keygen` makes a minisign key pair; `nasos bundle`
//! packs a built image's UKI, root filesystem and verity tree behind a signed manifest;
//! `nasos bundle --inspect` says what a bundle holds and whether a recipe's box would trust it.
//! The format itself is `nasos_bundle`'s.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use nasos_board::Plan;
use nasos_bundle::{Kind, Manifest, Payload, TrustedKeys, reader};
use sha2::{Digest, Sha256};

use crate::build::Outputs;
use crate::stage::tmp_path;

/// Writes `DIR/NAME.pub` and `DIR/NAME.key` (0600). `encrypt`: the secret key is encrypted
/// (minisign's scrypt box) with `NASOS_KEY_PASSWORD`, or a password minisign asks for on the
/// terminal; otherwise it is usable as is (development and CI keys).
pub fn keygen(dir: &Path, name: &str, encrypt: bool) -> anyhow::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let (pub_path, key_path) = (dir.join(format!("{name}.pub")), dir.join(format!("{name}.key")));
    for p in [&pub_path, &key_path] {
        if p.exists() {
            bail!("{} exists: nasos never overwrites a key (move it away first)", p.display());
        }
    }
    let kp = if encrypt {
        minisign::KeyPair::generate_encrypted_keypair(std::env::var("NASOS_KEY_PASSWORD").ok())
    } else {
        minisign::KeyPair::generate_unencrypted_keypair()
    }
    .map_err(|e| anyhow::anyhow!("making a key pair: {e}"))?;
    let public = kp.pk.to_box().map_err(|e| anyhow::anyhow!("{e}"))?.to_string();
    let secret =
        kp.sk.to_box(Some(&format!("nasos upgrade signing key {name}"))).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode_0600()
        .open(&key_path)
        .with_context(|| format!("creating {}", key_path.display()))?;
    f.write_all(secret.to_string().as_bytes())?;
    f.sync_all()?;
    std::fs::write(&pub_path, public).with_context(|| format!("writing {}", pub_path.display()))?;
    Ok((pub_path, key_path))
}

trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}

impl Mode0600 for std::fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::mode(self, 0o600)
    }
}

/// Reads a secret key; an encrypted one is opened with `NASOS_KEY_PASSWORD`, else minisign asks
/// on the terminal.
fn secret_key(path: &Path) -> anyhow::Result<minisign::SecretKey> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the secret key {}", path.display()))?;
    let boxed = minisign::SecretKeyBox::from_string(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if let Ok(sk) = boxed.clone().into_unencrypted_secret_key()
        && !sk.is_encrypted()
    {
        return Ok(sk);
    }
    boxed.into_secret_key(std::env::var("NASOS_KEY_PASSWORD").ok()).map_err(|e| {
        anyhow::anyhow!("opening {}: {e} (is it a minisign secret key, and the password right?)", path.display())
    })
}

/// A region of a file, read as one payload.
fn region(path: &Path, start: u64, len: u64) -> std::io::Result<std::io::Take<BufReader<File>>> {
    let mut f = File::open(path)?;
    f.seek(SeekFrom::Start(start))?;
    Ok(BufReader::with_capacity(1 << 20, f).take(len))
}

fn digest(mut r: impl Read) -> std::io::Result<String> {
    let mut h = Sha256::new();
    std::io::copy(&mut r, &mut h)?;
    Ok(format!("{:x}", h.finalize()))
}

/// Packs a built image into a signed bundle at `out` (written under a temporary name, renamed
/// when whole). Returns its manifest.
pub fn bundle(plan: &Plan, built: &Outputs, key: &Path, out: &Path) -> anyhow::Result<Manifest> {
    let sk = secret_key(key)?;
    let root_len = std::fs::metadata(&built.root)?.len();
    let offset = built.verity.hash_offset;
    if offset == 0 || offset >= root_len {
        bail!("{}: its verity tree offset {offset} is not inside it; rebuild with --rebuild", built.root.display());
    }
    let parts = [
        (Kind::Uki, built.uki.clone(), 0, std::fs::metadata(&built.uki)?.len()),
        (Kind::Root, built.root.clone(), 0, offset),
        (Kind::Verity, built.root.clone(), offset, root_len - offset),
    ];
    let mut payloads = Vec::new();
    for (kind, path, start, len) in &parts {
        let sha256 = digest(region(path, *start, *len)?).with_context(|| format!("hashing {}", path.display()))?;
        payloads.push(Payload { kind: *kind, size: *len, sha256 });
    }
    let manifest = Manifest {
        format: nasos_bundle::FORMAT,
        image: plan.image.name.clone(),
        version: plan.image.version.clone(),
        board: plan.image.board.clone(),
        min_version: plan.upgrade.min_version.clone(),
        verity: built.verity.to_arg().trim_start_matches("nasos.verity=").to_string(),
        payloads,
    };
    manifest.check().context("the manifest nasos made")?;
    let json = manifest.to_json();
    let trusted = format!("nasos bundle {} {} for {}", manifest.image, manifest.version, manifest.board);
    let sig = minisign::sign(
        None,
        &sk,
        std::io::Cursor::new(&json),
        Some(&trusted),
        Some("signature of a nasos bundle manifest"),
    )
    .map_err(|e| anyhow::anyhow!("signing the manifest: {e}"))?
    .to_string();
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = tmp_path(out);
    let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let w = nasos_bundle::writer::write(BufWriter::with_capacity(1 << 20, file), &manifest, &json, &sig, |kind| {
        let (_, path, start, len) = parts.iter().find(|p| p.0 == kind).unwrap_or(&parts[0]);
        region(path, *start, *len)
    })
    .with_context(|| format!("writing {}", tmp.display()))?;
    w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::rename(&tmp, out)?;
    Ok(manifest)
}

/// What `--inspect` found.
pub struct Inspection {
    pub manifest: Result<Manifest, String>,
    /// The signature's verdict for the recipe's keys (`None`: no recipe given).
    pub signature: Option<Result<String, String>>,
    /// Whether every payload matched its size and sha256 (`None`: not checked, because the
    /// manifest could not be read).
    pub payloads: Option<Result<(), String>>,
}

/// Reads a bundle's manifest, checks its signature against `keys` (when given) and its
/// payloads against the manifest.
pub fn inspect(file: &Path, keys: Option<&TrustedKeys>) -> anyhow::Result<Inspection> {
    let open = || {
        File::open(file)
            .map(|f| BufReader::with_capacity(1 << 20, f))
            .with_context(|| format!("opening {}", file.display()))
    };
    let raw = reader::read_raw(open()?).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let manifest = Manifest::parse(&raw.manifest).map_err(|e| e.to_string());
    let signature = keys.map(|k| {
        k.verify(&raw.manifest, &raw.signature)
            .map(|(id, comment)| format!("good, by key {id} ({comment})"))
            .map_err(|e| e.to_string())
    });
    let payloads = match &manifest {
        Ok(_) => Some(reader::check_payloads(open()?).map(|_| ()).map_err(|e| e.to_string())),
        Err(_) => None,
    };
    Ok(Inspection { manifest, signature, payloads })
}
