//! Typed ZFS state from OpenZFS 2.3's JSON output (`zpool status -j --json-int`,
//! `zpool list -j --json-int`, `zfs list|get -j --json-int`).
//!
//! `--json-int` is always used: without it every number is a string, and with it GUIDs are
//! full 64-bit integers, which is why they are `u64` here (tools that read JSON numbers as
//! doubles, like jq, round them). The output format is pinned: an `output_version` other than
//! the one these types were written against is an error, not a guess.

use std::collections::BTreeMap;

use indexmap::IndexMap;

use serde::{Deserialize, Serialize};

pub mod snapshot;
pub mod summary;

/// The JSON output version these types describe (OpenZFS 2.3: 0.1).
pub const OUTPUT_MAJOR: u32 = 0;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{command}` printed JSON nasos cannot read: {source}")]
    Parse { command: String, source: serde_json::Error },
    #[error("`{command}` speaks JSON output version {major}.{minor}; nasos reads version {OUTPUT_MAJOR}.x")]
    Version { command: String, major: u32, minor: u32 },
    #[error(transparent)]
    Run(#[from] nasos_exec::Error),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputVersion {
    pub command: String,
    pub vers_major: u32,
    pub vers_minor: u32,
}

/// `zpool status -j --json-int`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub output_version: OutputVersion,
    #[serde(default)]
    pub pools: BTreeMap<String, PoolStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolStatus {
    pub name: String,
    pub state: String,
    pub pool_guid: u64,
    pub txg: u64,
    #[serde(default)]
    pub spa_version: Option<u64>,
    #[serde(default)]
    pub zpl_version: Option<u64>,
    /// What is wrong, when something is (`status`/`action` in the text output).
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub action: Option<String>,
    #[serde(default)]
    pub error_count: Option<u64>,
    /// The root vdev, keyed by the pool's name; children in the order ZFS lists them.
    #[serde(default)]
    pub vdevs: IndexMap<String, Vdev>,
    /// Hot spares, cache and log devices, when the pool has them (kept apart from the data
    /// vdevs by `zpool status`).
    #[serde(default)]
    pub spares: IndexMap<String, Vdev>,
    #[serde(default)]
    pub l2cache: IndexMap<String, Vdev>,
    #[serde(default)]
    pub logs: IndexMap<String, Vdev>,
    /// Scrub/resilver progress; kept as JSON since nasos only shows it.
    #[serde(default)]
    pub scan_stats: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Vdev {
    pub name: String,
    /// Absent for some vdevs while a member is being replaced (seen with zpool 2.3.9 right
    /// after a `zpool replace` finished its resilver).
    #[serde(default)]
    pub vdev_type: String,
    #[serde(default)]
    pub guid: u64,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub class: Option<String>,
    /// Absent, like `vdev_type`, for a vdev zpool 2.3.9 lists while a replace winds up.
    #[serde(default = "unknown")]
    pub state: String,
    #[serde(default)]
    pub alloc_space: Option<u64>,
    #[serde(default)]
    pub total_space: Option<u64>,
    #[serde(default)]
    pub read_errors: u64,
    #[serde(default)]
    pub write_errors: u64,
    #[serde(default)]
    pub checksum_errors: u64,
    #[serde(default)]
    pub slow_ios: Option<u64>,
    #[serde(default)]
    pub vdevs: IndexMap<String, Vdev>,
}

fn number_or_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(Option::<Value>::deserialize(d)?.and_then(|v| v.as_u64()))
}

fn unknown() -> String {
    "UNKNOWN".to_string()
}

/// A property's value: a number with `--json-int` where ZFS has one, else text ("-", "1.00x").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Value {
    Int(u64),
    Text(String),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Int(n) => Some(*n),
            Value::Text(t) => t.parse().ok(),
        }
    }

    /// The value as `zfs get -p` would print it.
    pub fn text(&self) -> String {
        match self {
            Value::Int(n) => n.to_string(),
            Value::Text(t) => t.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Source {
    #[serde(rename = "type")]
    pub kind: String,
    pub data: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Property {
    pub value: Value,
    pub source: Source,
}

/// `zpool list|get -j --json-int`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolList {
    pub output_version: OutputVersion,
    #[serde(default)]
    pub pools: BTreeMap<String, PoolProperties>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolProperties {
    pub name: String,
    pub state: String,
    pub pool_guid: u64,
    #[serde(default)]
    pub properties: BTreeMap<String, Property>,
}

/// `zfs list|get -j --json-int`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetList {
    pub output_version: OutputVersion,
    #[serde(default)]
    pub datasets: BTreeMap<String, Dataset>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dataset {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub pool: String,
    /// A number with `--json-int`, text without it.
    #[serde(default, deserialize_with = "number_or_text")]
    pub createtxg: Option<u64>,
    /// For a snapshot: the dataset it is of, and its name after the `@`.
    #[serde(default)]
    pub dataset: Option<String>,
    #[serde(default)]
    pub snapshot_name: Option<String>,
    #[serde(default)]
    pub properties: BTreeMap<String, Property>,
}

impl Dataset {
    pub fn value(&self, prop: &str) -> Option<&Value> {
        self.properties.get(prop).map(|p| &p.value)
    }
}

impl PoolProperties {
    pub fn value(&self, prop: &str) -> Option<&Value> {
        self.properties.get(prop).map(|p| &p.value)
    }
}

fn parse<T: serde::de::DeserializeOwned>(command: &str, json: &str) -> Result<T, Error> {
    // The version is checked before the shape, so a new format is named as such.
    #[derive(Deserialize)]
    struct Versioned {
        output_version: OutputVersion,
    }
    let v: Versioned = serde_json::from_str(json).map_err(|source| Error::Parse { command: command.into(), source })?;
    if v.output_version.vers_major != OUTPUT_MAJOR {
        return Err(Error::Version {
            command: command.into(),
            major: v.output_version.vers_major,
            minor: v.output_version.vers_minor,
        });
    }
    serde_json::from_str(json).map_err(|source| Error::Parse { command: command.into(), source })
}

pub fn parse_status(json: &str) -> Result<Status, Error> {
    parse("zpool status", json)
}

pub fn parse_pool_list(json: &str) -> Result<PoolList, Error> {
    parse("zpool list", json)
}

pub fn parse_datasets(json: &str) -> Result<DatasetList, Error> {
    parse("zfs list", json)
}

pub(crate) fn run(program: &str, args: &[&str]) -> Result<String, Error> {
    Ok(nasos_exec::run(program, args)?)
}

/// The status of every imported pool (or of `pool`).
pub fn status(pool: Option<&str>) -> Result<Status, Error> {
    let mut args = vec!["status", "-j", "--json-int"];
    args.extend(pool);
    parse_status(&run("zpool", &args)?)
}

/// Pool properties (`zpool get`), e.g. size, allocated, free, health.
pub fn pool_properties(props: &[&str]) -> Result<PoolList, Error> {
    let list = props.join(",");
    let out = run("zpool", &["get", "-j", "--json-int", &list])?;
    parse_pool_list(&out)
}

/// Filesystem and volume properties (`zfs get`), for `datasets` (all when empty; snapshots,
/// which can be thousands, are left out).
pub fn dataset_properties(props: &[&str], datasets: &[&str]) -> Result<DatasetList, Error> {
    let list = props.join(",");
    let mut args = vec!["get", "-j", "--json-int", "-t", "filesystem,volume", list.as_str()];
    args.extend(datasets);
    parse_datasets(&run("zfs", &args)?)
}
