//! Recipe + board → plan.

use super::*;
use crate::board::Board;
use crate::recipe::{Access, ExportClient, Recipe, Squash};
use crate::units::parse_size;
use nasos_layout::paths::EXPORT_ROOT;

use super::services::{
    Features, MODULES, MODULES_DRIVES, MODULES_LATE, MODULES_NET, MODULES_NFS, MODULES_STORAGE, apply_liveness,
    console_service, services,
};

/// Resolves a validated recipe on its board into a plan.
///
/// The recipe must have passed validation: names it refers to exist, sizes parse.
pub fn resolve(r: &Recipe, b: &Board) -> Plan {
    let uses_zfs = !r.pools.is_empty();
    let network = r.fabric.is_some() || !r.network.links.is_empty();
    let rdma_exports = r.nfs.as_ref().is_some_and(|n| n.exports.iter().any(|e| e.rdma));
    let gss = r.nfs.as_ref().is_some_and(|n| n.exports.iter().any(|e| e.security.iter().any(|f| f.kerberos())));
    let port_of = |name: &str| b.ports.iter().find(|p| p.name == name);

    let mut packages: Vec<String> = [
        "linux-image-amd64",
        "kmod",
        "udev",
        "util-linux",
        // mkfs.ext4 and e2fsck for the state partition, made on first boot.
        "e2fsprogs",
        "iproute2",
        "ethtool",
        "nvme-cli",
        "procps",
        "login",
        "passwd",
        // veritysetup: an upgrade reads the written slot back through dm-verity's check.
        "cryptsetup-bin",
        // systemd-boot and the UKI's stub: the boot chain comes from the lock like the rest of
        // the image, not from whichever host builds it.
        "systemd-boot-efi",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if uses_zfs {
        packages.extend(["zfsutils-linux", "zfs-zed"].map(String::from));
    }
    if r.nfs.is_some() {
        packages.push("nfs-kernel-server".into());
    }
    if r.fabric.is_some() {
        packages.extend(["rdma-core", "ibverbs-providers", "ibverbs-utils"].map(String::from));
    }
    if network {
        // nft loads the plan's ruleset (`firewall`) before any link comes up.
        packages.push("nftables".into());
    }
    if !r.replicate.is_empty() {
        // ssh carries the sends to peers.
        packages.push("openssh-client".into());
    }
    if r.peers.iter().any(|p| !p.receive.is_empty()) {
        // sshd for peers (and ssh-keygen, from openssh-client, for the box's key).
        packages.extend(["openssh-server", "openssh-client"].map(String::from));
    }
    packages.extend(b.packages.iter().cloned());
    packages.extend(r.packages.extra.iter().cloned());
    packages.sort();
    packages.dedup();

    let boot_drivers: &[&str] =
        if b.boot.matcher.virtio_serial.is_some() { &["virtio_pci", "virtio_blk"] } else { &["nvme"] };
    let mut initramfs_modules: Vec<String> = boot_drivers.iter().map(|s| s.to_string()).collect();
    // sha256_ssse3 first: dm-verity takes the best sha256 registered when the root's table is
    // made, and without it that is sha256-generic; with it, the CPU's SHA or AVX2 instructions
    // hash every block the boot reads.
    initramfs_modules.extend(["sha256_ssse3", "dm-mod", "dm-verity", "erofs"].map(String::from));
    // Each module lands in the set of the first service that needs it; the base set (`modules`)
    // holds what the board and the box itself need, and every service starts after it.
    let mut sets = ModuleSets::default();
    b.kernel.modules.iter().for_each(|m| sets.push(MODULES, m));
    sets.push(MODULES, &b.watchdog.driver);
    // The ESP is FAT: blessing a boot entry renames a file on it. The upgrade agent loads vfat
    // itself before it mounts the ESP; loaded late, it is ready before the bless, and its 70 ms
    // of a one-vCPU TCG boot's CPU are off the way to serving.
    sets.push(MODULES_LATE, "vfat");
    // The USB host controller is there from power-on, and with no coldplug of every device
    // nothing else would bind it: a stick plugged in later (an upgrade bundle) needs it, and
    // udev loads the stick's own drivers when it appears. Serving does not: it loads late.
    sets.push(MODULES_LATE, "xhci_pci");
    let drives_early = initramfs_modules.iter().any(|m| m == "nvme");
    if uses_zfs {
        // Unless the initramfs has it already (the box boots from NVMe), the drives' driver
        // loads before udevd starts, in a set of its own; first, so that a recipe naming nvme
        // among its modules does not move it behind udevd.
        if !drives_early {
            sets.push(MODULES_DRIVES, "nvme");
        }
        sets.push(MODULES_STORAGE, "zfs");
    }
    for m in &r.kernel.modules {
        sets.push(MODULES, m);
    }
    for link in &r.network.links {
        if let Some(port) = port_of(&link.port) {
            sets.push(MODULES_NET, &port.driver);
        }
        if !link.vlans.is_empty() || r.tenants.iter().any(|t| t.vlans.iter().any(|v| v.link == link.name)) {
            sets.push(MODULES_NET, "8021q");
        }
    }
    if let Some(f) = &r.fabric {
        for l in &f.links {
            if let Some(port) = r.network.links.iter().find(|x| &x.name == l).and_then(|x| port_of(&x.port)) {
                port.rdma.modules().iter().for_each(|m| sets.push(MODULES_NET, m));
            }
        }
        // Userspace verbs and RDMA CM (ibv_devinfo, perftest, rping) are for an operator's
        // diagnosis; nfsd speaks RDMA through the kernel's own. 0.4 s of CPU off the way to serving.
        sets.push(MODULES_LATE, "ib_uverbs");
        sets.push(MODULES_LATE, "rdma_ucm");
    }
    if network {
        sets.push(MODULES_NET, "nf_tables");
        sets.push(MODULES_NET, "nft_ct");
    }
    if r.nfs.is_some() {
        sets.push(MODULES_NFS, "nfsd");
    }
    if rdma_exports {
        sets.push(MODULES_NFS, "rpcrdma");
    }
    if gss {
        // nfsd loads the Kerberos mechanism on a client's first krb5 context; it must be in the
        // image, and loaded before then so the first mount does not wait on it.
        sets.push(MODULES_NFS, "rpcsec_gss_krb5");
    }
    // The bays' driver, for a box without pools (an operator may look at the drives).
    sets.push(MODULES, "nvme");
    let module_sets = sets.into_sets(uses_zfs);
    let modules: Vec<String> = module_sets.iter().flat_map(|s| s.modules.iter().cloned()).collect();
    let mut module_options: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    if uses_zfs {
        let mut zfs: BTreeMap<String, String> = r.zfs.tunables.clone();
        if let Some(arc) = r.zfs.arc_max.as_deref().and_then(parse_size) {
            zfs.insert("zfs_arc_max".into(), arc.to_string());
        }
        if !zfs.is_empty() {
            module_options.insert("zfs".into(), zfs);
        }
    }
    // The jitter entropy RNG's start-up health test took 144 ms of a one-vCPU TCG boot before
    // nasinit. Nothing here asks for it: the kernel's own random pool does not use it, and the
    // DRBG, its one consumer, goes on without it outside FIPS mode (which nasos does not run).
    let mut cmdline = vec![
        format!("console={},{}", b.console.device, b.console.baud),
        "panic=10".to_string(),
        "initcall_blacklist=jent_mod_init".to_string(),
    ];
    cmdline.extend(b.kernel.cmdline.iter().cloned());

    let bays = b.bays.iter().map(|bay| BayPlan { name: bay.name.clone(), matcher: bay.matcher.clone() }).collect();

    let links: Vec<LinkPlan> = r
        .network
        .links
        .iter()
        .filter_map(|l| {
            let port = port_of(&l.port)?;
            Some(LinkPlan {
                name: l.name.clone(),
                port: port.name.clone(),
                matcher: port.matcher.clone(),
                driver: port.driver.clone(),
                speed_mbps: port.speed_mbps,
                mtu: l.mtu,
                addresses: l.addresses.clone(),
                vlans: l
                    .vlans
                    .iter()
                    .map(|v| VlanPlan {
                        name: format!("{}.{}", l.name, v.id),
                        id: v.id,
                        addresses: v.addresses.clone(),
                        tenant: None,
                    })
                    .chain(r.tenants.iter().flat_map(|t| {
                        t.vlans.iter().filter(|v| v.link == l.name).map(|v| VlanPlan {
                            name: format!("{}.{}", l.name, v.id),
                            id: v.id,
                            addresses: v.addresses.clone(),
                            tenant: Some(t.name.clone()),
                        })
                    }))
                    .collect(),
            })
        })
        .collect();

    let fabric = r.fabric.as_ref().map(|f| FabricPlan {
        lossless_priority: clamp_u8(f.lossless_priority),
        pfc_required: f.pfc_required,
        ets_bandwidth: f.ets_bandwidth.as_ref().and_then(|v| {
            let arr: Vec<u8> = v.iter().map(|x| clamp_u8(*x)).collect();
            arr.try_into().ok()
        }),
        dscp: f.dscp.iter().map(|d| DscpPlan { dscp: clamp_u8(d.dscp), priority: clamp_u8(d.priority) }).collect(),
        links: f
            .links
            .iter()
            .filter_map(|name| {
                let port = port_of(&r.network.links.iter().find(|x| &x.name == name)?.port)?;
                Some(FabricLinkPlan {
                    link: name.clone(),
                    rdma: port.rdma,
                    rxe_device: (port.rdma == RdmaKind::SoftRoce).then(|| format!("rxe_{name}")),
                    dcb: if port.dcb { DcbMethod::Dcbnl } else { DcbMethod::Unsupported },
                })
            })
            .collect(),
    });

    let pools = r
        .pools
        .iter()
        .map(|p| PoolPlan {
            name: p.name.clone(),
            create: p.create,
            ashift: p.ashift,
            mountpoint: format!("{EXPORT_ROOT}/{}", p.name),
            vdevs: p.vdevs.iter().map(|v| VdevPlan { kind: v.kind, bays: v.bays.clone() }).collect(),
            spares: p.spares.clone(),
            properties: p.properties.clone(),
            filesystem: {
                let mut fs = p.filesystem.clone();
                if r.snapshots.iter().any(|s| s.dataset == p.name) {
                    fs.entry("snapdir".into()).or_insert_with(|| "visible".into());
                }
                fs
            },
        })
        .collect();

    let snapshots: Vec<SnapshotPlan> = r
        .snapshots
        .iter()
        .map(|p| SnapshotPlan {
            dataset: p.dataset.clone(),
            recursive: p.recursive,
            frequent_minutes: p.frequent_minutes,
            keep: Retention {
                frequently: p.frequently,
                hourly: p.hourly,
                daily: p.daily,
                weekly: p.weekly,
                monthly: p.monthly,
            },
            // Checked by validation.
            hold_seconds: p.hold.as_deref().and_then(crate::units::parse_duration).unwrap_or(0),
        })
        .collect();
    // A dataset that has snapshots lists them in `.zfs/snapshot` for its NFS clients, so a user
    // finds yesterday's file without an operator (the recipe may still say otherwise).
    let snapshotted = |name: &str| {
        snapshots.iter().any(|s| s.dataset == name || (s.recursive && name.starts_with(&format!("{}/", s.dataset))))
    };
    let replication = replication(r, &links);
    let dataset = |name: &str,
                   props: &BTreeMap<String, String>,
                   quota: &Option<String>,
                   reservation: &Option<String>,
                   owner: Option<(u32, u32)>| {
        let mut properties = props.clone();
        if snapshotted(name) {
            properties.entry("snapdir".into()).or_insert_with(|| "visible".into());
        }
        if let Some(q) = quota {
            properties.insert("quota".into(), q.clone());
        }
        if let Some(q) = reservation {
            properties.insert("reservation".into(), q.clone());
        }
        DatasetPlan { name: name.to_string(), mountpoint: format!("{EXPORT_ROOT}/{name}"), properties, owner }
    };
    let mut datasets = r
        .datasets
        .iter()
        .map(|d| dataset(&d.name, &d.properties, &d.quota, &d.reservation, None))
        .chain(r.tenants.iter().map(|t| {
            let owner = match (t.squash, t.anon_uid, t.anon_gid) {
                (Squash::All, Some(u), Some(g)) => Some((u, g)),
                _ => None,
            };
            dataset(&t.dataset, &t.properties, &t.quota, &t.reservation, owner)
        }))
        .collect::<Vec<_>>();
    // Parents before children: a tenant's root is made with its quota before the datasets below
    // it, whichever section declared which.
    datasets.sort_by_key(|d: &DatasetPlan| d.name.matches('/').count());
    let tenants = r
        .tenants
        .iter()
        .map(|t| TenantPlan {
            name: t.name.clone(),
            dataset: t.dataset.clone(),
            networks: t.networks.clone(),
            quota_bytes: t.quota.as_deref().and_then(parse_size),
            reservation_bytes: t.reservation.as_deref().and_then(parse_size),
            squash: match t.squash {
                Squash::Root => "root".into(),
                Squash::All => "all".into(),
            },
            vlans: t.vlans.iter().map(|v| format!("{}.{}", v.link, v.id)).collect(),
        })
        .collect();

    let nfs = r.nfs.as_ref().map(|n| {
        let mut versions = n.versions.clone();
        versions.sort();
        versions.dedup();
        NfsPlan {
            rpcbind: versions.contains(&NfsVersion::V3),
            gss,
            versions,
            threads: n.threads,
            tcp_port: 2049,
            rdma_port: rdma_exports.then(|| u16::try_from(n.rdma_port).unwrap_or(20049)),
            grace_seconds: n.grace_seconds,
            lease_seconds: n.lease_seconds,
            exports: n.exports.iter().map(|e| export(r, e)).collect(),
        }
    });

    let health =
        HealthPlan {
            watchdog_driver: b.watchdog.driver.clone(),
            watchdog_identity: b.watchdog.identity.clone(),
            watchdog_timeout_seconds: r.health.watchdog_timeout_seconds,
            nvme_temperature_warn_celsius: r.health.nvme_temperature_warn_celsius,
            pool_capacity_warn_percent: r.health.pool_capacity_warn_percent,
            tenant_quota_warn_percent: r.health.tenant_quota_warn_percent,
            check_interval_seconds: r.health.check_interval_seconds,
            nvme_spare_warn_percent: r.health.nvme_spare_warn_percent,
            nvme_wear_warn_percent: r.health.nvme_wear_warn_percent,
            cpu_temperature_warn_celsius: r.health.cpu_temperature_warn_celsius,
            fatal_grace_seconds: r.health.fatal_grace_seconds,
            // Checked by validation; a receiver that does not parse cannot reach a plan.
            syslog: r.health.syslog.iter().filter_map(|u| SyslogTarget::parse(u).ok()).collect(),
            metrics: r.health.metrics.as_ref().and_then(|m| {
                m.address.parse::<std::net::IpAddr>().ok().map(|ip| std::net::SocketAddr::new(ip, m.port))
            }),
        };

    let console = console_service(
        r.console.root_login,
        r.console.root_password_hash.is_some(),
        &b.console.device,
        b.console.baud,
    );
    let set_names: Vec<&str> = module_sets.iter().map(|s| s.service.as_str()).collect();
    let features = Features {
        network,
        storage: uses_zfs,
        nfs: r.nfs.is_some(),
        snapshots: !r.snapshots.is_empty(),
        send: !replication.jobs.is_empty(),
        receive: replication.peers.iter().any(|p| !p.receive.is_empty()),
    };
    let mut services = services(&set_names, &features);
    apply_liveness(&mut services, &r.liveness, &r.debug.hang_services);
    services.splice(0..0, console);

    Plan {
        plan_version: PLAN_VERSION,
        image: ImagePlan {
            name: r.image.name.clone(),
            version: r.image.version.clone(),
            hostname: r.image.hostname.clone().unwrap_or_else(|| r.image.name.clone()),
            board: b.board.name.clone(),
            emulated_board: b.board.emulated,
            development: r.image.development,
            size_budget_mib: r.image.size_budget_mib,
            secure_boot_db: r.secure_boot.as_ref().map(|s| s.db.clone()),
        },
        packages,
        kernel: KernelPlan { initramfs_modules, modules, module_sets, module_options, cmdline },
        console: ConsolePlan {
            device: b.console.device.clone(),
            baud: b.console.baud,
            root_login: r.console.root_login,
            root_password_hash: (r.console.root_login == RootLogin::Password)
                .then(|| r.console.root_password_hash.clone())
                .flatten(),
        },
        bays,
        links,
        fabric,
        zfs: ZfsPlan { arc_max_bytes: r.zfs.arc_max.as_deref().and_then(parse_size), tunables: r.zfs.tunables.clone() },
        pools,
        datasets,
        snapshots,
        replication,
        tenants,
        kerberos: r.kerberos.as_ref().map(|k| KerberosPlan {
            realm: k.realm.clone(),
            idmap_domain: k.realm.to_ascii_lowercase(),
            users: k.users.iter().map(|u| (u.name.clone(), u.uid, u.gid)).collect(),
        }),
        nfs,
        health,
        upgrade: UpgradePlan {
            boot_tries: r.upgrade.boot_tries,
            min_version: r.upgrade.min_version.clone(),
            bless_after_seconds: r.upgrade.bless_after_seconds,
            // Filled by `Loaded::plan` from the key files it read.
            trusted_keys: Vec::new(),
        },
        liveness: LivenessPlan {
            ready_deadline_seconds: r.liveness.ready_deadline_seconds,
            failed_boots_before_staying_up: r.liveness.failed_boots_before_staying_up,
        },
        firewall: FirewallPlan {
            extra: r
                .network
                .allow
                .iter()
                .map(|a| FirewallAllowPlan {
                    link: a.link.clone(),
                    proto: match a.proto {
                        crate::recipe::Proto::Tcp => "tcp".into(),
                        crate::recipe::Proto::Udp => "udp".into(),
                    },
                    port: u16::try_from(a.port).unwrap_or(u16::MAX),
                    from: a.from.clone(),
                    why: a.why.clone(),
                })
                .collect(),
        },
        services,
    }
}

/// Peers with the link and address of this box that reach each one, and the jobs. The peers'
/// keys are read beside the recipe (`Loaded::plan` fills them in); validation has checked the
/// references.
/// One export's lines: its clients (a tenant's networks when it names none) and their options.
fn export(r: &Recipe, e: &crate::recipe::Export) -> ExportPlan {
    let tenant = r.tenant_of(&e.dataset);
    let clients: Vec<ExportClient> = match tenant {
        Some(t) if e.clients.is_empty() => t
            .networks
            .iter()
            .map(|n| ExportClient {
                network: n.clone(),
                access: Access::Rw,
                root_squash: true,
                sync: true,
                i_understand: false,
            })
            .collect(),
        _ => e.clients.clone(),
    };
    let clients = clients
        .iter()
        .map(|c| {
            let mut o: Vec<String> = vec![
                match c.access {
                    Access::Rw => "rw",
                    Access::Ro => "ro",
                }
                .into(),
            ];
            o.push(if c.sync { "sync" } else { "async" }.into());
            match tenant {
                // Every user of the tenant's clients, root too, becomes the tenant's account.
                Some(t) if t.squash == Squash::All => {
                    o.push("all_squash".into());
                    o.push(format!("anonuid={}", t.anon_uid.unwrap_or(65534)));
                    o.push(format!("anongid={}", t.anon_gid.unwrap_or(65534)));
                }
                _ => o.push(if c.root_squash { "root_squash" } else { "no_root_squash" }.into()),
            }
            // crossmnt: a snapshot in `.zfs/snapshot` is a mount of its own (ZFS automounts it
            // on first access), and nfsd serves what is mounted below an export only with
            // crossmnt; the datasets below an export are served with its options, as its
            // directory tree.
            o.extend(["no_subtree_check", "crossmnt"].map(String::from));
            o.push(format!("sec={}", e.security.iter().map(|f| f.as_str()).collect::<Vec<_>>().join(":")));
            ExportClientPlan { network: c.network.clone(), options: o }
        })
        .collect();
    ExportPlan {
        dataset: e.dataset.clone(),
        path: format!("{EXPORT_ROOT}/{}", e.dataset),
        tenant: tenant.map(|t| t.name.clone()),
        rdma: e.rdma,
        clients,
    }
}

fn replication(r: &Recipe, links: &[LinkPlan]) -> ReplicationPlan {
    let peers = r
        .peers
        .iter()
        .map(|p| {
            let ip: Option<std::net::IpAddr> = p.address.parse().ok();
            let local = links.iter().find_map(|l| {
                l.addresses.iter().find_map(|a| {
                    let net: ipnet::IpNet = a.parse().ok()?;
                    ip.filter(|ip| net.contains(ip)).map(|_| (l.name.clone(), net.addr().to_string()))
                })
            });
            let (link, local_address) = local.unwrap_or_default();
            PeerPlan {
                name: p.name.clone(),
                address: p.address.clone(),
                key: String::new(),
                link,
                local_address,
                receive: p.receive.clone(),
            }
        })
        .collect();
    let jobs = r
        .replicate
        .iter()
        .map(|j| ReplicationJobPlan {
            dataset: j.dataset.clone(),
            peer: j.to.clone(),
            target: j.target.clone().unwrap_or_else(|| j.dataset.clone()),
            every_minutes: j.every_minutes,
            bandwidth_bytes: j.bandwidth.as_deref().and_then(parse_size),
            lag_alert_seconds: u64::from(j.lag_alert_minutes.unwrap_or(3 * j.every_minutes + 5)) * 60,
        })
        .collect();
    ReplicationPlan { identity: None, peers, jobs }
}

fn clamp_u8(v: u32) -> u8 {
    u8::try_from(v).unwrap_or(u8::MAX)
}

/// Modules by the set that loads them, each module once (in the first set that asked for it).
#[derive(Default)]
struct ModuleSets {
    sets: Vec<(&'static str, Vec<String>)>,
}

impl ModuleSets {
    fn push(&mut self, set: &'static str, module: &str) {
        if self.sets.iter().any(|(_, ms)| ms.iter().any(|m| m == module)) {
            return;
        }
        match self.sets.iter_mut().find(|(s, _)| *s == set) {
            Some((_, ms)) => ms.push(module.to_string()),
            None => self.sets.push((set, vec![module.to_string()])),
        }
    }

    /// The sets in start order; with `pools`, the storage set waits for the bays.
    fn into_sets(self, pools: bool) -> Vec<ModuleSet> {
        let order = [MODULES_DRIVES, MODULES, MODULES_STORAGE, MODULES_NET, MODULES_NFS, MODULES_LATE];
        let mut sets = self.sets;
        sets.sort_by_key(|(s, _)| order.iter().position(|o| o == s));
        sets.into_iter()
            .map(|(service, modules)| {
                let bays = pools && service == MODULES_STORAGE;
                // Every set but the late one is on the way to serving (storage needs zfs, fabric
                // the NIC's and RDMA's modules, nfs nfsd's), so they share the CPU as equals.
                // (Niced, the net and nfs sets finished 10 s after the others, and serving
                // waited.) The late set runs at its service's boot niceness, which ends when the
                // boot does: a niceness of its own kept its modprobes at 19 after that, behind
                // health's and zed's first rounds, and the box's "ready" waited 10-20 s for them.
                ModuleSet { service: service.to_string(), modules, bays }
            })
            .collect()
    }
}
