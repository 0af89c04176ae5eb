//! Building without root. The image's root tree holds files owned by root and by a few system
//! users; unpacking it, running the image's own `depmod` in it and packing it as EROFS need
//! those owners kept. As the build host's root nothing more is needed. As anyone else the tree
//! work runs inside a user namespace, as mkosi and mmdebstrap's unshare mode do:
//! `unshare --map-root-user --map-auto` makes the invoking user the namespace's root and its
//! /etc/subuid range the other users. Files nasos itself writes into the tree (its binaries,
//! the plan) are then the invoking user's outside and root's inside, as they would be built as
//! root, so both ways make the same bytes. mmdebstrap (rootfs, ZFS build root) picks its
//! unshare mode on its own when not run as root.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};

/// The namespace every non-root tree command runs in.
const UNSHARE: [&str; 3] = ["--map-root-user", "--map-auto", "--"];

/// Whether nasos runs as the build host's root.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A command that acts on the root tree with the tree's owners: `program` itself as root,
/// otherwise `program` inside the build's user namespace.
pub fn tree_command(program: &str) -> Command {
    command_for(is_root(), program)
}

fn command_for(root: bool, program: &str) -> Command {
    if root {
        Command::new(program)
    } else {
        let mut c = Command::new("unshare");
        c.args(UNSHARE).arg(program);
        c
    }
}

/// Checks, before a build starts, that a non-root build can make its user namespace, and says in
/// one line what to change when it cannot. A no-op as root.
pub fn check() -> anyhow::Result<()> {
    if is_root() {
        return Ok(());
    }
    let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map_or_else(|| nix::unistd::geteuid().to_string(), |u| u.name);
    let out = Command::new("unshare")
        .args(UNSHARE)
        .arg("true")
        .output()
        .context("running unshare (util-linux) to make the build's user namespace")?;
    if !out.status.success() {
        bail!(
            "nasos builds as {user} (not root) inside a user namespace, and the namespace could not be made ({}); \
             give {user} subordinate ids (as root: usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}), \
             and allow unprivileged user namespaces where they are turned off (sysctl kernel.unprivileged_userns_clone=1, \
             kernel.apparmor_restrict_unprivileged_userns=0) — or build as root",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Removes a tree that may hold directories owned by the image's other users (which the
/// invoking user, outside the namespace, may not even list): directly, and where that is refused
/// from inside the namespace. Missing is fine.
pub fn remove_tree(path: &Path) -> anyhow::Result<()> {
    if !path.exists() && !path.is_symlink() {
        return Ok(());
    }
    let plain =
        if path.is_dir() && !path.is_symlink() { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) };
    // As root, or where the invoking user owns everything in it, that is all.
    if plain.is_ok() || is_root() {
        return plain.with_context(|| format!("removing {}", path.display()));
    }
    let out = tree_command("rm")
        .arg("-rf")
        .arg("--")
        .arg(path)
        .output()
        .with_context(|| format!("removing {}", path.display()))?;
    if !out.status.success() {
        bail!("removing {}: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_runs_tools_directly_and_anyone_else_inside_the_namespace() {
        let c = command_for(true, "mkfs.erofs");
        assert_eq!(c.get_program(), "mkfs.erofs");
        assert_eq!(c.get_args().count(), 0);
        let c = command_for(false, "mkfs.erofs");
        assert_eq!(c.get_program(), "unshare");
        let args: Vec<_> = c.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args, ["--map-root-user", "--map-auto", "--", "mkfs.erofs"]);
    }

    #[test]
    fn removing_a_missing_tree_is_not_an_error() {
        remove_tree(Path::new("/nonexistent/nasos-userns-test")).expect("missing is fine");
    }
}
