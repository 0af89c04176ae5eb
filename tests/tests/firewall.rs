//! Every shipped recipe's firewall ruleset is one the real nft accepts (`nft -c -f`, Debian's
//! nftables, installed on the host when missing): what the box loads at boot is checked here by
//! the tool that loads it.

use nasos_board::load_recipe_file;
use nasos_board::plan::firewall::ruleset;
use nasos_tests::{host_tool, repo};

#[test]
fn every_shipped_ruleset_parses_with_the_real_nft() {
    let nft = host_tool("/usr/sbin/nft", "nftables");
    for recipe in ["qemu-dev.toml", "qemu-prod.toml", "qemu-client.toml", "ts-h1290fx.toml"] {
        let plan =
            load_recipe_file(&repo().join("recipes").join(recipe)).unwrap_or_else(|e| panic!("{recipe}: {e:?}")).plan();
        let rules = ruleset(&plan);
        let file = std::env::temp_dir().join(format!("nasos-firewall-{}-{recipe}.nft", std::process::id()));
        std::fs::write(&file, &rules).expect("write");
        let out = std::process::Command::new(&nft).arg("-c").arg("-f").arg(&file).output().expect("nft");
        let _ = std::fs::remove_file(&file);
        assert!(
            out.status.success(),
            "{recipe}: nft -c rejects the ruleset: {}\n{rules}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A broken ruleset is rejected: the check can fail.
    let file = std::env::temp_dir().join(format!("nasos-firewall-{}-bad.nft", std::process::id()));
    std::fs::write(
        &file,
        "table inet nasos { chain input { type filter hook input priority filter; policy nope; } }\n",
    )
    .expect("write");
    let out = std::process::Command::new(&nft).arg("-c").arg("-f").arg(&file).output().expect("nft");
    let _ = std::fs::remove_file(&file);
    assert!(!out.status.success(), "nft -c accepted a broken ruleset");
}
