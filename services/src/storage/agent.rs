//! The storage agent. up: imports each pool of the plan by its bay paths, or creates it when the
//! recipe allows and every member disk is blank; then makes datasets match the plan, changing
//! only what differs. nasos-storage export: exports the pools (the shutdown path).

use std::time::Duration;

use super::{DiskContent, importable_names, may_create};
use crate::{Tool, plan, run, say};
use anyhow::Context;
use nasos_board::plan::{BayPlan, PoolPlan};
use nasos_board::recipe::CreatePolicy;
use nasos_exec::blkid;
use nasos_layout::agents;
use nasos_layout::paths::{self, BAY_DIR, NASINIT};

/// Creating or importing a pool of many disks can take minutes on a loaded box; longer than
/// this, something is stuck.
const POOL_TIMEOUT: Duration = Duration::from_secs(600);

/// Whether the pool is imported, from the kstats ZFS keeps for each imported pool: no zpool
/// process (about 0.2 s of a one-vCPU TCG boot, twice on the way to serving).
fn imported(pool: &str) -> bool {
    std::path::Path::new(KSTATS).join(pool).join("state").is_file()
}

/// ZFS's kstats: a folder per imported pool, with its `state`.
const KSTATS: &str = "/proc/spl/kstat/zfs";

pub fn up() -> anyhow::Result<()> {
    let plan = plan()?;
    // The ARC cap and tunables are module options: modprobe applied them when zfs loaded.
    if let Some(options) = plan.kernel.module_options.get("zfs") {
        check_tunables(options);
    }
    // A pool imported before this run (a restart of the service) may have datasets unmounted
    // since; one this run imported or made has just mounted them.
    let mut mount_all = false;
    let imports: anyhow::Result<()> = plan.pools.iter().try_for_each(|pool| {
        mount_all |= ensure_pool(pool, &plan.bays)?;
        Ok(())
    });
    // The imports no longer wait on udev: drives (hot-plugged ones, a new pool's) get udev's full
    // rules from now on, blkid's probe included. Done or failed, the attempt is over. The members
    // themselves are probed once the box serves (`probe`).
    let flag = std::path::Path::new(paths::IMPORT_DONE);
    if !flag.exists() {
        let made = flag.parent().map_or(Ok(()), std::fs::create_dir_all).and_then(|()| std::fs::write(flag, b""));
        if let Err(e) = made {
            say(format!("cannot create {}: {e}; udev keeps skipping blkid for new drives", flag.display()));
        }
    }
    imports?;
    // Every filesystem with the properties the plan sets, read in one `zfs get`: each zfs
    // process costs about 0.15 s on a one-vCPU TCG boot, and this is on the way to serving.
    let mut props: Vec<&str> = plan.datasets.iter().flat_map(|d| d.properties.keys().map(String::as_str)).collect();
    props.sort_unstable();
    props.dedup();
    if props.is_empty() {
        props.push("type");
    }
    let now = if plan.datasets.is_empty() { None } else { Some(nasos_zfs::dataset_properties(&props, &[])?) };
    for ds in &plan.datasets {
        let Some(current) = now.as_ref().and_then(|n| n.datasets.get(&ds.name)) else {
            let mut args = vec!["create".to_string(), "-p".to_string()];
            for (k, v) in &ds.properties {
                args.push("-o".into());
                args.push(format!("{k}={v}"));
            }
            args.push(ds.name.clone());
            run("zfs", &args.iter().map(String::as_str).collect::<Vec<_>>())?;
            mount_all = true;
            // Only when made: the owner is the operator's to change afterwards.
            if let Some((uid, gid)) = ds.owner {
                std::os::unix::fs::chown(&ds.mountpoint, Some(uid), Some(gid))
                    .with_context(|| format!("giving {} to {uid}:{gid}", ds.mountpoint))?;
                say(format!("{}: created, owned by {uid}:{gid}", ds.name));
            } else {
                say(format!("{}: created", ds.name));
            }
            continue;
        };
        let mut changed = Vec::new();
        for (k, v) in &ds.properties {
            let now = current.value(k).map(nasos_zfs::Value::text).unwrap_or_default();
            if now != *v && !same_size(&now, v) {
                run("zfs", &["set", &format!("{k}={v}"), &ds.name])?;
                changed.push(format!("{k} {now} → {v}"));
            }
        }
        mount_all |= !changed.is_empty();
        say(format!("{}: {}", ds.name, if changed.is_empty() { "as planned".to_string() } else { changed.join(", ") }));
    }
    // A made or changed dataset (a new mountpoint) mounts now.
    if mount_all {
        let _ = run("zfs", &["mount", "-a"]);
    }
    // How the pools stand is said by `probe`, once the box serves: a `zpool status` here cost
    // about 0.2 s of a one-vCPU TCG boot that nfsd's start waited for.
    Ok(())
}

