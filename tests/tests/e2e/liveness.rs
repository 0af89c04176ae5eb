//! PID 1 owns liveness: an appliance whose storage never finishes (a development image built with
//! `[debug] hang_services = ["storage"]`) misses its boot deadline, says what it waits for and
//! reboots; after the guard's count of such boots in a row it stays up, not ready, and says why.

use std::path::PathBuf;
use std::time::Duration;

use nasos_qemu::{Link, Vm};
use nasos_tests::suite::{Shared, Suite};
use nasos_tests::{build_binaries, nasos, ok, repo};

static IMAGE: Shared<PathBuf> = Shared::new("build::an_image_whose_storage_hangs");
static VM: Shared<Vm> = Shared::new("deadline::a_boot_that_misses_it_reboots");

fn dir() -> PathBuf {
    repo().join("build/e2e")
}

pub fn suite() -> Suite {
    let mut s = Suite::new("liveness");
    s.check("build::an_image_whose_storage_hangs", build_image);
    s.check("deadline::a_boot_that_misses_it_reboots", first_miss);
    s.check("deadline::after_the_guards_count_the_box_stays_up_and_says_why", stays_up);
    s.kill_at_end(&VM);
    s
}

fn build_image() {
    build_binaries();
    let path = nasos_tests::recipe_variant(&dir(), "qemu-dev", "qemu-hang", |r| {
        r.replace("name = \"qemu-dev\"", "name = \"qemu-hang\"")
            + "\n[liveness]\nready_deadline_seconds = 45\nfailed_boots_before_staying_up = 2\n"
            + "\n[debug]\nhang_services = [\"storage\"]\n"
    });
    let out = dir().join("qemu-hang");
    nasos(&["build", &path.display().to_string(), "--out", &out.display().to_string()]);
    IMAGE.set(out);
}

fn first_miss() {
    let net = dir().join("net-hang.sock");
    let link = Link { port: "roce0".into(), socket: net, listen: true, more: Vec::new() };
    let mut vm = nasos_tests::boot(&dir(), &IMAGE.get().join("disk.qcow2"), "hang", 2048, link, |_| {});
    vm.wait_for("nasinit: started", Duration::from_secs(240)).expect("nasinit starts");
    let missed =
        vm.wait_for("nasinit: missed the boot deadline (45s)", Duration::from_secs(300)).expect("the deadline");
    assert!(missed.contains("not ready: storage (starting"), "{missed}");
    let reboot = vm.wait_for("nasinit: rebooting", Duration::from_secs(30)).expect("a reboot");
    assert!(reboot.contains("(1 of 2 in a row)"), "{reboot}");
    vm.expect_new_shell();
    vm.wait_for("nasinit: started", Duration::from_secs(300)).expect("the next boot");
    let said = vm.wait_for("nasinit: state on ", Duration::from_secs(60)).expect("the state partition");
    assert!(said.ends_with("the last boot ended: missed its boot deadline, rebooted by nasinit"), "{said}");
    VM.set(vm);
}

fn stays_up() {
    VM.with(|vm| {
        let why = vm.wait_for("boots in a row missed their 45s deadline", Duration::from_secs(300)).expect("the guard");
        assert!(
            why.contains("2 boots in a row missed their 45s deadline; staying up instead of rebooting again"),
            "{why}"
        );
        assert!(vm.wait_for("nasinit: started", Duration::from_secs(30)).is_err(), "it rebooted again");
        vm.wait_for_login(Duration::from_secs(30)).ok();
        let status = ok(vm, "nasctl status --json");
        let status = nasos_tests::console_json(&status);
        assert_ne!(status["state"], "ready", "{status}");
        assert!(status["why_not_ready"].as_str().is_some_and(|w| w.contains("staying up")), "{status}");
        let shown = ok(vm, "nasctl status");
        assert!(shown.contains("NOT READY 2 boots in a row"), "{shown}");
    });
}
