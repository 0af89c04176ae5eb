//! The reference the benchmarks compare nasos with: the stock Debian trixie + systemd box that
//! `../shared/bench/reference-systemd/README.md` describes — a minbase trixie with systemd as
//! init, Debian's own units (zfs-import-cache, nfs-kernel-server with `rdma=y`), an admin's
//! oneshot that makes the soft-RoCE device on enp0s2 (10.99.0.1/24), and pool `tank` (2 × 6-wide
//! raidz2 over the 12 emulated NVMe bays) created once on a provisioning boot, exporting
//! `/tank/export`. Built here once (mmdebstrap, the same kernel as the appliance, and ZFS's
//! module built by Debian's zfs-dkms as an admin's `apt install` does: stock, where nasos's
//! build patches out the module's load-time benchmarks) and cached by the hash of its configuration, its outputs checked
//! against the hashes recorded when they were made. Its probe unit prints `REFSYS-SERVING
//! uptime=S` on the console once the pool is imported and nfsd listens on tcp 2049 and rdma
//! 20049, on every boot.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nasos_qemu::Vm;

use crate::{repo, sha256};

/// The reference's address on its network (the appliance's qemu-dev data address is 10.77.0.1).
pub const ADDRESS: &str = "10.99.0.1";
/// What it exports.
pub const EXPORT: &str = "/tank/export";

/// The memory both sides of a benchmark get.
pub const MEMORY: u32 = 2048;
const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";

/// The reference's packages, beside the kernel and its headers (stock initramfs-tools, as an
/// installed system; zfs-dkms builds the module in its postinst).
const PACKAGES: &str = "initramfs-tools,zstd,systemd-sysv,udev,dbus,kmod,e2fsprogs,iproute2,procps,\
                        zfs-dkms,zfsutils-linux,zfs-zed,nfs-kernel-server,rdma-core";

/// The admin's configuration of the stock system (mmdebstrap customize hook; $1 = root, $2 =
/// this bench's guest files).
const CUSTOMIZE: &str = r#"set -eu
R=$1 G=$2
KVER=$(ls "$R/usr/lib/modules")
# zfs-dkms's postinst built the module for the kernel whose headers it found; make sure.
chroot "$R" dkms autoinstall -k "$KVER"
ls "$R/usr/lib/modules/$KVER/updates/dkms/zfs.ko"* >/dev/null
echo refsys > "$R/etc/hostname"
echo '/dev/vda / ext4 errors=remount-ro 0 1' > "$R/etc/fstab"
echo FSTYPE=ext4 > "$R/etc/initramfs-tools/conf.d/root-fstype"
chroot "$R" update-initramfs -u -k "$KVER"
chroot "$R" passwd -d root
mkdir -p "$R/etc/systemd/system/serial-getty@ttyS0.service.d"
printf '[Service]\nExecStart=\nExecStart=-/sbin/agetty --autologin root --noclear --keep-baud 115200 %%I vt220\n' \
  > "$R/etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf"
