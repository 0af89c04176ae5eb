//! The box's replication key, and OpenSSH's server for peers: its configuration and the
//! authorized keys are made from the plan at start (in `/run`, the root is read-only); each
//! peer's key may run only the forced command, as root, without a terminal or forwarding.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use nasos_board::plan::{PeerPlan, ReplicationPlan};
use nasos_layout::state::{self, State};

use crate::{Tool, plan, say};

/// Where the files made at start live.
pub const RUN_DIR: &str = "/run/nasos/replication";
const SSHD: &str = "/usr/sbin/sshd";

/// The private key this box uses: a development image's from the plan (written to `/run`), or
/// the one made on first boot on the state partition. Made when missing.
pub fn identity(r: &ReplicationPlan) -> anyhow::Result<PathBuf> {
    if let Some(secret) = &r.identity {
        let p = Path::new(RUN_DIR).join("identity");
        if !p.exists() {
            std::fs::create_dir_all(RUN_DIR).with_context(|| format!("making {RUN_DIR}"))?;
            std::fs::write(&p, secret).with_context(|| format!("writing {}", p.display()))?;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))?;
        }
        return Ok(p);
    }
    let p = State::mounted().path(state::REPLICATION_KEY);
    if !p.exists() {
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
        Tool::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", &format!("nasos-{host}"), "-f"])
            .arg(&p)
            .run()
            .context("making the box's replication key")?;
        say(format!("made this box's replication key {}", p.display()));
    }
    Ok(p)
}

/// The public half, as a peer's recipe names it (`nasctl replication key`).
pub fn identity_public() -> anyhow::Result<String> {
    let plan = plan()?;
    let key = identity(&plan.replication)?;
    let out = Tool::new("ssh-keygen").arg("-y").arg("-f").arg(&key).run().context("reading the replication key")?;
    Ok(out.trim().to_string())
}

/// sshd's configuration: only the peers' addresses, only their keys, only the forced command.
pub fn sshd_config(listen: &[&str], host_key: &Path, authorized: &Path) -> String {
    let mut out = String::from("# Made by nasos-replication sshd from the plan: peers only.\n");
    for a in listen {
        out.push_str(&format!("ListenAddress {a}\n"));
    }
    out.push_str(&format!("HostKey {}\nAuthorizedKeysFile {}\n", host_key.display(), authorized.display()));
    out.push_str(
        "PermitRootLogin forced-commands-only\nAllowUsers root\nAuthenticationMethods publickey\n\
         PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
         UsePAM no\nDisableForwarding yes\nPermitTTY no\nPermitUserRC no\nPermitUserEnvironment no\n\
         PermitTunnel no\nPrintMotd no\nClientAliveInterval 5\nClientAliveCountMax 3\n\
         MaxStartups 4:50:8\nPidFile none\n",
    );
    out
}

/// One line per peer that may send here: its key, restricted to the forced command for it.
pub fn authorized_keys(peers: &[PeerPlan]) -> String {
    peers
        .iter()
        .filter(|p| !p.receive.is_empty())
        .map(|p| {
            format!(
                "restrict,command=\"{} serve {}\" {}\n",
                nasos_layout::agents::REPLICATION.path,
                p.name,
                p.key.trim()
            )
        })
        .collect()
}

/// `nasos-replication sshd`: writes the configuration and execs sshd in the foreground.
pub fn sshd() -> anyhow::Result<()> {
    let plan = plan()?;
    let r = &plan.replication;
    let key = identity(r)?;
    std::fs::create_dir_all(RUN_DIR).with_context(|| format!("making {RUN_DIR}"))?;
    // sshd's privilege separation directory.
    std::fs::create_dir_all("/run/sshd").context("making /run/sshd")?;
    let authorized = Path::new(RUN_DIR).join("authorized_keys");
    std::fs::write(&authorized, authorized_keys(&r.peers)).context("writing authorized_keys")?;
    std::fs::set_permissions(&authorized, std::fs::Permissions::from_mode(0o600))?;
    let listen: Vec<&str> =
        r.peers.iter().filter(|p| !p.receive.is_empty()).map(|p| p.local_address.as_str()).collect();
    let config = Path::new(RUN_DIR).join("sshd_config");
    std::fs::write(&config, sshd_config(&listen, &key, &authorized)).context("writing sshd_config")?;
    say(format!(
        "sshd for peers {} on {}",
        r.peers.iter().filter(|p| !p.receive.is_empty()).map(|p| p.name.as_str()).collect::<Vec<_>>().join(", "),
        listen.join(", ")
    ));
    use std::os::unix::process::CommandExt;
    let e = std::process::Command::new(SSHD).arg("-D").arg("-e").arg("-f").arg(&config).exec();
    Err(e).context("starting sshd")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sshd_lets_each_peer_run_only_its_forced_command() {
        let peer = |name: &str, receive: &[&str]| PeerPlan {
            name: name.into(),
            address: "10.77.0.1".into(),
            key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB nasos-primary\n".into(),
            link: "data0".into(),
            local_address: "10.77.0.2".into(),
            receive: receive.iter().map(|s| s.to_string()).collect(),
        };
        let keys = authorized_keys(&[peer("primary", &["tank/train"]), peer("elsewhere", &[])]);
        assert_eq!(
            keys,
            "restrict,command=\"/usr/lib/nasos/nasos-replication serve primary\" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB nasos-primary\n",
            "a peer that may write nothing here cannot log in at all"
        );
        let c = sshd_config(&["10.77.0.2"], Path::new("/k"), Path::new("/a"));
        for line in [
            "ListenAddress 10.77.0.2\n",
            "PermitRootLogin forced-commands-only\n",
            "PasswordAuthentication no\n",
            "AuthenticationMethods publickey\n",
            "DisableForwarding yes\n",
            "PermitTTY no\n",
            "AuthorizedKeysFile /a\n",
        ] {
            assert!(c.contains(line), "{line} missing from {c}");
        }
        assert!(!c.contains("Subsystem"), "no sftp");
    }
}
