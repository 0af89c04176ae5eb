//! The product as a customer meets it (recipes/qemu-prod.toml on the twin board): no password in
//! the image and no autologin. The first boot asks for root's password on the serial console
//! with the standard prompts and checks; login then works with it and nothing else; after a
//! reboot no prompt appears and the same password works; a fresh disk asks again.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use nasos_qemu::{Link, Vm};
use nasos_tests::suite::{Shared, Suite};
use nasos_tests::{build_binaries, nasos, ok, poll, repo};

static IMAGE: Shared<PathBuf> = Shared::new("build::qemu_prod_image");
static VM: Shared<Vm> = Shared::new("firstboot::the_console_asks_for_root_s_password_once");

/// What the operator chooses at the first boot.
const PASSWORD: &str = "Nasos-first-boot-7391";

fn dir() -> PathBuf {
    repo().join("build/e2e")
}

fn boot(tag: &str) -> Vm {
    let net = dir().join(format!("net-{tag}.sock"));
    let link = Link { port: "roce0".into(), socket: net, listen: true, more: Vec::new() };
    nasos_tests::boot(&dir(), &IMAGE.get().join("disk.qcow2"), tag, 2048, link, |_| {})
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

fn main() -> ExitCode {
    let mut s = Suite::new();
    s.check("build::qemu_prod_image", build_image);
    s.check("firstboot::the_console_asks_for_root_s_password_once", first_boot);
    s.check("firstboot::login_works_with_that_password_and_nothing_else", login_with_it);
    s.check("firstboot::after_a_reboot_no_prompt_and_the_same_password", after_reboot);
    s.check("state::a_factory_reset_clears_the_box_and_keeps_the_pools", factory_reset);
    s.check("firstboot::a_fresh_disk_asks_again", fresh_disk);
    s.kill_at_end(&VM);
    s.run()
}

fn build_image() {
    build_binaries();
    let out = dir().join("qemu-prod");
    nasos(&["build", "recipes/qemu-prod.toml", "--out", &out.display().to_string()]);
    IMAGE.set(out);
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