/// Says how each pool stands, from `zpool status -j`.
fn report() -> anyhow::Result<()> {
    let status = nasos_zfs::status(None)?;
    for pool in status.pools.values() {
        let members = nasos_zfs::summary::members(pool);
        let bad: Vec<String> = members
            .iter()
            .filter(|m| m.state != "ONLINE" || m.errors > 0)
            .map(|m| format!("{} {} ({} errors)", m.disk, m.state, m.errors))
            .collect();
        say(format!(
            "{}: {}, {} disks{}",
            pool.name,
            pool.state,
            members.len(),
            if bad.is_empty() { String::new() } else { format!("; {}", bad.join(", ")) }
        ));
    }
    Ok(())
}

/// Says whether the running ZFS has the module options the plan gave modprobe; a difference
/// (a parameter ZFS clamped, or one this ZFS does not have) is reported, not fatal.
fn check_tunables(options: &std::collections::BTreeMap<String, String>) {
    let mut differ = Vec::new();
    for (name, want) in options {
        let path = format!("/sys/module/zfs/parameters/{name}");
        match std::fs::read_to_string(&path) {
            Ok(now) if same_value(now.trim(), want) => {}
            Ok(now) => differ.push(format!("{name} is {} (planned {want})", now.trim())),
            Err(_) => differ.push(format!("{name} does not exist in this ZFS (planned {want})")),
        }
    }
    if differ.is_empty() {
        say(format!(
            "zfs tunables as planned: {}",
            options.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
        ));
    } else {
        say(format!("zfs tunables differ from the plan: {}", differ.join("; ")));
    }
}

/// Numbers compare as numbers ("05" is 5), anything else as text.
fn same_value(now: &str, want: &str) -> bool {
    match (now.parse::<i128>(), want.parse::<i128>()) {
        (Ok(a), Ok(b)) => a == b,
        _ => now == want,
    }
}

/// `zfs get -p` prints sizes in bytes; the plan may say "2G".
fn same_size(now: &str, want: &str) -> bool {
    nasos_board::units::parse_size(want).is_some_and(|w| now.parse::<u64>().ok() == Some(w))
}

