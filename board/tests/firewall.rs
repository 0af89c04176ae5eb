//! The firewall each shipped recipe gets: exactly the ports its plan serves (the real nft's
//! check of each ruleset is in nasos-tests, which installs nftables).

use std::path::Path;

use nasos_board::load_recipe_file;
use nasos_board::plan::firewall::{allowed, nfs_addresses, ruleset};

fn plan(recipe: &str) -> nasos_board::Plan {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes").join(recipe);
    load_recipe_file(&path).unwrap_or_else(|e| panic!("{recipe}: {e:?}")).plan()
}

fn flows(p: &nasos_board::Plan) -> Vec<String> {
    allowed(p).iter().map(|a| format!("{} {}/{} from [{}]", a.link, a.proto, a.port, a.from.join(" "))).collect()
}

#[test]
fn the_appliance_answers_only_for_nfs_roce_and_metrics_on_its_data_link() {
    let p = plan("qemu-dev.toml");
    assert_eq!(
        flows(&p),
        [
            "data0 tcp/2049 from [10.77.0.0/24 10.77.0.0/25 10.77.0.128/26 10.77.0.192/26]",
            "data0 udp/4791 from [10.77.0.0/24 10.77.0.0/25 10.77.0.128/26 10.77.0.192/26]",
            "data0 tcp/9100 from []"
        ]
    );
    let rules = ruleset(&p);
    assert!(rules.contains("policy drop;"), "{rules}");
    assert!(rules.contains("iifname \"data0\" ip daddr 10.77.0.1 tcp dport 9100 accept"), "{rules}");
    assert!(!rules.contains("dport 22 "), "{rules}");
}

#[test]
fn the_product_opens_nothing_on_its_management_link_but_the_metrics_it_asked_for() {
    let p = plan("ts-h1290fx.toml");
    let f = flows(&p);
    let mgmt: Vec<&String> = f.iter().filter(|l| l.starts_with("mgmt0 ")).collect();
    assert_eq!(mgmt, ["mgmt0 tcp/9100 from []"], "{f:#?}");
    for data in ["data0", "data1"] {
        assert!(f.iter().any(|l| l.starts_with(&format!("{data} tcp/2049 "))), "{f:#?}");
        assert!(f.iter().any(|l| l.starts_with(&format!("{data} udp/4791 "))), "{f:#?}");
    }
}

#[test]
fn a_client_box_answers_roce_on_its_fabric_and_what_its_recipe_allows() {
    let p = plan("qemu-client.toml");
    let f = flows(&p);
    assert!(f.contains(&"data0 udp/4791 from [10.77.0.0/24]".to_string()), "{f:#?}");
    assert!(f.iter().all(|l| !l.contains("tcp/2049")), "a box without exports serves no NFS: {f:#?}");
    assert!(f.iter().any(|l| l.contains("udp/514")), "the recipe's syslog receiver: {f:#?}");
}

#[test]
fn nfsd_listens_on_the_data_addresses_only() {
    assert_eq!(nfs_addresses(&plan("qemu-dev.toml")), ["10.77.0.1"]);
    // Not on the management port's 192.168.10.20.
    assert_eq!(nfs_addresses(&plan("ts-h1290fx.toml")), ["10.40.0.10", "10.40.1.10"]);
    assert!(nfs_addresses(&plan("qemu-client.toml")).is_empty());
}
