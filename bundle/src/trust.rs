//! The keys a box trusts and the check of a manifest's signature. Keys and signatures are
//! minisign's (ed25519), so standard tools make and check them; the check itself is
//! `minisign-verify`'s. Key ids are decoded here only to say which key signed a bundle.

use base64::Engine;
use minisign_verify::{PublicKey, Signature};

/// A public key as a recipe's key file holds it (minisign's `.pub` format), with its id.
#[derive(Debug, Clone)]
pub struct TrustedKey {
    /// The key id as minisign prints it (16 upper-case hex digits).
    pub id: String,
    key: PublicKey,
}

#[derive(Debug, Clone, Default)]
pub struct TrustedKeys {
    pub keys: Vec<TrustedKey>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TrustError {
    #[error("not a minisign public key (expected an `untrusted comment:` line and a base64 key line)")]
    BadKey,
    #[error("the signature is not a minisign signature")]
    BadSignature,
    #[error("this box trusts no upgrade keys (the recipe's [upgrade] trusted_keys is empty), so it takes no bundle")]
    NoKeys,
    #[error("the bundle is signed by key {signer}, which this box does not trust (it trusts {trusted})")]
    Untrusted { signer: String, trusted: String },
    #[error(
        "the manifest's signature does not verify with key {signer}: the manifest was changed after signing, or the signature is forged"
    )]
    Invalid { signer: String },
}

/// The key id in a minisign key or signature line: bytes 2..10 of its base64, little-endian,
/// printed as minisign does.
fn key_id(base64_line: &str) -> Option<String> {
    let raw = base64::engine::general_purpose::STANDARD.decode(base64_line.trim()).ok()?;
    let id: [u8; 8] = raw.get(2..10)?.try_into().ok()?;
    Some(format!("{:016X}", u64::from_le_bytes(id)))
}

/// The base64 line of a minisign file: the first line that is not a comment.
fn key_line(text: &str) -> Option<&str> {
    text.lines().map(str::trim).find(|l| !l.is_empty() && !l.contains("comment:"))
}

impl TrustedKey {
    /// Parses a `.pub` file's text (or its base64 line alone).
    pub fn parse(text: &str) -> Result<TrustedKey, TrustError> {
        let line = key_line(text).ok_or(TrustError::BadKey)?;
        let key = PublicKey::from_base64(line).map_err(|_| TrustError::BadKey)?;
        let id = key_id(line).ok_or(TrustError::BadKey)?;
        Ok(TrustedKey { id, key })
    }
}

impl TrustedKeys {
    pub fn parse<'a>(texts: impl IntoIterator<Item = &'a str>) -> Result<TrustedKeys, TrustError> {
        Ok(TrustedKeys { keys: texts.into_iter().map(TrustedKey::parse).collect::<Result<_, _>>()? })
    }

    /// Checks `signature` (a `.minisig` file's text) over `data`; returns the id of the key that
    /// signed it and the signature's trusted comment.
    pub fn verify(&self, data: &[u8], signature: &str) -> Result<(String, String), TrustError> {
        let sig = Signature::decode(signature).map_err(|_| TrustError::BadSignature)?;
        let signer = signature
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.contains("comment:"))
            .and_then(key_id)
            .ok_or(TrustError::BadSignature)?;
        if self.keys.is_empty() {
            return Err(TrustError::NoKeys);
        }
        let Some(k) = self.keys.iter().find(|k| k.id == signer) else {
            let trusted = self.keys.iter().map(|k| k.id.as_str()).collect::<Vec<_>>().join(", ");
            return Err(TrustError::Untrusted { signer, trusted });
        };
        k.key.verify(data, &sig, false).map_err(|_| TrustError::Invalid { signer: signer.clone() })?;
        Ok((signer, sig.trusted_comment().to_string()))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A key pair made by the `minisign` crate (the host's signer), as files hold them.
    pub(crate) fn keypair() -> (String, minisign::SecretKey) {
        let kp = minisign::KeyPair::generate_unencrypted_keypair().expect("keygen");
        (kp.pk.to_box().expect("pk box").to_string(), kp.sk)
    }

    pub(crate) fn sign(sk: &minisign::SecretKey, data: &[u8]) -> String {
        minisign::sign(None, sk, std::io::Cursor::new(data), Some("nasos test"), None).expect("sign").to_string()
    }

    #[test]
    fn a_signature_is_checked_against_the_trusted_keys() {
        let (pk, sk) = keypair();
        let (other_pk, other_sk) = keypair();
        let trusted = TrustedKeys::parse([pk.as_str()]).expect("keys");
        let id = trusted.keys[0].id.clone();
        assert_eq!(id.len(), 16);
        let sig = sign(&sk, b"manifest");
        let (signer, comment) = trusted.verify(b"manifest", &sig).expect("verifies");
        assert_eq!((signer.as_str(), comment.as_str()), (id.as_str(), "nasos test"));
        // A changed manifest.
        assert_eq!(trusted.verify(b"manifesT", &sig), Err(TrustError::Invalid { signer: id.clone() }));
        // Another key.
        let theirs = sign(&other_sk, b"manifest");
        let other_id = TrustedKey::parse(&other_pk).expect("key").id;
        assert_eq!(
            trusted.verify(b"manifest", &theirs),
            Err(TrustError::Untrusted { signer: other_id, trusted: id.clone() })
        );
        assert_eq!(TrustedKeys::default().verify(b"manifest", &sig), Err(TrustError::NoKeys));
        assert_eq!(trusted.verify(b"manifest", "garbage"), Err(TrustError::BadSignature));
        assert!(matches!(TrustedKey::parse("untrusted comment: x\nnot base64!"), Err(TrustError::BadKey)));
    }
}
