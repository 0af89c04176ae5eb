//! The product as a customer meets it (recipes/qemu-prod.toml on the twin board, signed for Secure
//! Boot with test keys made for the run and booted with them enrolled): no password in the image
//! and no autologin. The first boot asks for root's password on the serial console with the
//! standard prompts and checks; login then works with it and nothing else; after a reboot no
//! prompt appears and the same password works; a fresh disk asks again. Under Secure Boot the
//! kernel is locked down, the ZFS module is signed for the db key, a loader's command line is
//! ignored, and a UKI changed after signing is refused by the firmware.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use nasos_qemu::{Link, Vm};
use nasos_tests::suite::{Shared, Suite};
use nasos_tests::{build_binaries, nasos, ok, poll, recipe_variant, repo};

static IMAGE: Shared<PathBuf> = Shared::new("build::qemu_prod_image");
static VM: Shared<Vm> = Shared::new("firstboot::the_console_asks_for_root_s_password_once");

/// What the operator chooses at the first boot.
const PASSWORD: &str = "Nasos-first-boot-7391";

fn dir() -> PathBuf {
    repo().join("build/e2e")
}

fn keys() -> PathBuf {
    nasos_tests::secure_boot_test_keys()
}

fn boot(tag: &str) -> Vm {
    boot_disk(&IMAGE.get().join("disk.qcow2"), tag)
}

/// Boots a disk with Secure Boot on and the test keys enrolled, on fresh bays.
fn boot_disk(disk: &std::path::Path, tag: &str) -> Vm {
    let net = dir().join(format!("net-{tag}.sock"));
    let link = Link { port: "roce0".into(), socket: net, listen: true, more: Vec::new() };
    let state = dir().join(format!("vm-{tag}"));
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state).expect("state dir");
    nasos_tests::overlay(disk, &state.join("run.qcow2"));
    nasos_tests::boot_again_with(&dir(), tag, 2048, link, Some(keys()))
}

/// Logs in on the console's getty; returns whether the shell answered.
fn login(vm: &mut Vm, password: &str) {
    vm.wait_for_prompt("login: ", Duration::from_secs(300)).expect("a login prompt");
    vm.send_line("root").expect("user");
    vm.wait_for_prompt("Password: ", Duration::from_secs(60)).expect("a password prompt");
    vm.send_line(password).expect("password");
    // Nothing is typed before the shell prompts: what login is still reading would eat it.
    vm.wait_for_prompt("~# ", Duration::from_secs(120)).expect("a shell prompt after login");
    vm.expect_new_shell();
}

pub fn suite() -> Suite {
    let mut s = Suite::new("prod");
    s.check("build::qemu_prod_image", build_image);
    s.check("firstboot::the_console_asks_for_root_s_password_once", first_boot);
    s.check("firstboot::login_works_with_that_password_and_nothing_else", login_with_it);
    s.check("secureboot::the_kernel_is_locked_down_and_zfs_is_signed_for_the_db_key", locked_down);
    s.check("firstboot::after_a_reboot_no_prompt_and_the_same_password", after_reboot);
    s.check("secureboot::a_loader_command_line_is_ignored", loader_cmdline_ignored);
    s.check("state::a_factory_reset_clears_the_box_and_keeps_the_pools", factory_reset);
    s.check("firstboot::a_fresh_disk_asks_again", fresh_disk);
    s.check("secureboot::a_uki_changed_after_signing_is_refused", changed_uki_refused);
    s.kill_at_end(&VM);
    s
}

fn build_image() {
    build_binaries();
    let db = keys().join("db.crt");
    let recipe = recipe_variant(&dir(), "qemu-prod", "qemu-prod-sb", |r| {
        format!("{r}\n[secure_boot]\ndb = \"{}\"\n", db.display())
    });
    let out = dir().join("qemu-prod");
    let built = nasos(&["build", &recipe.display().to_string(), "--out", &out.display().to_string()]);
    // The firmware's own checker agrees: both EFI binaries verify against the db certificate.
    for efi in [out.join("nasos.efi"), out.join("systemd-bootx64.signed.efi")] {
        let o = Command::new("sbverify").arg("--cert").arg(&db).arg(&efi).output().expect("sbverify");
        assert!(o.status.success(), "{}: {}{}", efi.display(), String::from_utf8_lossy(&o.stdout), built.stderr);
    }
    IMAGE.set(out);
}

