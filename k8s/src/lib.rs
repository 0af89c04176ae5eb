//! Kubernetes manifests for a plan's NFS exports (see README.md).

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nasos_board::Plan;
use nasos_board::plan::{ExportPlan, firewall};

/// The NFS CSI driver's name (kubernetes-csi/csi-driver-nfs).
pub const CSI_DRIVER: &str = "nfs.csi.k8s.io";
/// A PV's capacity when its dataset has no quota: NFS does not enforce it, and a claim must
/// name some size.
pub const NOMINAL_CAPACITY: &str = "1Ti";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no tenant `{name}` in the recipe (it has: {known})")]
    UnknownTenant { name: String, known: String },
    #[error("{0} serves no NFS exports")]
    NoExports(String),
    #[error("no address of the box serves NFS to `{0}`'s clients; give one with --server")]
    NoServer(String),
    #[error("encoding the manifests: {0}")]
    Json(#[from] serde_json::Error),
}

/// How the client mounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Rdma,
    Tcp,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Rdma => "rdma",
            Transport::Tcp => "tcp",
        }
    }
}

pub struct Options {
    /// Only this tenant's exports.
    pub tenant: Option<String>,
    /// The address clients mount from; by default the box's address whose subnet holds the
    /// export's client networks.
    pub server: Option<String>,
    /// The claims' namespace; by default the tenant's name, or `default`.
    pub namespace: Option<String>,
}

/// The mount options that select NFS 4.2 over `t` (what csi-driver-nfs hands to mount(8)).
pub fn mount_options(plan: &Plan, t: Transport) -> Vec<String> {
    let nfs = plan.nfs.as_ref();
    match t {
        Transport::Rdma => vec![
            "nfsvers=4.2".into(),
            "proto=rdma".into(),
            format!("port={}", nfs.and_then(|n| n.rdma_port).unwrap_or(20049)),
        ],
        Transport::Tcp => vec!["nfsvers=4.2".into(), "proto=tcp".into()],
    }
}

/// Every object for the chosen exports, as one `v1/List`.
pub fn manifests(plan: &Plan, opts: &Options) -> Result<serde_json::Value, Error> {
    let nfs = plan.nfs.as_ref().ok_or_else(|| Error::NoExports(plan.image.name.clone()))?;
    if let Some(name) = &opts.tenant
        && !plan.tenants.iter().any(|t| &t.name == name)
    {
        let known: Vec<&str> = plan.tenants.iter().map(|t| t.name.as_str()).collect();
        return Err(Error::UnknownTenant {
            name: name.clone(),
            known: if known.is_empty() { "none".into() } else { known.join(", ") },
        });
    }
    let exports: Vec<&ExportPlan> =
        nfs.exports.iter().filter(|e| opts.tenant.is_none() || e.tenant == opts.tenant).collect();
    if exports.is_empty() {
        return Err(Error::NoExports(opts.tenant.clone().unwrap_or_else(|| plan.image.name.clone())));
    }
    let mut items = Vec::new();
    for e in exports {
        let server = match &opts.server {
            Some(s) => s.clone(),
            None => server_for(plan, e).ok_or_else(|| Error::NoServer(e.dataset.clone()))?,
        };
        let namespace = opts.namespace.clone().or_else(|| e.tenant.clone()).unwrap_or_else(|| "default".into());
        let transports: &[Transport] = if e.rdma { &[Transport::Rdma, Transport::Tcp] } else { &[Transport::Tcp] };
        for &t in transports {
            let o = objects(plan, e, &server, &namespace, t);
            items.push(serde_json::to_value(&o.class)?);
            items.push(serde_json::to_value(&o.volume)?);
            items.push(serde_json::to_value(&o.claim)?);
        }
    }
    Ok(serde_json::json!({ "apiVersion": "v1", "kind": "List", "items": items }))
}

/// One export's objects over one transport.
pub struct Objects {
    pub class: StorageClass,
    pub volume: PersistentVolume,
    pub claim: PersistentVolumeClaim,
}

