//! The module sets each shipped recipe gets: the drives' driver loads before udevd starts, and
//! the storage set replays only the drives' block devices for it; storage waits for its drives'
//! driver and zfs, not for nfsd or the NIC's; the sets serving needs load as equals, and the late
//! set (nothing serving needs) loads after it; zed and the snapshot agent start with the pool,
//! not after serving; a box that boots from NVMe has its drives' driver from the initramfs.

use std::path::Path;

use nasos_board::load_recipe_file;

fn plan(recipe: &str) -> nasos_board::Plan {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes").join(recipe);
    load_recipe_file(&path).unwrap_or_else(|e| panic!("{recipe}: {e:?}")).plan()
}

fn sets(p: &nasos_board::Plan) -> Vec<String> {
    p.kernel.module_sets.iter().map(|s| format!("{}: {} bays={}", s.service, s.modules.join(" "), s.bays)).collect()
}

fn after<'a>(p: &'a nasos_board::Plan, service: &str) -> &'a [String] {
    &p.services.iter().find(|s| s.name == service).unwrap_or_else(|| panic!("no service {service}")).after
}

#[test]
fn storage_starts_once_its_own_drivers_are_in() {
    let p = plan("qemu-dev.toml");
    assert_eq!(
        sets(&p),
        [
            "modules-drives: nvme bays=false",
            "modules: virtio_net virtio_pci i6300esb bays=false",
            "modules-storage: zfs bays=true",
            "modules-net: rdma_rxe nf_tables nft_ct bays=false",
            "modules-nfs: nfsd rpcrdma rpcsec_gss_krb5 bays=false",
            "modules-late: vfat xhci_pci ib_uverbs rdma_ucm bays=false",
        ]
    );
    // udev starts once the drives' driver is in, so it sees none of their controllers' events.
    assert_eq!(after(&p, "modules-drives"), [] as [&str; 0]);
    assert_eq!(after(&p, "udev"), ["modules-drives"]);
    assert_eq!(after(&p, "modules-storage"), ["udev"]);
    assert_eq!(after(&p, "storage"), ["modules", "modules-drives", "modules-storage"]);
    assert_eq!(after(&p, "fabric"), ["modules", "modules-net", "firewall"]);
    assert_eq!(after(&p, "nfs"), ["modules", "modules-nfs", "storage", "fabric"]);
    // The USB controller and the ESP's filesystem load once the box serves, and nothing on the
    // way waits for them.
    assert_eq!(after(&p, "modules-late"), ["udev", "storage", "nfs"]);
    assert!(p.services.iter().all(|s| !s.after.iter().any(|a| a == "modules-late")));
    // Protecting the data does not wait for serving: zed and the snapshot agent start with the
    // pool, whatever becomes of nfs.
    assert_eq!(after(&p, "zed"), ["storage"]);
    assert_eq!(after(&p, "snapshots"), ["storage"]);
    // The members' identities for zed are read once the box serves (the service waits for
    // nasinit's word), but not only if it does.
    assert_eq!(after(&p, "drive-ids"), ["udev", "storage"]);
    // What serving waits for runs at full priority from the start; what it does not yields the
    // CPU while the box boots.
    let nice = |name: &str| p.services.iter().find(|s| s.name == name).map(|s| s.boot_nice);
    for s in [
        "modules-drives",
        "udev",
        "modules",
        "modules-storage",
        "modules-net",
        "modules-nfs",
        "firewall",
        "fabric",
        "storage",
        "nfs",
    ] {
        assert_eq!(nice(s), Some(0), "{s}");
    }
    for s in ["console", "zed", "drive-ids", "snapshots", "replication", "health", "bless", "modules-late"] {
        assert_eq!(nice(s), Some(19), "{s}");
    }
    // Every module the image keeps is in exactly one set.
    let flat: Vec<&String> = p.kernel.module_sets.iter().flat_map(|s| &s.modules).collect();
    assert_eq!(flat, p.kernel.modules.iter().collect::<Vec<_>>());
}

#[test]
fn a_box_booting_from_nvme_replays_its_drives_events() {
    let p = plan("ts-h1290fx.toml");
    let storage = p.kernel.module_sets.iter().find(|s| s.service == "modules-storage").expect("storage set");
    assert!(storage.bays, "{:?}", sets(&p));
    // The initramfs loaded the driver (the root is on NVMe): no set of its own, and udev waits
    // for nothing.
    assert!(p.services.iter().all(|s| s.name != "modules-drives"), "{:?}", sets(&p));
    assert!(after(&p, "udev").is_empty());
}

#[test]
fn a_box_without_pools_waits_for_no_bays() {
    let p = plan("qemu-client.toml");
    assert!(p.kernel.module_sets.iter().all(|s| !s.bays), "{:?}", sets(&p));
    assert!(p.services.iter().all(|s| s.name != "modules-storage" && s.name != "modules-drives"));
}

#[test]
fn a_recipe_naming_the_drives_driver_does_not_move_it_behind_udev() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/qemu-dev.toml");
    let text = std::fs::read_to_string(&path).expect("qemu-dev.toml") + "\n[kernel]\nmodules = [\"nvme\"]\n";
    // Named beside the recipe: its key files are found relative to it.
    let file = nasos_board::SourceFile::new(path.with_file_name("qemu-dev+nvme.toml").display().to_string(), text);
    let p = nasos_board::load_recipe(&file).unwrap_or_else(|e| panic!("{e:?}")).plan();
    let s = sets(&p);
    assert_eq!(s.first().map(String::as_str), Some("modules-drives: nvme bays=false"), "{s:?}");
    assert_eq!(p.kernel.modules.iter().filter(|m| *m == "nvme").count(), 1, "{s:?}");
}