/// Secure Boot is on and enforced: the kernel says so and is locked down; the ZFS module it
/// loaded (the pool is imported) carries the db key's signature.
fn locked_down() {
    VM.with(|vm| {
        let sb = ok(vm, "dmesg | grep -i -E 'secure ?boot' | head -3");
        assert!(sb.contains("Secure boot enabled"), "{sb}");
        let lockdown = ok(vm, "cat /sys/kernel/security/lockdown");
        assert!(lockdown.contains("[integrity]") || lockdown.contains("[confidentiality]"), "{lockdown}");
        poll(vm, "nasctl status", "— ready", Duration::from_secs(300));
        let signer = ok(vm, "modinfo -F signer zfs");
        assert_eq!(signer.trim(), "nasos e2e Secure Boot db", "{signer}");
        let loaded = ok(vm, "grep -c '^zfs ' /proc/modules");
        assert_eq!(loaded.trim(), "1", "{loaded}");
        let status = ok(vm, "nasctl status");
        assert!(status.contains("Secure Boot on, kernel locked down (integrity)"), "{status}");
    });
}

/// Mounts the firmware's variables where they are not yet.
const EFIVARFS: &str = "mountpoint -q /sys/firmware/efi/efivars || { modprobe efivarfs; mount -t efivarfs efivarfs /sys/firmware/efi/efivars; }";

/// A loader entry that adds `nasos.init=/bin/sh` to the UKI, booted once through systemd-boot's
/// one-shot variable: systemd-boot boots it (it says which entry it took), and the signed UKI's
/// stub keeps its own command line, so the box comes up as always.
fn loader_cmdline_ignored() {
    VM.with(|vm| {
        let uki = ok(vm, "mkdir -p /tmp/esp && mount /dev/vda1 /tmp/esp && ls /tmp/esp/EFI/Linux/");
        let uki = uki.lines().map(str::trim).find(|l| l.ends_with(".efi")).unwrap_or_else(|| panic!("{uki}")).to_string();
        ok(
            vm,
            &format!(
                "mkdir -p /tmp/esp/loader/entries && printf 'title shell\\nefi /EFI/Linux/{uki}\\noptions console=ttyS0,115200 nasos.init=/bin/sh\\n' \
                 > /tmp/esp/loader/entries/shell.conf && sync && umount /tmp/esp"
            ),
        );
        // LoaderEntryOneShot: attributes (non-volatile, boot and runtime access), then the entry's
        // name in UTF-16LE, NUL-terminated; efivarfs takes a variable in one write.
        ok(vm, EFIVARFS);
        ok(
            vm,
            "{ printf '\\007\\000\\000\\000'; printf 'shell.conf' | sed 's/./&\\n/g' | tr '\\n' '\\000'; printf '\\000\\000'; } \
             > /tmp/oneshot && cat /tmp/oneshot > /sys/firmware/efi/efivars/LoaderEntryOneShot-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f",
        );
        vm.send_line("nasctl reboot").expect("reboot");
        // Only systemd-boot can start an entry that is not one of nasos's UKIs.
        let said = vm.wait_for("reboot: ", Duration::from_secs(120)).expect("nasctl says which reboot");
        assert!(said.contains("reboot: through the firmware; a fast reboot cannot be done: the one-shot entry shell.conf"), "{said}");
        vm.expect_new_shell();
        vm.wait_for("nasinit: started", Duration::from_secs(300)).expect("nasinit starts, not a shell");
        login(vm, PASSWORD);
        ok(vm, EFIVARFS);
        let selected = ok(vm, "tr -d '\\000' < /sys/firmware/efi/efivars/LoaderEntrySelected-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f | tail -c +2; echo");
        assert!(selected.contains("shell.conf"), "systemd-boot did not take the test entry: {selected}");
        let cmdline = ok(vm, "cat /proc/cmdline");
        assert!(!cmdline.contains("nasos.init"), "the loader's command line reached the kernel: {cmdline}");
        assert!(cmdline.contains("nasos.verity"), "{cmdline}");
        poll(vm, "nasctl status", "— ready", Duration::from_secs(300));
        ok(vm, "mkdir -p /tmp/esp && mount /dev/vda1 /tmp/esp && rm /tmp/esp/loader/entries/shell.conf && umount /tmp/esp");
    });
}