pub fn objects(plan: &Plan, e: &ExportPlan, server: &str, namespace: &str, t: Transport) -> Objects {
    let name = format!("{}-{}", dns_label(&format!("{}-{}", plan.image.name, e.dataset)), t.name());
    let options = mount_options(plan, t);
    let writable = e.clients.iter().any(|c| c.options.first().is_some_and(|o| o == "rw"));
    let access = vec![if writable { "ReadWriteMany" } else { "ReadOnlyMany" }.to_string()];
    let capacity = capacity(plan, &e.dataset);
    let mut labels = BTreeMap::from([("app.kubernetes.io/managed-by".to_string(), "nasos".to_string())]);
    if let Some(t) = &e.tenant {
        labels.insert("nasos.io/tenant".into(), t.clone());
    }
    let attributes =
        BTreeMap::from([("server".to_string(), server.to_string()), ("share".to_string(), e.path.clone())]);
    let class = StorageClass {
        metadata: ObjectMeta { name: Some(name.clone()), labels: Some(labels.clone()), ..Default::default() },
        provisioner: CSI_DRIVER.into(),
        // Dynamic claims of this class are directories csi-driver-nfs makes inside the export.
        parameters: Some(attributes.clone()),
        mount_options: Some(options.clone()),
        reclaim_policy: Some("Retain".into()),
        volume_binding_mode: Some("Immediate".into()),
        ..Default::default()
    };
    let volume = PersistentVolume {
        metadata: ObjectMeta { name: Some(name.clone()), labels: Some(labels.clone()), ..Default::default() },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([("storage".to_string(), Quantity(capacity.clone()))])),
            access_modes: Some(access.clone()),
            persistent_volume_reclaim_policy: Some("Retain".into()),
            storage_class_name: Some(name.clone()),
            mount_options: Some(options),
            csi: Some(CSIPersistentVolumeSource {
                driver: CSI_DRIVER.into(),
                // Unique per volume in the cluster: the box, the path and the transport.
                volume_handle: format!("{server}#{}#{}", e.path, t.name()),
                volume_attributes: Some(attributes),
                ..Default::default()
            }),
            claim_ref: Some(ObjectReference {
                namespace: Some(namespace.to_string()),
                name: Some(name.clone()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(access),
            storage_class_name: Some(name.clone()),
            volume_name: Some(name),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_string(), Quantity(capacity))])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    Objects { class, volume, claim }
}

/// The quota of the dataset, or of the nearest one above it that has one (a tenant's), in
/// Kubernetes' binary units; [`NOMINAL_CAPACITY`] without one.
fn capacity(plan: &Plan, dataset: &str) -> String {
    let mut name = dataset;
    loop {
        let quota = plan
            .datasets
            .iter()
            .find(|d| d.name == name)
            .and_then(|d| d.properties.get("quota"))
            .and_then(|q| nasos_board::units::parse_size(q))
            .filter(|q| *q > 0);
        if let Some(q) = quota {
            return quantity(q);
        }
        match name.rsplit_once('/') {
            Some((parent, _)) => name = parent,
            None => return NOMINAL_CAPACITY.into(),
        }
    }
}

fn quantity(bytes: u64) -> String {
    for (suffix, shift) in [("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// The box's NFS address on the interface whose subnets hold the export's client networks (a
/// tenant's VLAN when it has one); the first NFS address otherwise.
fn server_for(plan: &Plan, e: &ExportPlan) -> Option<String> {
    let serving = firewall::nfs_addresses(plan);
    let clients: Vec<IpNet> = e.clients.iter().filter_map(|c| c.network.parse().ok()).collect();
    let tenant_vlans: Vec<&str> = plan
        .tenants
        .iter()
        .filter(|t| Some(&t.name) == e.tenant.as_ref())
        .flat_map(|t| t.vlans.iter().map(String::as_str))
        .collect();
    let mut best: Option<(u8, String)> = None;
    for link in &plan.links {
        let ifaces = std::iter::once((link.name.as_str(), &link.addresses))
            .chain(link.vlans.iter().map(|v| (v.name.as_str(), &v.addresses)));
        for (ifname, addrs) in ifaces {
            for a in addrs {
                let Ok(net) = a.parse::<IpNet>() else { continue };
                let ip = net.addr().to_string();
                if !serving.contains(&ip) {
                    continue;
                }
                let holds = clients.iter().any(|c| net.trunc().contains(c) || c.contains(&net.addr()));
                let rank = match (tenant_vlans.contains(&ifname), holds) {
                    (true, _) => 3,
                    (false, true) => 2,
                    (false, false) => 1,
                };
                if best.as_ref().is_none_or(|(r, _)| rank > *r) {
                    best = Some((rank, ip));
                }
            }
        }
    }
    best.map(|(_, ip)| ip)
}

/// A DNS-1123 label from free text: lowercase letters, digits and dashes, at most 63 (the
/// transport's suffix is added after, so at most 57 here).
fn dns_label(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out.trim_matches('-');
    out[..out.len().min(57)].trim_end_matches('-').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels() {
        assert_eq!(dns_label("qemu-dev-tank/teams/vision"), "qemu-dev-tank-teams-vision");
        assert_eq!(dns_label("A_b.c:d//e"), "a-b-c-d-e");
        assert!(dns_label(&"x/".repeat(60)).len() <= 57);
    }

    #[test]
    fn quantities_are_binary_units() {
        assert_eq!(quantity(64 << 20), "64Mi");
        assert_eq!(quantity(3 << 40), "3Ti");
        assert_eq!(quantity(1000), "1000");
    }
}
