//! Tenants in the plan: a tenant's exports go to its networks only, with its squash; its
//! dataset is made before the datasets below it; its VLAN answers its clients only.

use nasos_board::plan::firewall::allowed;
use nasos_board::{SourceFile, load_recipe};

const BASE: &str = r#"
[image]
name = "teams"
version = "1.0.0"
board = "qemu-q35"
development = true

[console]
root_login = "autologin"

[[network.links]]
name = "data0"
port = "roce0"
mtu = 9000
addresses = ["10.77.0.1/24"]

[fabric]
links = ["data0"]
lossless_priority = 3

[[pools]]
name = "tank"
vdevs = [{ type = "raidz2", bays = ["BAY01", "BAY02", "BAY03", "BAY04", "BAY05"] }]

[[datasets]]
name = "tank/teams/vision/models"

[[datasets]]
name = "tank/shared"

[[tenants]]
name = "vision"
dataset = "tank/teams/vision"
quota = "64M"
networks = ["10.77.0.128/26"]

[[tenants]]
name = "speech"
dataset = "tank/teams/speech"
reservation = "16M"
networks = ["10.77.0.192/26", "10.99.0.0/24"]
squash = "all"
anon_uid = 3000
anon_gid = 3001
vlans = [{ link = "data0", id = 300, addresses = ["10.99.0.1/24"] }]

[nfs]
[[nfs.exports]]
dataset = "tank/teams/vision"
rdma = true

[[nfs.exports]]
dataset = "tank/teams/speech"
rdma = true

[[nfs.exports]]
dataset = "tank/shared"
rdma = true
clients = [{ network = "10.77.0.0/24", access = "ro" }]
"#;

fn plan() -> nasos_board::Plan {
    load_recipe(&SourceFile::new("teams.toml", BASE)).unwrap_or_else(|e| panic!("{e:?}")).plan()
}

#[test]
fn a_tenants_exports_go_to_its_networks_with_its_squash() {
    let p = plan();
    let table = p.nfs.as_ref().expect("nfs").exports_table();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines,
        [
            "/srv/nfs/tank/teams/vision 10.77.0.128/26(rw,sync,root_squash,no_subtree_check,crossmnt,sec=sys)",
            "/srv/nfs/tank/teams/speech 10.77.0.192/26(rw,sync,all_squash,anonuid=3000,anongid=3001,no_subtree_check,crossmnt,sec=sys) 10.99.0.0/24(rw,sync,all_squash,anonuid=3000,anongid=3001,no_subtree_check,crossmnt,sec=sys)",
            "/srv/nfs/tank/shared 10.77.0.0/24(ro,sync,root_squash,no_subtree_check,crossmnt,sec=sys)",
        ]
        .map(|l| l.replace("/srv/nfs", nasos_layout::paths::EXPORT_ROOT)),
    );
    let tenants: Vec<Option<&str>> = p.nfs.as_ref().expect("nfs").exports.iter().map(|e| e.tenant.as_deref()).collect();
    assert_eq!(tenants, [Some("vision"), Some("speech"), None]);
}

#[test]
fn a_tenants_dataset_is_made_with_its_quota_before_what_lies_below() {
    let p = plan();
    let names: Vec<&str> = p.datasets.iter().map(|d| d.name.as_str()).collect();
    let at = |n: &str| names.iter().position(|x| *x == n).unwrap_or_else(|| panic!("{n} in {names:?}"));
    assert!(at("tank/teams/vision") < at("tank/teams/vision/models"), "{names:?}");
    let vision = &p.datasets[at("tank/teams/vision")];
    assert_eq!(vision.properties.get("quota").map(String::as_str), Some("64M"));
    let speech = &p.datasets[at("tank/teams/speech")];
    assert_eq!(speech.properties.get("reservation").map(String::as_str), Some("16M"));
    assert_eq!(
        p.tenants.iter().map(|t| (t.name.as_str(), t.quota_bytes)).collect::<Vec<_>>(),
        [("vision", Some(64 << 20)), ("speech", None)]
    );
}

#[test]
fn a_tenants_vlan_answers_its_clients_only_and_the_untagged_link_not_them() {
    let p = plan();
    let link = &p.links[0];
    assert_eq!(
        link.vlans.iter().map(|v| (v.name.as_str(), v.tenant.as_deref())).collect::<Vec<_>>(),
        [("data0.300", Some("speech"))]
    );
    assert!(p.kernel.modules.iter().any(|m| m == "8021q"), "{:?}", p.kernel.modules);
    let flows: Vec<String> =
        allowed(&p).iter().map(|a| format!("{} {}/{} from [{}]", a.link, a.proto, a.port, a.from.join(" "))).collect();
    let nfs_on = |ifname: &str| flows.iter().find(|f| f.starts_with(&format!("{ifname} tcp/2049"))).cloned();
    // Speech has a VLAN: its networks are answered there and only there.
    assert_eq!(nfs_on("data0.300").as_deref(), Some("data0.300 tcp/2049 from [10.77.0.192/26 10.99.0.0/24]"));
    assert_eq!(nfs_on("data0").as_deref(), Some("data0 tcp/2049 from [10.77.0.0/24 10.77.0.128/26]"));
}

#[test]
fn nasos_plan_shows_each_tenant() {
    let text = plan().to_string();
    assert!(text.contains("vision  tank/teams/vision  quota 64M  reservation none  squash root"), "{text}");
    assert!(text.contains("exports tank/teams/speech"), "{text}");
    assert!(text.contains("vlans data0.300"), "{text}");
}