/// Imports or creates the pool; true when it was imported already (this run mounted nothing).
fn ensure_pool(pool: &PoolPlan, bays: &[BayPlan]) -> anyhow::Result<bool> {
    if imported(&pool.name) {
        say(format!("{}: already imported", pool.name));
        return Ok(true);
    }
    // First from the bays' first partitions, where every pool this box made keeps its data:
    // libzfs then reads the labels of 12 devices, not of every disk and partition the scan of
    // the bays' folder finds. Every bay, not only the pool's: a drive moved to another bay is
    // still found. A pool that is not there (one made elsewhere, on other partitions) gets the
    // whole scan. The import mounts the pool's datasets itself: a second process (`zfs mount
    // -a`) cost about 0.8 s more on a one-vCPU TCG boot.
    let parts = first_partitions(bays, |p| std::path::Path::new(p).exists());
    let mut result = import_by_bay(&parts, &[&pool.name]).run();
    if result.is_err() && !imported(&pool.name) && !parts.is_empty() {
        result = import_by_bay(&[], &[&pool.name]).run();
    }
    match result {
        Ok(_) => {
            say(format!("{}: imported from its bays", pool.name));
            return Ok(false);
        }
        // Imported, but a dataset did not mount (zpool said which): once more, as before.
        Err(e) if imported(&pool.name) => {
            say(format!("{}: imported from its bays, not every dataset mounted: {e:#}", pool.name));
            let _ = run("zfs", &["mount", "-a"]);
            return Ok(false);
        }
        Err(e) => {
            // A pool that is on the bays but will not import is never created over: say why
            // and what the operator can do, and leave the disks alone. "No such pool" is the
            // one answer that means it is not there; anything else is confirmed by a scan.
            let absent = format!("{e:#}").contains("no such pool available")
                || !importable_names(&import_by_bay(&[], &[]).run().unwrap_or_default())
                    .iter()
                    .any(|n| n == &pool.name);
            if !absent {
                anyhow::bail!(
                    "pool {} is on its bays but did not import: {e:#}. Nothing was changed. If these disks \
                     come from another box that is gone, import it once by hand: \
                     zpool import -f -d {BAY_DIR} {}",
                    pool.name,
                    pool.name
                );
            }
        }
    }
    if pool.create == CreatePolicy::ImportOnly {
        anyhow::bail!("pool {} is not found on its bays and the recipe says import-only", pool.name);
    }
    let members: Vec<&String> = pool.member_bays().collect();
    let disks: Vec<(String, DiskContent)> = members.iter().map(|b| ((*b).clone(), content(b))).collect();
    may_create(&pool.name, &disks).map_err(anyhow::Error::msg)?;
    let mut args: Vec<String> = vec!["create".into(), "-o".into(), format!("ashift={}", pool.ashift)];
    for (k, v) in &pool.properties {
        args.extend(["-o".into(), format!("{k}={v}")]);
    }
    for (k, v) in &pool.filesystem {
        args.extend(["-O".into(), format!("{k}={v}")]);
    }
    args.extend(["-m".into(), pool.mountpoint.clone(), pool.name.clone()]);
    // Created on the kernel names the bays point to at this moment (libzfs partitions a whole
    // disk given by its kernel name and waits for the partition's node), then re-imported by
    // bay paths once udev has named the new partitions: that is what its configuration keeps.
    let kernel = |bay: &str| -> anyhow::Result<String> {
        let p = std::fs::canonicalize(format!("{BAY_DIR}/{bay}")).with_context(|| format!("resolving {bay}"))?;
        Ok(p.display().to_string())
    };
    for v in &pool.vdevs {
        if let Some(word) = v.kind.zpool_word() {
            args.push(word.into());
        }
        for b in &v.bays {
            args.push(kernel(b)?);
        }
    }
    if !pool.spares.is_empty() {
        args.push("spare".into());
        for b in &pool.spares {
            args.push(kernel(b)?);
        }
    }
    Tool::new("zpool")
        .args(&args)
        .timeout(POOL_TIMEOUT)
        .run()
        .with_context(|| format!("creating pool {}", pool.name))?;
    run(NASINIT, &[agents::NASINIT_WAIT_BAYS])?;
    run("zpool", &["export", &pool.name])?;
    import_by_bay(&[], &[&pool.name]).run().with_context(|| format!("re-importing {} by bay", pool.name))?;
    say(format!("{}: created on {} blank disks", pool.name, members.len()));
    Ok(false)
}

/// How long `probe` waits for the boot to be over. nasinit says so within a minute of its
/// start whatever becomes of the services; this bounds a box whose nasinit could not.
const BOOT_OVER_WAIT: Duration = Duration::from_secs(90);