/// One byte of the signed UKI's command line changed on the disk: the firmware refuses to run it
/// (and the box does not boot).
fn changed_uki_refused() {
    let disk = IMAGE.get().join("disk.img");
    // The ESP: after the GPT's first MiB, 96 MiB (the factory UKI is its one kernel).
    let mut esp = vec![0u8; 97 << 20];
    std::io::Read::read_exact(&mut std::fs::File::open(&disk).expect("disk.img"), &mut esp).expect("read the ESP");
    let needle = b"loglevel=4 nasos.verity=";
    let found: Vec<usize> =
        esp.windows(needle.len()).enumerate().filter(|(_, w)| w == needle).map(|(i, _)| i).collect();
    assert_eq!(found.len(), 1, "the UKI's command line should be on the ESP once: {found:?}");
    let at = found[0] + "loglevel=".len();
    drop(esp);
    let tampered = dir().join("qemu-prod-tampered.qcow2");
    let st = Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "qcow2"])
        .arg(&disk)
        .arg(&tampered)
        .status()
        .expect("qemu-img");
    assert!(st.success());
    // loglevel=4 → loglevel=7: a harmless-looking change, and not the signed one.
    let st = Command::new("qemu-io")
        .args(["-f", "qcow2", "-c", &format!("write -P 0x37 {at} 1")])
        .arg(&tampered)
        .output()
        .expect("qemu-io");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let mut vm = boot_disk(&tampered, "prod-tampered");
    // systemd-boot asks the firmware to load the UKI, and the firmware's signature check says no.
    let line =
        vm.wait_for("Error loading \\EFI\\Linux\\", Duration::from_secs(300)).expect("the firmware refuses the UKI");
    assert!(line.to_ascii_lowercase().contains("access denied"), "{line}");
    // The firmware then tries its other boot options and gives up; nothing started.
    vm.wait_for("No bootable option", Duration::from_secs(120)).expect("the firmware gives up");
    let booted = vm.console_lines().iter().any(|l| l.contains("EFI stub") || l.contains("nasinit: started"));
    assert!(!booted, "the changed UKI booted");
    vm.kill();
}

fn first_boot() {
    let mut vm = boot("prod");
    vm.wait_for("nasinit: started", Duration::from_secs(240)).expect("nasinit starts");
    vm.wait_for("This box has no root password yet", Duration::from_secs(300)).expect("the first-boot banner");
    // The standard prompts and checks: a retyped password that differs is refused.
    vm.wait_for_prompt("New password: ", Duration::from_secs(60)).expect("passwd asks");
    vm.send_line(PASSWORD).expect("type");
    vm.wait_for_prompt("Retype new password: ", Duration::from_secs(60)).expect("passwd asks again");
    vm.send_line("Something-else-5512").expect("type");
    vm.wait_for("do not match", Duration::from_secs(60)).expect("a mismatch is refused");
    vm.wait_for("The password was not set. Try again.", Duration::from_secs(60)).expect("asked again");
    vm.wait_for_prompt("New password: ", Duration::from_secs(60)).expect("passwd asks");
    vm.send_line(PASSWORD).expect("type");
    vm.wait_for_prompt("Retype new password: ", Duration::from_secs(60)).expect("passwd asks again");
    vm.send_line(PASSWORD).expect("type");
    vm.wait_for("Root's password is set.", Duration::from_secs(60)).expect("kept");
    VM.set(vm);
}

