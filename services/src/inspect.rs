//! What `nasctl pools`, `nasctl exports` and `nasctl fabric` show: the running state, read from
//! ZFS, the kernel NFS server, sysfs and dcbnl — not the plan's wishes, which `nasos plan` shows.

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::{nfsd, rdma};

#[derive(Debug, Serialize)]
pub struct PoolView {
    pub name: String,
    pub state: String,
    pub guid: u64,
    pub size: Option<u64>,
    pub allocated: Option<u64>,
    pub free: Option<u64>,
    pub errors: u64,
    /// A running resilver or scrub: what and how far, in percent.
    pub scan: Option<ScanView>,
    pub members: Vec<nasos_zfs::summary::Member>,
    pub datasets: Vec<DatasetView>,
}

#[derive(Debug, Serialize)]
pub struct ScanView {
    /// resilver or scrub.
    pub function: String,
    pub percent: f64,
}

#[derive(Debug, Serialize)]
pub struct DatasetView {
    pub name: String,
    pub used: Option<u64>,
    pub available: Option<u64>,
    /// 0 means none.
    pub quota: Option<u64>,
    pub mountpoint: String,
    pub mounted: bool,
}

pub fn pools() -> anyhow::Result<Vec<PoolView>> {
    let status = nasos_zfs::status(None)?;
    if status.pools.is_empty() {
        return Ok(Vec::new());
    }
    let props = nasos_zfs::pool_properties(&["size", "allocated", "free"])?;
    let sets = nasos_zfs::dataset_properties(&["used", "available", "quota", "mountpoint", "mounted"], &[])?;
    let mut out = Vec::new();
    for pool in status.pools.values() {
        let p = props.pools.get(&pool.name);
        let num = |k: &str| p.and_then(|p| p.value(k)).and_then(nasos_zfs::Value::as_u64);
        let datasets = sets
            .datasets
            .values()
            .filter(|d| d.pool == pool.name)
            .map(|d| DatasetView {
                name: d.name.clone(),
                used: d.value("used").and_then(nasos_zfs::Value::as_u64),
                available: d.value("available").and_then(nasos_zfs::Value::as_u64),
                quota: d.value("quota").and_then(nasos_zfs::Value::as_u64),
                mountpoint: d.value("mountpoint").map(nasos_zfs::Value::text).unwrap_or_default(),
                mounted: d.value("mounted").is_some_and(|v| v.text() == "yes"),
            })
            .collect();
        out.push(PoolView {
            name: pool.name.clone(),
            state: pool.state.clone(),
            guid: pool.pool_guid,
            size: num("size"),
            allocated: num("allocated"),
            free: num("free"),
            errors: nasos_zfs::summary::errors(pool),
            scan: pool
                .scan_stats
                .as_ref()
                .and_then(crate::health::observe::scan)
                .map(|(function, percent)| ScanView { function, percent }),
            members: nasos_zfs::summary::members(pool),
            datasets,
        });
    }
    Ok(out)
}

/// One tenant's space against its quota, for `nasctl tenants` and the metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantView {
    pub name: String,
    pub dataset: String,
    pub networks: Vec<String>,
    /// Its subtree's space, snapshots included; `None` while the dataset is not there (pool
    /// not imported yet).
    pub used: Option<u64>,
    /// 0 or none: no quota.
    pub quota: Option<u64>,
    pub available: Option<u64>,
    pub reservation: Option<u64>,
    /// Its exports (datasets).
    pub exports: Vec<String>,
    pub squash: String,
}

impl TenantView {
    /// Used against quota, in percent; `None` without a quota.
    pub fn percent(&self) -> Option<f64> {
        match (self.used, self.quota) {
            (Some(u), Some(q)) if q > 0 => Some(u as f64 * 100.0 / q as f64),
            _ => None,
        }
    }
}

/// The tenants of `plan`, with what ZFS says of their datasets (`datasets`: `zfs get` of used,
/// quota, available and reservation). Pure, so the host tests reach it.
pub fn tenant_views(plan: &nasos_board::Plan, datasets: &nasos_zfs::DatasetList) -> Vec<TenantView> {
    plan.tenants
        .iter()
        .map(|t| {
            let d = datasets.datasets.get(&t.dataset);
            let num = |k: &str| d.and_then(|d| d.value(k)).and_then(nasos_zfs::Value::as_u64);
            TenantView {
                name: t.name.clone(),
                dataset: t.dataset.clone(),
                networks: t.networks.clone(),
                used: num("used"),
                quota: num("quota"),
                available: num("available"),
                reservation: num("reservation"),
                exports: plan
                    .nfs
                    .iter()
                    .flat_map(|n| n.exports.iter())
                    .filter(|e| e.tenant.as_deref() == Some(t.name.as_str()))
                    .map(|e| e.dataset.clone())
                    .collect(),
                squash: t.squash.clone(),
            }
        })
        .collect()
}

/// The tenants as they are now.
pub fn tenants(plan: &nasos_board::Plan) -> anyhow::Result<Vec<TenantView>> {
    if plan.tenants.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<&str> = plan.tenants.iter().map(|t| t.dataset.as_str()).collect();
    // Asked one by one would fail as a whole for one missing dataset; all at once and then
    // picked, a missing one just has no figures.
    let sets = nasos_zfs::dataset_properties(&["used", "quota", "available", "reservation"], &[])
        .with_context(|| format!("reading the space of {}", names.join(", ")))?;
    Ok(tenant_views(plan, &sets))
}