/// The `drive-ids` service: once the box serves, replays the add events of the pools' member
/// partitions, now that udev runs its full rules for drives. They were named without blkid's
/// probe, and zed matches a pulled member by the vdev GUID blkid reads (libzfs records no devid
/// for NVMe behind the kernel's native multipath). It waits for the boot to be over because
/// blkid reading twelve members' labels took 1.26 s of udev's CPU on a one-vCPU TCG box, which
/// the storage agent's tail and nfsd's start were waiting for. "add", not "change": zed skips a
/// member that is healthy, but takes a change for a grown disk and reopens the pool. Settled:
/// when this is done the identities are in udev's database. Then it says how the pools stand.
pub fn probe() -> anyhow::Result<()> {
    let t = std::time::Instant::now();
    let over = std::path::Path::new(paths::BOOT_OVER);
    while !over.exists() && t.elapsed() < BOOT_OVER_WAIT {
        std::thread::sleep(Duration::from_millis(250));
    }
    if !over.exists() {
        say(format!("nasinit did not say the boot was over in {}s: probing now", BOOT_OVER_WAIT.as_secs()));
    }
    let plan = plan()?;
    let mut bays = Vec::new();
    let mut parts = Vec::new();
    for bay in plan.pools.iter().flat_map(PoolPlan::member_bays) {
        let Ok(dev) = std::fs::canonicalize(format!("{BAY_DIR}/{bay}-part1")) else { continue };
        if let Some(name) = dev.file_name() {
            parts.push(format!("/sys/class/block/{}", name.to_string_lossy()));
            bays.push(bay.as_str());
        }
    }
    if parts.is_empty() {
        say("no pool member present to probe");
        report_state();
        return Ok(());
    }
    let t = std::time::Instant::now();
    let replayed = Tool::new("/usr/bin/udevadm")
        .args(["trigger", "--settle", "--action=add"])
        .args(&parts)
        .timeout(Duration::from_secs(60))
        .run()
        .context("replaying the members' add events for blkid");
    if replayed.is_ok() {
        say(format!("udev read the identities of {} in {} ms", bays.join(" "), t.elapsed().as_millis()));
    }
    report_state();
    replayed.map(drop)
}

/// Saying how the pools stand must not fail the service that reads the members' identities.
fn report_state() {
    if let Err(e) = report() {
        say(format!("reading pool state: {e:#}"));
    }
}

/// The bays' first partitions that exist, by bay path.
fn first_partitions(bays: &[BayPlan], exists: impl Fn(&str) -> bool) -> Vec<String> {
    bays.iter().map(|b| format!("{BAY_DIR}/{}-part1", b.name)).filter(|p| exists(p)).collect()
}

/// `zpool import -d DEVICE… ARGS`, or `-d BAY_DIR` (every device in it) with no devices: by bay
/// paths only (kernel nvme numbering does not follow bays). libzfs otherwise waits for udev to
/// finish each device it finds (up to 30 s apiece) so that the other paths a label names
/// appear; the import needs only the bay paths, which nasinit makes. Once at boot the import
/// was asleep 9.5 s of its 15 s behind udev's queue.
fn import_by_bay(devices: &[String], args: &[&str]) -> Tool {
    let mut tool = Tool::new("zpool").arg("import");
    if devices.is_empty() {
        tool = tool.args(["-d", BAY_DIR]);
    }
    for d in devices {
        tool = tool.args(["-d", d.as_str()]);
    }
    tool.args(args).env("ZPOOL_IMPORT_UDEV_TIMEOUT_MS", "0").timeout(POOL_TIMEOUT)
}

fn content(bay: &str) -> DiskContent {
    let dev = format!("{BAY_DIR}/{bay}");
    if !std::path::Path::new(&dev).exists() {
        return DiskContent::Missing;
    }
    match probe_blkid(&dev) {
        Ok(None) => DiskContent::Blank,
        Ok(Some(mut what)) => {
            // A partition table says little; what its partitions hold says whose disk it is.
            if what.contains("partition table") {
                let parts: Vec<String> = (1..=9)
                    .filter_map(|n| {
                        let p = format!("{dev}-part{n}");
                        std::path::Path::new(&p).exists().then_some(())?;
                        probe_blkid(&p).ok().flatten().map(|w| format!("part{n}: {w}"))
                    })
                    .collect();
                if !parts.is_empty() {
                    what = format!("{what} ({})", parts.join(", "));
                }
            }
            DiskContent::Holds(what)
        }
        Err(e) => DiskContent::Holds(format!("content that could not be probed ({e})")),
    }
}

/// What blkid finds on a device, reading only (`-p` probes the device itself, no cache).
fn probe_blkid(dev: &str) -> Result<Option<String>, String> {
    match blkid::probe(std::path::Path::new(dev)) {
        Ok(blkid::Content::Blank) => Ok(None),
        Ok(found) => Ok(Some(found.describe())),
        Err(e) => Err(e.to_string()),
    }
}

