//! nasos-image: everything `nasos` does, as a library (the binary only parses arguments and
//! prints): recipe → plan → rootfs → verified root + initramfs → UKI → A/B disk; flashing; booting
//! on the emulated twin board; signed upgrade bundles.

pub mod archive;
pub mod build;
pub mod bundle;
pub mod disk;
pub mod flash;
pub mod host;
pub mod initramfs;
pub mod lock;
pub mod progress;
pub mod root;
pub mod rootfs;
pub mod sbom;
pub mod secureboot;
pub mod stage;
pub mod uki;
pub mod userns;
pub mod vm;
pub mod zfs;
