//! Just enough device-mapper (the kernel's `DM_*` ioctls on /dev/mapper/control) to create the
//! read-only dm-verity device for the root. The trixie kernel has no CONFIG_DM_INIT, so the
//! initramfs must do this itself; three ioctls do not warrant libdevmapper in the initramfs.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;

const DM_IOCTL: u64 = 0xfd;
const DM_DEV_CREATE: u64 = 3;
const DM_DEV_SUSPEND: u64 = 6;
const DM_TABLE_LOAD: u64 = 9;
/// sizeof(struct dm_ioctl).
const DM_IOCTL_SIZE: usize = 312;
/// sizeof(struct dm_target_spec).
const TARGET_SPEC_SIZE: usize = 40;
const DM_READONLY_FLAG: u32 = 1 << 0;
const DM_NAME_LEN: usize = 128;

/// _IOWR(0xfd, nr, struct dm_ioctl)
fn request(nr: u64) -> u64 {
    (3 << 30) | ((DM_IOCTL_SIZE as u64) << 16) | (DM_IOCTL << 8) | nr
}

/// A `struct dm_ioctl` header followed by `payload`, as one 8-byte-aligned buffer.
fn message(name: &str, flags: u32, target_count: u32, payload: &[u8]) -> io::Result<Vec<u64>> {
    if name.len() >= DM_NAME_LEN {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "device name too long"));
    }
    let total = DM_IOCTL_SIZE + payload.len();
    let mut bytes = vec![0u8; total.div_ceil(8) * 8];
    // version: the kernel accepts any 4.x.
    bytes[0..4].copy_from_slice(&4u32.to_ne_bytes());
    let size = bytes.len() as u32;
    bytes[12..16].copy_from_slice(&size.to_ne_bytes()); // data_size
    bytes[16..20].copy_from_slice(&(DM_IOCTL_SIZE as u32).to_ne_bytes()); // data_start
    bytes[20..24].copy_from_slice(&target_count.to_ne_bytes());
    bytes[28..32].copy_from_slice(&flags.to_ne_bytes());
    bytes[48..48 + name.len()].copy_from_slice(name.as_bytes());
    bytes[DM_IOCTL_SIZE..total].copy_from_slice(payload);
    let words = bytes.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8]))).collect();
    Ok(words)
}

fn ioctl(nr: u64, buf: &mut [u64]) -> io::Result<()> {
    let control = OpenOptions::new().read(true).write(true).open("/dev/mapper/control")?;
    // SAFETY: `buf` is a properly sized, aligned `struct dm_ioctl` (data_size says how many bytes
    // follow); the kernel reads and writes only within data_size.
    let r = unsafe { nix::libc::ioctl(control.as_raw_fd(), request(nr) as _, buf.as_mut_ptr()) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// One `struct dm_target_spec` with its parameter string.
fn target(start: u64, sectors: u64, kind: &str, params: &str) -> Vec<u8> {
    let mut spec = vec![0u8; TARGET_SPEC_SIZE];
    spec[0..8].copy_from_slice(&start.to_ne_bytes());
    spec[8..16].copy_from_slice(&sectors.to_ne_bytes());
    let kind = kind.as_bytes();
    spec[24..24 + kind.len().min(15)].copy_from_slice(&kind[..kind.len().min(15)]);
    spec.extend_from_slice(params.as_bytes());
    spec.push(0);
    while !spec.len().is_multiple_of(8) {
        spec.push(0);
    }
    // `next`: offset to the next spec, from the start of this one.
    let next = spec.len() as u32;
    spec[20..24].copy_from_slice(&next.to_ne_bytes());
    spec
}

/// The dm-verity table line for a data device that carries its own hash tree after the data.
/// veritysetup puts a one-block superblock at `hash_offset`; the tree starts after it.
pub fn verity_params(device: &str, data_blocks: u64, hash_offset: u64, root_hash: &str, salt: &str) -> String {
    let hash_start_block = hash_offset / 4096 + 1;
    format!("1 {device} {device} 4096 4096 {data_blocks} {hash_start_block} sha256 {root_hash} {salt}")
}

/// Creates a read-only device `name` mapping `sectors` 512-byte sectors with one target, and
/// activates it.
pub fn create(name: &str, sectors: u64, kind: &str, params: &str) -> io::Result<()> {
    ioctl(DM_DEV_CREATE, &mut message(name, 0, 0, &[])?)?;
    ioctl(DM_TABLE_LOAD, &mut message(name, DM_READONLY_FLAG, 1, &target(0, sectors, kind, params))?)?;
    // DEV_SUSPEND without the suspend flag resumes: the loaded table goes live.
    ioctl(DM_DEV_SUSPEND, &mut message(name, 0, 0, &[])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel_headers() {
        // Values from <linux/dm-ioctl.h> as compiled on x86_64.
        assert_eq!(request(DM_DEV_CREATE), 0xc138fd03);
        assert_eq!(request(DM_DEV_SUSPEND), 0xc138fd06);
        assert_eq!(request(DM_TABLE_LOAD), 0xc138fd09);
    }

    #[test]
    fn message_layout() {
        let spec = target(0, 2048, "verity", "1 8:1 8:1 4096 4096 256 256 sha256 ab cd");
        assert_eq!(spec.len() % 8, 0);
        assert_eq!(u32::from_ne_bytes(spec[20..24].try_into().expect("4")) as usize, spec.len());
        assert_eq!(&spec[24..30], b"verity");
        let m = message("root", DM_READONLY_FLAG, 1, &spec).expect("message");
        let bytes: Vec<u8> = m.iter().flat_map(|w| w.to_ne_bytes()).collect();
        assert_eq!(u32::from_ne_bytes(bytes[12..16].try_into().expect("4")) as usize, bytes.len());
        assert_eq!(u32::from_ne_bytes(bytes[16..20].try_into().expect("4")), 312);
        assert_eq!(&bytes[48..52], b"root");
        assert_eq!(&bytes[312 + 24..312 + 30], b"verity");
        assert!(message(&"x".repeat(200), 0, 0, &[]).is_err());
    }

    #[test]
    fn verity_table_line() {
        assert_eq!(verity_params("259:2", 1000, 4096000, "aa", "bb"), "1 259:2 259:2 4096 4096 1000 1001 sha256 aa bb");
    }
}