fn login_with_it() {
    VM.with(|vm| {
        // Something else is refused.
        vm.wait_for_prompt("login: ", Duration::from_secs(120)).expect("a login prompt");
        vm.send_line("root").expect("user");
        vm.wait_for_prompt("Password: ", Duration::from_secs(60)).expect("a password prompt");
        vm.send_line("nasos-factory").expect("password");
        vm.wait_for("Login incorrect", Duration::from_secs(60)).expect("a wrong password is refused");
        login(vm, PASSWORD);
        // The pool is made while the operator sets the password: let the first boot finish
        // before the checks below reboot it (a reboot in the middle of pool creation leaves
        // disks that the next boot rightly refuses to create over).
        let status = poll(vm, "nasctl status", "— ready", Duration::from_secs(300));
        assert!(status.contains("qemu-prod 0.1.0 on nasos-prod"), "{status}");
        let kept = ok(vm, "stat -c '%a %U' /var/lib/nasos/credentials/root.hash");
        assert_eq!(kept.trim(), "600 root", "{kept}");
    });
}

fn after_reboot() {
    VM.with(|vm| {
        vm.send_line("nasctl reboot").expect("reboot");
        // Fast under Secure Boot too: the UKI's kernel is signed for the db, which the locked-down
        // kernel trusts for kexec_file_load (the platform keyring).
        let said = vm.wait_for("reboot: ", Duration::from_secs(120)).expect("nasctl says which reboot");
        assert!(said.contains("reboot: fast (kexec) into nasos 0.1.0 (nasos-0.1.0.efi)"), "{said}");
        vm.expect_new_shell();
        vm.wait_for("nasinit: started", Duration::from_secs(300)).expect("nasinit starts again");
        let seen = vm.console_lines().len();
        login(vm, PASSWORD);
        let status = poll(vm, "nasctl status", "— ready", Duration::from_secs(300));
        assert!(status.contains("last boot ended: clean reboot"), "{status}");
        let storage = ok(vm, "nasctl logs storage");
        assert!(storage.contains("tank: imported from its bays"), "the pool was not imported: {storage}");
        let asked = vm.console_lines()[seen..].iter().any(|l| l.contains("no root password yet"));
        assert!(!asked, "the prompt came back after a reboot");
    });
}

/// `nasctl factory-reset` (confirmed by the hostname) clears identity and credentials on the next
/// boot, which asks for a password again; the pool and its data are kept.
fn factory_reset() {
    VM.with(|vm| {
        let before = ok(vm, "cat /etc/machine-id").trim().to_string();
        let refused = vm.run("echo wrong-host | nasctl factory-reset", Duration::from_secs(60)).expect("run");
        assert_ne!(refused.1, 0, "{}", refused.0);
        assert!(refused.0.contains("not confirmed: nothing was changed"), "{}", refused.0);
        vm.send_line("echo nasos-prod | nasctl factory-reset").expect("factory reset");
        vm.expect_new_shell();
        vm.wait_for("nasinit: factory reset: clearing the state partition", Duration::from_secs(300)).expect("cleared");
        vm.wait_for("This box has no root password yet", Duration::from_secs(300)).expect("asks again");
        // Each prompt by its own text: a finished "New password: " line also contains the
        // retype prompt's tail, and a password typed ahead of its prompt is flushed by passwd.
        for prompt in ["New password: ", "Retype new password: "] {
            vm.wait_for_prompt(prompt, Duration::from_secs(60)).expect("passwd asks");
            vm.send_line(PASSWORD).expect("type");
        }
        vm.wait_for("Root's password is set.", Duration::from_secs(60)).expect("kept");
        login(vm, PASSWORD);
        let after = ok(vm, "cat /etc/machine-id").trim().to_string();
        assert_ne!(after, before, "the identity survived a factory reset");
        let status = ok(vm, "nasctl status");
        assert!(status.contains("(made this boot)"), "{status}");
        // Services are still starting when the login prompt comes.
        let storage = poll(vm, "nasctl logs storage", "tank: imported", Duration::from_secs(300));
        assert!(storage.contains("tank: imported from its bays"), "the pool was not kept: {storage}");
    });
}

fn fresh_disk() {
    let mut vm = boot("prod-fresh");
    vm.wait_for("This box has no root password yet", Duration::from_secs(400)).expect("a fresh disk asks again");
    vm.wait_for_prompt("New password: ", Duration::from_secs(60)).expect("passwd asks");
    vm.kill();
}
