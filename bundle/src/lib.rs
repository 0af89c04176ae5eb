//! The upgrade bundle: one streamable tar file holding a signed manifest, then the payloads
//! (README.md). Written by `nasos bundle`, read by the appliance's upgrade agent.

pub mod manifest;
pub mod policy;
pub mod reader;
pub mod trust;
pub mod writer;

pub use manifest::{Kind, Manifest, Payload};
pub use policy::{Refusal, Running};
pub use reader::{Error, Header, read};
pub use trust::{TrustError, TrustedKeys};

/// The tar entry of the manifest, the first in every bundle.
pub const MANIFEST: &str = "manifest.json";
/// The tar entry of the manifest's minisign signature, the second.
pub const SIGNATURE: &str = "manifest.json.minisig";
/// The bundle format this crate writes and reads.
pub const FORMAT: u32 = 1;
/// The conventional file name ending of a bundle.
pub const EXTENSION: &str = "nasos";

/// The largest manifest and signature accepted: a manifest is a few hundred bytes, and a bundle
/// from an untrusted source must not make the reader allocate at will before it is verified.
pub const MAX_MANIFEST: u64 = 64 * 1024;
pub const MAX_SIGNATURE: u64 = 4 * 1024;