pub fn exports() -> nfsd::NfsState {
    nfsd::state()
}

#[derive(Debug, Serialize)]
pub struct LinkView {
    pub link: String,
    pub operstate: String,
    pub mtu: u32,
    pub addresses: Vec<String>,
    pub rdma: Vec<rdma::Port>,
    pub dcb: DcbView,
}

#[derive(Debug, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum DcbView {
    /// The NIC answered dcbnl: what it runs now.
    Applied {
        pfc_enabled: Vec<u8>,
        ets_bandwidth: Option<[u8; 8]>,
        dscp: Vec<(u8, u8)>,
    },
    NotSupported,
    Error {
        message: String,
    },
}

/// `ip -j addr show dev X`, the parts nasctl shows.
#[derive(Deserialize)]
struct IpLink {
    #[serde(default)]
    operstate: String,
    #[serde(default)]
    mtu: u32,
    #[serde(default)]
    addr_info: Vec<IpAddr>,
}

#[derive(Deserialize)]
struct IpAddr {
    family: String,
    local: String,
    prefixlen: u8,
}

pub fn fabric() -> anyhow::Result<Vec<LinkView>> {
    let plan = crate::plan()?;
    let Some(fabric) = plan.fabric else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for fl in &fabric.links {
        let json = crate::run("ip", &["-j", "addr", "show", "dev", &fl.link])?;
        let links: Vec<IpLink> = serde_json::from_str(&json).context("reading `ip -j addr`")?;
        let l = links.into_iter().next().with_context(|| format!("no link {}", fl.link))?;
        let dcb = match nasos_dcbnl::Socket::open().and_then(|mut s| s.get(&fl.link)) {
            Ok(ieee) => DcbView::Applied {
                pfc_enabled: ieee
                    .pfc
                    .map(|p| (0..8).filter(|i| p.pfc_en & (1 << i) != 0).collect())
                    .unwrap_or_default(),
                ets_bandwidth: ieee.ets.map(|e| e.tc_tx_bw),
                dscp: ieee.dscp_apps().map(|a| (a.protocol as u8, a.priority)).collect(),
            },
            Err(nasos_dcbnl::Error::NotSupported) => DcbView::NotSupported,
            Err(e) => DcbView::Error { message: e.to_string() },
        };
        out.push(LinkView {
            link: fl.link.clone(),
            operstate: l.operstate,
            mtu: l.mtu,
            addresses: l
                .addr_info
                .iter()
                .filter(|a| a.family == "inet" || a.family == "inet6")
                .map(|a| format!("{}/{}", a.local, a.prefixlen))
                .collect(),
            rdma: rdma::ports_on(&fl.link),
            dcb,
        });
    }
    Ok(out)
}

/// The firewall as the kernel runs it: nasos's nftables table with its rules and the count of
/// what was dropped (`nft list`, or nft's own JSON). Errors when the table is not loaded.
pub fn firewall(json: bool) -> anyhow::Result<String> {
    let table = nasos_board::plan::firewall::TABLE;
    let mut args = vec!["list", "table", "inet", table];
    if json {
        args.insert(0, "-j");
    }
    crate::run(nasos_layout::paths::NFT, &args).with_context(|| {
        format!(
            "the firewall table inet {table} is not loaded (see `nasctl logs firewall`): this box answers on every port"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_is_read_from_its_dataset_and_one_not_there_has_no_figures() {
        let mut plan = nasos_board::Plan::empty("box");
        for (name, dataset) in [("vision", "tank/teams/vision"), ("speech", "tank/teams/speech")] {
            plan.tenants.push(nasos_board::plan::TenantPlan {
                name: name.into(),
                dataset: dataset.into(),
                networks: vec!["10.77.0.128/26".into()],
                quota_bytes: None,
                reservation_bytes: None,
                squash: "root".into(),
                vlans: Vec::new(),
            });
        }
        let json = r#"{"output_version":{"command":"zfs get","vers_major":0,"vers_minor":1},"datasets":{
            "tank/teams/vision":{"name":"tank/teams/vision","type":"FILESYSTEM","pool":"tank","createtxg":25,"properties":{
              "used":{"value":50331648,"source":{"type":"NONE","data":"-"}},
              "quota":{"value":67108864,"source":{"type":"LOCAL","data":"-"}},
              "available":{"value":16777216,"source":{"type":"NONE","data":"-"}},
              "reservation":{"value":0,"source":{"type":"DEFAULT","data":"-"}}}}}}"#;
        let sets: nasos_zfs::DatasetList = serde_json::from_str(json).expect("zfs get -j");
        let v = tenant_views(&plan, &sets);
        assert_eq!(v.len(), 2);
        assert_eq!((v[0].used, v[0].quota, v[0].available), (Some(48 << 20), Some(64 << 20), Some(16 << 20)));
        assert_eq!(v[0].percent().map(|p| p.round()), Some(75.0));
        assert_eq!((v[1].used, v[1].percent()), (None, None));
    }
}