/// `nasctl replace BAY`: after a drive was swapped in the same bay, brings the same disk back
/// online or resilvers the bay's pool member onto a blank one; refuses a disk that holds
/// anything else. Returns what it started.
pub fn replace(bay: &str) -> anyhow::Result<String> {
    let plan = plan()?;
    let pool = plan.pools.iter().find(|p| p.member_bays().any(|b| b == bay)).with_context(|| {
        format!(
            "{bay} is in no pool of this box (bays: {})",
            plan.bays.iter().map(|b| b.name.as_str()).collect::<Vec<_>>().join(" ")
        )
    })?;
    let status = nasos_zfs::status(Some(&pool.name)).with_context(|| format!("reading pool {}", pool.name))?;
    let ps = status.pools.get(&pool.name).with_context(|| format!("pool {} is not imported", pool.name))?;
    let member = find_leaf(ps, bay).with_context(|| format!("pool {} has no member in {bay}", pool.name))?;
    let content = content(bay);
    // A ZFS member of this very pool (the label's pool GUID, which blkid reports as its UUID).
    let same_pool = matches!(
        blkid::probe(std::path::Path::new(&format!("{BAY_DIR}/{bay}-part1"))),
        Ok(blkid::Content::Found { kind, uuid: Some(u), .. }) if kind == "zfs_member" && u == ps.pool_guid.to_string()
    );
    let dev = format!("{BAY_DIR}/{bay}");
    match super::replace_action(bay, &pool.name, &member.state, &content, same_pool).map_err(anyhow::Error::msg)? {
        super::Replace::Online => {
            run("zpool", &["online", &pool.name, &dev])?;
            Ok(format!("{bay}: the same disk is back in pool {}; it is online and resilvers what it missed", pool.name))
        }
        super::Replace::Resilver => {
            // The old member by its GUID: unambiguous, whatever path it was last seen at.
            run("zpool", &["replace", &pool.name, &member.guid.to_string(), &dev])?;
            Ok(format!("{bay}: resilvering pool {} onto the new disk; `nasctl pools` shows the progress", pool.name))
        }
    }
}

/// The leaf vdev whose path is the bay's.
fn find_leaf<'a>(p: &'a nasos_zfs::PoolStatus, bay: &str) -> Option<&'a nasos_zfs::Vdev> {
    fn walk<'a>(v: &'a nasos_zfs::Vdev, bay: &str) -> Option<&'a nasos_zfs::Vdev> {
        if v.vdevs.is_empty() {
            let name = v.name.rsplit('/').next().unwrap_or(&v.name);
            return (name == bay || name == format!("{bay}-part1")).then_some(v);
        }
        v.vdevs.values().find_map(|c| walk(c, bay))
    }
    p.vdevs.values().chain(p.spares.values()).find_map(|v| walk(v, bay))
}

pub fn export() -> anyhow::Result<()> {
    let plan = plan()?;
    let mut failed = Vec::new();
    for pool in plan.pools.iter().rev() {
        if imported(&pool.name) {
            match run("zpool", &["export", &pool.name]) {
                Ok(_) => say(format!("{}: exported", pool.name)),
                Err(e) => failed.push(format!("{e:#}")),
            }
        }
    }
    if failed.is_empty() { Ok(()) } else { anyhow::bail!(failed.join("; ")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bay(name: &str) -> BayPlan {
        BayPlan { name: name.into(), matcher: Default::default() }
    }

    #[test]
    fn the_fast_import_reads_the_first_partitions_that_exist() {
        let bays = [bay("BAY01"), bay("BAY02"), bay("BAY03")];
        let parts = first_partitions(&bays, |p| !p.contains("BAY02"));
        assert_eq!(parts, [format!("{BAY_DIR}/BAY01-part1"), format!("{BAY_DIR}/BAY03-part1")]);
        let line = import_by_bay(&parts, &["tank"]).command_line();
        assert!(line.contains(&format!("-d {BAY_DIR}/BAY01-part1 -d {BAY_DIR}/BAY03-part1 tank")), "{line}");
        assert!(!line.contains(&format!("-d {BAY_DIR} ")), "{line}");
    }

    #[test]
    fn with_no_partition_the_import_scans_the_bays_folder_not_all_of_dev() {
        let parts = first_partitions(&[bay("BAY01")], |_| false);
        assert!(parts.is_empty());
        let line = import_by_bay(&parts, &["tank"]).command_line();
        assert!(line.contains(&format!("import -d {BAY_DIR} tank")), "{line}");
    }
}
