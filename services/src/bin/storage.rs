//! nasos-storage up: imports each pool of the plan by its bay paths, or creates it when the
//! recipe allows and every member disk is blank; then makes datasets match the plan, changing
//! only what differs. nasos-storage export: exports the pools (the shutdown path).

use std::process::{Command, ExitCode};

use anyhow::Context;
use nasos_board::plan::{BAY_DIR, PoolPlan};
use nasos_board::recipe::CreatePolicy;
use nasos_services::storage::{DiskContent, describe_blkid, may_create};
use nasos_services::{plan, probe, run, say};

fn main() -> ExitCode {
    nasos_services::main("storage", &["up", "export"], |verb| if verb == "up" { up() } else { export() })
}

fn imported(pool: &str) -> bool {
    probe("zpool", &["list", "-H", "-o", "name", pool])
}

fn up() -> anyhow::Result<()> {
    let plan = plan()?;
    if let Some(arc) = plan.zfs.arc_max_bytes {
        let _ = std::fs::write("/sys/module/zfs/parameters/zfs_arc_max", arc.to_string());
    }
    for pool in &plan.pools {
        ensure_pool(pool)?;
    }
    for ds in &plan.datasets {
        if !probe("zfs", &["list", "-H", "-o", "name", &ds.name]) {
            let mut args = vec!["create".to_string(), "-p".to_string()];
            for (k, v) in &ds.properties {
                args.push("-o".into());
                args.push(format!("{k}={v}"));
            }
            args.push(ds.name.clone());
            run("zfs", &args.iter().map(String::as_str).collect::<Vec<_>>())?;
            say(format!("{}: created", ds.name));
            continue;
        }
        let mut changed = Vec::new();
        for (k, v) in &ds.properties {
            let now = run("zfs", &["get", "-H", "-p", "-o", "value", k, &ds.name])?;
            if now.trim() != v && !same_size(now.trim(), v) {
                run("zfs", &["set", &format!("{k}={v}"), &ds.name])?;
                changed.push(format!("{k} {} → {v}", now.trim()));
            }
        }
        say(format!("{}: {}", ds.name, if changed.is_empty() { "as planned".to_string() } else { changed.join(", ") }));
    }
    let _ = run("zfs", &["mount", "-a"]);
    Ok(())
}

/// `zfs get -p` prints sizes in bytes; the plan may say "2G".
fn same_size(now: &str, want: &str) -> bool {
    nasos_board::units::parse_size(want).is_some_and(|w| now.parse::<u64>().ok() == Some(w))
}

fn ensure_pool(pool: &PoolPlan) -> anyhow::Result<()> {
    if imported(&pool.name) {
        say(format!("{}: already imported", pool.name));
        return Ok(());
    }
    // Import by bay paths only: kernel nvme numbering does not follow bays.
    if probe("zpool", &["import", "-N", "-d", BAY_DIR, &pool.name]) {
        let _ = run("zfs", &["mount", "-a"]);
        say(format!("{}: imported", pool.name));
        return Ok(());
    }
    if pool.create == CreatePolicy::ImportOnly {
        anyhow::bail!("pool {} is not found on its bays and the recipe says import-only", pool.name);
    }
    let members: Vec<&String> = pool.vdevs.iter().flat_map(|v| v.bays.iter()).chain(pool.spares.iter()).collect();
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
    // Created on the kernel names the bays point to at this moment: libzfs waits for the
    // partitions it makes to appear under udev's naming, and there is no udev here. The pool is
    // then re-imported by bay paths, which is what its configuration keeps.
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
    run("zpool", &args.iter().map(String::as_str).collect::<Vec<_>>())
        .with_context(|| format!("creating pool {}", pool.name))?;
    run(nasos_board::plan::NASINIT_PATH, &["link-bays"])?;
    run("zpool", &["export", &pool.name])?;
    run("zpool", &["import", "-d", BAY_DIR, &pool.name])
        .with_context(|| format!("re-importing {} by bay", pool.name))?;
    say(format!("{}: created on {} blank disks", pool.name, members.len()));
    Ok(())
}

fn content(bay: &str) -> DiskContent {
    let dev = format!("{BAY_DIR}/{bay}");
    if !std::path::Path::new(&dev).exists() {
        return DiskContent::Missing;
    }
    match Command::new("blkid").args(["-p", "-o", "export", &dev]).output() {
        // Exit status 2: nothing identifiable on the device.
        Ok(o) if o.status.code() == Some(2) => DiskContent::Blank,
        Ok(o) => match describe_blkid(&String::from_utf8_lossy(&o.stdout)) {
            Some(what) => DiskContent::Holds(what),
            None => DiskContent::Holds("data blkid could not name".into()),
        },
        Err(_) => DiskContent::Holds("content that could not be probed (blkid did not run)".into()),
    }
}

fn export() -> anyhow::Result<()> {
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
