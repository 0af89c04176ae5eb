//! The manifests of the development recipe, read back through k8s-openapi's own types.

use std::path::Path;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use nasos_k8s::{Error, Options, manifests};

fn plan() -> nasos_board::Plan {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/qemu-dev.toml");
    nasos_board::load_recipe_file(&path).unwrap_or_else(|e| panic!("{e:?}")).plan()
}

fn items(list: &serde_json::Value, kind: &str) -> Vec<serde_json::Value> {
    list["items"].as_array().expect("items").iter().filter(|i| i["kind"] == kind).cloned().collect()
}

#[test]
fn a_tenants_volumes_parse_and_mount_its_export_over_rdma_and_tcp() {
    let opts = Options { tenant: Some("vision".into()), server: None, namespace: None };
    let list = manifests(&plan(), &opts).expect("manifests");
    assert_eq!((list["apiVersion"].as_str(), list["kind"].as_str()), (Some("v1"), Some("List")));
    let pvs: Vec<PersistentVolume> =
        items(&list, "PersistentVolume").into_iter().map(|v| serde_json::from_value(v).expect("a PV")).collect();
    assert_eq!(pvs.len(), 2, "one per transport");
    let rdma =
        pvs.iter().find(|p| p.metadata.name.as_deref() == Some("qemu-dev-tank-teams-vision-rdma")).expect("rdma PV");
    let spec = rdma.spec.as_ref().expect("spec");
    let csi = spec.csi.as_ref().expect("csi");
    assert_eq!(csi.driver, "nfs.csi.k8s.io");
    let attrs = csi.volume_attributes.as_ref().expect("attributes");
    assert_eq!(attrs.get("server").map(String::as_str), Some("10.77.0.1"));
    assert_eq!(attrs.get("share").map(String::as_str), Some("/export/tank/teams/vision"));
    assert_eq!(
        spec.mount_options.as_deref(),
        Some(&["nfsvers=4.2".into(), "proto=rdma".into(), "port=20049".into()][..])
    );
    assert_eq!(spec.capacity.as_ref().and_then(|c| c.get("storage")).map(|q| q.0.as_str()), Some("64Mi"));
    assert_eq!(spec.access_modes.as_deref(), Some(&["ReadWriteMany".to_string()][..]));
    let tcp =
        pvs.iter().find(|p| p.metadata.name.as_deref() == Some("qemu-dev-tank-teams-vision-tcp")).expect("tcp PV");
    assert_eq!(
        tcp.spec.as_ref().and_then(|s| s.mount_options.clone()),
        Some(vec!["nfsvers=4.2".to_string(), "proto=tcp".to_string()])
    );
    // Each claim is bound to its volume, in the tenant's namespace, of its class.
    for claim in items(&list, "PersistentVolumeClaim") {
        let c: PersistentVolumeClaim = serde_json::from_value(claim).expect("a PVC");
        let spec = c.spec.as_ref().expect("spec");
        assert_eq!(c.metadata.namespace.as_deref(), Some("vision"));
        assert_eq!(spec.volume_name, c.metadata.name);
        assert_eq!(spec.storage_class_name, c.metadata.name);
    }
    for class in items(&list, "StorageClass") {
        let sc: StorageClass = serde_json::from_value(class).expect("a StorageClass");
        assert_eq!(sc.provisioner, "nfs.csi.k8s.io");
        assert!(sc.mount_options.as_ref().is_some_and(|o| o.contains(&"nfsvers=4.2".to_string())));
    }
    // Only vision's: nothing of speech's or the shared datasets.
    assert!(!list.to_string().contains("speech") && !list.to_string().contains("tank/train"), "{list}");
}

#[test]
fn without_a_tenant_every_export_gets_volumes_and_an_unknown_tenant_is_named() {
    let all = manifests(&plan(), &Options { tenant: None, server: Some("192.0.2.7".into()), namespace: None })
        .expect("manifests");
    let pvs = items(&all, "PersistentVolume");
    let exports = plan().nfs.expect("nfs").exports;
    assert!(exports.iter().all(|e| e.rdma));
    assert_eq!(pvs.len(), 2 * exports.len(), "every export, RDMA and TCP each");
    assert!(pvs.iter().all(|p| p["spec"]["csi"]["volumeAttributes"]["server"] == "192.0.2.7"));
    let e = manifests(&plan(), &Options { tenant: Some("visoin".into()), server: None, namespace: None })
        .expect_err("unknown tenant");
    assert!(matches!(e, Error::UnknownTenant { .. }), "{e}");
    assert!(e.to_string().contains("vision, speech"), "{e}");
}