chroot "$R" systemd-machine-id-setup
[ -s "$R/etc/hostid" ] || chroot "$R" zgenhostid
echo '/tank/export *(rw,sync,no_subtree_check,no_root_squash)' >> "$R/etc/exports"
sed -i 's/^# *rdma=n/rdma=y/; s/^# *rdma-port=20049/rdma-port=20049/' "$R/etc/nfs.conf"
grep -qx 'rdma=y' "$R/etc/nfs.conf" && grep -qx 'rdma-port=20049' "$R/etc/nfs.conf"
cp "$G"/*.service "$R/etc/systemd/system/"
install -m 755 "$G/refsys-provision" "$G/refsys-serving" "$R/usr/local/sbin/"
chroot "$R" systemctl enable rdma-rxe0.service refsys-serving.service nfs-server.service
"#;

/// Files the reference gets: the admin's rxe unit (part of the configuration) and the harness's
/// provisioning boot and serving probe (not part of it).
const GUEST: &[(&str, &str)] = &[
    (
        "rdma-rxe0.service",
        "[Unit]\nDescription=Soft-RoCE device rxe0 on enp0s2\nBindsTo=sys-subsystem-net-devices-enp0s2.device\n\
         After=sys-subsystem-net-devices-enp0s2.device\nBefore=nfs-server.service\n\n[Service]\nType=oneshot\n\
         RemainAfterExit=yes\nExecStart=/usr/sbin/ip link set dev enp0s2 up\n\
         ExecStart=/usr/sbin/ip address add 10.99.0.1/24 dev enp0s2\n\
         ExecStart=/usr/bin/rdma link add rxe0 type rxe netdev enp0s2\nExecStop=/usr/bin/rdma link delete rxe0\n\n\
         [Install]\nWantedBy=multi-user.target\n",
    ),
    (
        "refsys-provision",
        "#!/bin/sh\nset -eu\nudevadm settle\nfor i in $(seq 1 100); do\n  \
         [ \"$(ls /dev/disk/by-id/ | grep -cE '^nvme-QEMU_NVMe_Ctrl_BAY[0-9]+$')\" -ge 12 ] && break; sleep 0.2\ndone\n\
         bay() { for n in \"$@\"; do echo /dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_BAY$n; done; }\n\
         zpool create -f -o ashift=12 tank raidz2 $(bay 01 02 03 04 05 06) raidz2 $(bay 07 08 09 10 11 12)\n\
         zfs create tank/export\necho REFSYS-PROVISIONED > /dev/ttyS0\nsystemctl --no-block poweroff\n",
    ),
    (
        "refsys-provision.service",
        "[Unit]\nDescription=refsys: create pool tank once, then power off\n\
         After=zfs-mount.service zfs-import.target systemd-udev-settle.service\nBefore=nfs-server.service\n\n\
         [Service]\nType=oneshot\nExecStart=/usr/local/sbin/refsys-provision\n",
    ),
    (
        "refsys-serving",
        "#!/bin/sh\nP=/proc/fs/nfsd/portlist\ni=0\n\
         until [ -e /proc/spl/kstat/zfs/tank/state ] && grep -qx 'tcp 2049' $P 2>/dev/null && grep -qx 'rdma 20049' $P; do\n  \
         i=$((i+1)); [ $i -gt 3000 ] && { echo \"REFSYS-TIMEOUT\" > /dev/ttyS0; exit 1; }\n  sleep 0.02\ndone\n\
         read up _ < /proc/uptime\necho \"REFSYS-SERVING uptime=$up\" > /dev/ttyS0\n",
    ),
    (
        "refsys-serving.service",
        "[Unit]\nDescription=refsys: report when pool and NFS (tcp+rdma) are up\nDefaultDependencies=no\n\
         After=nfs-server.service zfs-mount.service zfs-import.target\n\n[Service]\n\
         ExecStart=/usr/local/sbin/refsys-serving\n\n[Install]\nWantedBy=multi-user.target\n",
    ),
];

pub fn sh(cmd: &mut Command, what: &str) {
    let st = cmd.status().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(st.success(), "{what} failed ({st})");
}

/// The kernel release the appliance's lock names (`linux-image-<release>`).
pub fn kernel_release() -> String {
    let lock = std::fs::read_to_string(repo().join("recipes/qemu-dev.toml.lock")).expect("qemu-dev lock");
    lock.lines()
        .filter_map(|l| l.strip_prefix("name = \"linux-image-"))
        .map(|l| l.trim_end_matches('"'))
        .find(|r| r.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .expect("a linux-image-<release> package in the lock")
        .to_string()
}

/// The apt sources the appliance's lock was made from (the release, its updates, its security
/// fixes): the reference is set up from the same archives, as an administrator would.
fn sources() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("recipes/qemu-dev.toml.lock")).expect("qemu-dev lock");
    let lock: toml::Value = toml::from_str(&text).expect("the qemu-dev lock parses");
    lock.get("sources")
        .and_then(|s| s.as_array())
        .expect("the lock's sources")
        .iter()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// Builds the reference image once (cached by the hash of its configuration; the outputs are
/// checked against the hashes recorded with them); returns its directory.
pub fn image(dir: &Path) -> PathBuf {
    let kver = kernel_release();
    let sources = sources();
    let mut config = format!("{kver}\n{}\n{PACKAGES}\n{CUSTOMIZE}", sources.join("\n"));
    for (name, text) in GUEST {
        config.push_str(&format!("{name}\n{text}"));
    }
    let stamp = {
        let p = dir.join("config");
        std::fs::create_dir_all(dir).expect("dir");
        std::fs::write(&p, &config).expect("config");
        sha256(&p)
    };
    let img = dir.join("img");
    let record = img.join(format!("built-{}", &stamp[..16]));
    let outputs = ["rootfs.img", "vmlinuz", "initrd.img"];
    if let Ok(kept) = std::fs::read_to_string(&record) {
        let now: String = outputs.iter().map(|o| format!("{} {o}\n", sha256(&img.join(o)))).collect();
        if now == kept && img.join("provisioned").exists() {
            eprintln!("reference image up to date ({})", img.display());
            return img;
        }
        eprintln!("reference image: a cached output does not match its recorded hash; rebuilding");
    }
    let t = Instant::now();
    let _ = std::fs::remove_dir_all(&img);
    std::fs::create_dir_all(&img).expect("img");
    let guest = dir.join("guest");
    std::fs::create_dir_all(&guest).expect("guest");
    for (name, text) in GUEST {
        std::fs::write(guest.join(name), text).expect("guest file");
    }
    std::fs::write(dir.join("customize.sh"), CUSTOMIZE).expect("customize");
    let root = dir.join("rootfs");
    let _ = std::fs::remove_dir_all(&root);
    let hook = format!("sh {} \"$1\" {}", dir.join("customize.sh").display(), guest.display());
    eprintln!("reference image: mmdebstrap trixie (minbase, systemd, kernel {kver})");
    sh(
        Command::new("mmdebstrap")
            .args(["--variant=minbase", "--quiet"])
            .arg(format!("--include=linux-image-{kver},linux-headers-{kver},{PACKAGES}"))
            .arg(format!("--customize-hook={hook}"))
            .args(["trixie"])
            .arg(&root)
            .args(&sources),
        "mmdebstrap",
    );
    std::fs::copy(root.join(format!("boot/vmlinuz-{kver}")), img.join("vmlinuz")).expect("vmlinuz");
    std::fs::copy(root.join(format!("boot/initrd.img-{kver}")), img.join("initrd.img")).expect("initrd");
    sh(
        Command::new("mke2fs")
            .args(["-q", "-t", "ext4", "-L", "root", "-d"])
            .arg(&root)
            .arg(img.join("rootfs.img"))
            .arg("3G"),
        "mke2fs",
    );
    let _ = std::fs::remove_dir_all(&root);
    for i in 1..=12 {
        std::fs::File::create(img.join(format!("nvme{i:02}.img"))).and_then(|f| f.set_len(4 << 30)).expect("bay");
    }
    eprintln!("reference image built in {:.0}s; provisioning boot (creates pool tank)", t.elapsed().as_secs_f64());
    let mut vm = vm(dir, &img, false, false, "systemd.wants=refsys-provision.service");
    vm.wait_for("REFSYS-PROVISIONED", Duration::from_secs(900)).expect("the provisioning boot");
    vm.wait_exit(Duration::from_secs(300)).expect("the provisioning boot powers off");
    let kept: String = outputs.iter().map(|o| format!("{} {o}\n", sha256(&img.join(o)))).collect();
    std::fs::write(&record, kept).expect("record");
    std::fs::write(img.join("provisioned"), b"").expect("provisioned");
    img
}

/// Boots the reference; `snapshot` keeps its disks as they are; `reboots`: a reboot boots it
/// again (else QEMU exits, as for the one-boot measurements).
pub fn vm(dir: &Path, img: &Path, snapshot: bool, reboots: bool, append: &str) -> Vm {
    let snap = if snapshot { ",snapshot=on" } else { "" };
    let vars = dir.join("OVMF_VARS.fd");
    std::fs::copy(OVMF_VARS, &vars).expect("OVMF vars");
    let sock = dir.join("console.sock");
    let _ = std::fs::remove_file(&sock);
    let mut c = Command::new("qemu-system-x86_64");
    c.args(["-machine", "q35", "-accel", "tcg", "-cpu", "max", "-smp", "1", "-m", &MEMORY.to_string()]);
    c.args(["-nodefaults", "-display", "none", "-no-user-config"]);
    if !reboots {
        c.arg("-no-reboot");
    }
    c.arg("-drive").arg(format!("if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}"));
    c.arg("-drive").arg(format!("if=pflash,format=raw,unit=1,file={}", vars.display()));
    c.arg("-kernel").arg(img.join("vmlinuz")).arg("-initrd").arg(img.join("initrd.img"));
    c.arg("-append").arg(format!("root=/dev/vda ro quiet console=ttyS0 {append}"));
    c.arg("-drive").arg(format!("file={},if=virtio,format=raw{snap}", img.join("rootfs.img").display()));
    c.arg("-netdev").arg(format!("stream,id=n0,server=on,addr.type=unix,addr.path={}", dir.join("net.sock").display()));
    c.args(["-device", "virtio-net-pci,netdev=n0,bus=pcie.0,addr=0x2,mac=52:54:00:12:34:56"]);
    for i in 1..=12 {
        c.arg("-device").arg(format!("pcie-root-port,id=rp{i},bus=pcie.0,chassis={i},addr={:#x}", 3 + i));
        c.arg("-drive")
            .arg(format!("file={},if=none,id=d{i},format=raw{snap}", img.join(format!("nvme{i:02}.img")).display()));
        c.arg("-device").arg(format!("nvme,id=nvme{i},serial=BAY{i:02},drive=d{i},bus=rp{i}"));
    }
    c.arg("-chardev").arg(format!("socket,id=s0,path={},server=on,wait=off", sock.display()));
    c.args(["-serial", "chardev:s0"]);
    let child = c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("qemu");
    Vm::attach(&sock, &dir.join("console.log"), None, Some(child), Duration::from_secs(20)).expect("console")
}
