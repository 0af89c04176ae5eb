//! `nasos sbom RECIPE`: what an image is made of, as an SPDX 2.3 JSON document — every Debian
//! package of the recipe's lock (version, architecture, the .deb's sha256, the archive it comes
//! from as a package URL), the ZFS module nasos builds from the locked `zfs-dkms` for the locked
//! kernel, and the Rust crates of nasos's own programs (the workspace's Cargo.lock, compiled in).
//! Made from the lock alone, so it is the same document on any host and describes exactly what
//! `nasos build` puts in the image; `creationInfo.created` is the lock's epoch.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::lock::Lock;

/// The workspace's lock: the crates nasinit, nasctl and the agents are built from.
const CARGO_LOCK: &str = include_str!("../../Cargo.lock");

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Document {
    spdx_version: &'static str,
    data_license: &'static str,
    #[serde(rename = "SPDXID")]
    spdx_id: &'static str,
    name: String,
    document_namespace: String,
    creation_info: CreationInfo,
    packages: Vec<Package>,
    relationships: Vec<Relationship>,
}

#[derive(Serialize)]
struct CreationInfo {
    created: String,
    creators: Vec<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Package {
    #[serde(rename = "SPDXID")]
    spdx_id: String,
    name: String,
    version_info: String,
    supplier: String,
    download_location: String,
    files_analyzed: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    checksums: Vec<Checksum>,
    license_concluded: &'static str,
    license_declared: &'static str,
    copyright_text: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    comment: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    external_refs: Vec<ExternalRef>,
}

#[derive(Serialize)]
struct Checksum {
    algorithm: &'static str,
    #[serde(rename = "checksumValue")]
    value: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ExternalRef {
    reference_category: &'static str,
    reference_type: &'static str,
    reference_locator: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Relationship {
    spdx_element_id: String,
    relationship_type: &'static str,
    related_spdx_element: String,
}

/// A Cargo.lock package (the fields an SBOM needs).
#[derive(serde::Deserialize)]
struct CargoPackage {
    name: String,
    version: String,
    source: Option<String>,
    checksum: Option<String>,
}

#[derive(serde::Deserialize)]
struct CargoLock {
    #[serde(rename = "package")]
    packages: Vec<CargoPackage>,
}

/// An SPDX identifier from free text: letters, digits, `.` and `-` only.
fn spdx_ref(kind: &str, name: &str) -> String {
    let clean: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '-' }).collect();
    format!("SPDXRef-{kind}-{clean}")
}

fn purl_escape(s: &str) -> String {
    s.replace('%', "%25").replace('+', "%2B").replace(':', "%3A")
}

/// The SBOM of an image: its name and version, its lock, nasos's version.
pub fn document(image: &str, version: &str, lock: &Lock, nasos_version: &str) -> anyhow::Result<Document> {
    let lock_text = lock.to_toml()?;
    let digest = crate::stage::hex(&Sha256::digest(lock_text.as_bytes()));
    let created = time::OffsetDateTime::from_unix_timestamp(i64::try_from(lock.epoch)?)?
        .format(&time::format_description::well_known::Rfc3339)?;
    // The release the packages belong to (the purl's distro): the first source's suite.
    let release = lock.sources.first().and_then(|s| crate::archive::suite_of(s)).unwrap_or("trixie").to_string();
    let root = spdx_ref("Image", image);
    let mut packages = vec![Package {
        spdx_id: root.clone(),
        name: image.to_string(),
        version_info: version.to_string(),
        supplier: "NOASSERTION".into(),
        download_location: "NOASSERTION".into(),
        files_analyzed: false,
        checksums: Vec::new(),
        license_concluded: "NOASSERTION",
        license_declared: "NOASSERTION",
        copyright_text: "NOASSERTION",
        comment: Some(format!("nasos image built from its lock (sha256 {digest}) by nasos {nasos_version}")),
        external_refs: Vec::new(),
    }];
    let deb = |p: &crate::lock::LockedPackage, kind: &str, comment: String| Package {
        spdx_id: spdx_ref(kind, &format!("{}-{}", p.name, p.architecture)),
        name: p.name.clone(),
        version_info: p.version.clone(),
        supplier: "Organization: Debian".into(),
        download_location: "NOASSERTION".into(),
        files_analyzed: false,
        checksums: vec![Checksum { algorithm: "SHA256", value: p.sha256.clone() }],
        license_concluded: "NOASSERTION",
        license_declared: "NOASSERTION",
        copyright_text: "NOASSERTION",
        comment: Some(comment),
        external_refs: vec![ExternalRef {
            reference_category: "PACKAGE-MANAGER",
            reference_type: "purl",
            reference_locator: format!(
                "pkg:deb/debian/{}@{}?arch={}&distro=debian-{release}",
                p.name,
                purl_escape(&p.version),
                p.architecture
            ),
        }],
    };
    for p in &lock.packages {
        packages.push(deb(p, "Deb", format!("from the {} archive", p.suite)));
    }
    if let (Some(zfs), Ok((kernel, _))) = (lock.version_of("zfs-dkms"), crate::zfs::kernel(lock)) {
        packages.push(Package {
            spdx_id: spdx_ref("Module", "zfs"),
            name: "zfs-kernel-modules".into(),
            version_info: zfs.to_string(),
            supplier: "NOASSERTION".into(),
            download_location: "NOASSERTION".into(),
            files_analyzed: false,
            checksums: Vec::new(),
            license_concluded: "NOASSERTION",
            license_declared: "CDDL-1.0",
            copyright_text: "NOASSERTION",
            comment: Some(format!("zfs.ko and spl.ko, built by DKMS from zfs-dkms {zfs} for kernel {kernel}")),
            external_refs: Vec::new(),
        });
    }
    let cargo: CargoLock = toml::from_str(CARGO_LOCK)?;
    for c in cargo.packages.iter().filter(|c| c.source.is_some()) {
        packages.push(Package {
            spdx_id: spdx_ref("Crate", &format!("{}-{}", c.name, c.version)),
            name: c.name.clone(),
            version_info: c.version.clone(),
            supplier: "NOASSERTION".into(),
            download_location: format!("https://crates.io/api/v1/crates/{}/{}/download", c.name, c.version),
            files_analyzed: false,
            checksums: c.checksum.iter().map(|sum| Checksum { algorithm: "SHA256", value: sum.clone() }).collect(),
            license_concluded: "NOASSERTION",
            license_declared: "NOASSERTION",
            copyright_text: "NOASSERTION",
            comment: Some("a Rust crate of nasos's programs (nasinit, nasctl, the agents)".into()),
            external_refs: vec![ExternalRef {
                reference_category: "PACKAGE-MANAGER",
                reference_type: "purl",
                reference_locator: format!("pkg:cargo/{}@{}", c.name, c.version),
            }],
        });
    }
    // The ZFS module's build root is not in the image: it made the module that is.
    let module = spdx_ref("Module", "zfs");
    let has_module = packages.iter().any(|p| p.spdx_id == module);
    let mut relationships: Vec<Relationship> = packages
        .iter()
        .skip(1)
        .map(|p| Relationship {
            spdx_element_id: root.clone(),
            relationship_type: "CONTAINS",
            related_spdx_element: p.spdx_id.clone(),
        })
        .collect();
    if has_module {
        for p in &lock.build_packages {
            let built = deb(
                p,
                "BuildDeb",
                format!("from the {} archive; in the ZFS module's build root, not in the image", p.suite),
            );
            relationships.push(Relationship {
                spdx_element_id: built.spdx_id.clone(),
                relationship_type: "BUILD_DEPENDENCY_OF",
                related_spdx_element: module.clone(),
            });
            packages.push(built);
        }
    }
    relationships.push(Relationship {
        spdx_element_id: "SPDXRef-DOCUMENT".into(),
        relationship_type: "DESCRIBES",
        related_spdx_element: root.clone(),
    });
    Ok(Document {
        spdx_version: "SPDX-2.3",
        data_license: "CC0-1.0",
        spdx_id: "SPDXRef-DOCUMENT",
        name: format!("{image}-{version}"),
        document_namespace: format!("https://nasos.invalid/spdx/{image}-{version}-{}", &digest[..16]),
        creation_info: CreationInfo { created, creators: vec![format!("Tool: nasos-{nasos_version}")] },
        packages,
        relationships,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::LockedPackage;

    fn lock() -> Lock {
        let p = |name: &str, version: &str| LockedPackage {
            name: name.into(),
            version: version.into(),
            architecture: "amd64".into(),
            sha256: "ab".repeat(32),
            suite: "trixie".into(),
        };
        Lock {
            sources: crate::archive::SOURCES.iter().map(|s| s.to_string()).collect(),
            epoch: 1796083200,
            packages: vec![
                p("linux-image-6.12.117+deb13-amd64", "6.12.117-1"),
                p("zfs-dkms", "2.3.9-0+deb13u1"),
                p("libc6", "2.41-12"),
            ],
            build_packages: vec![p("gcc-14", "14.2.0-19"), p("libc6", "2.41-12")],
        }
    }

    #[test]
    fn every_locked_package_is_listed_with_its_version_hash_and_purl() {
        let d = document("qemu-dev", "0.1.0", &lock(), "0.1.0").expect("sbom");
        let json = serde_json::to_value(&d).expect("json");
        assert_eq!(json["spdxVersion"], "SPDX-2.3");
        assert_eq!(json["creationInfo"]["created"], "2026-12-01T00:00:00Z");
        let pkgs = json["packages"].as_array().expect("packages");
        let libc = pkgs.iter().find(|p| p["name"] == "libc6").expect("libc6");
        assert_eq!(libc["versionInfo"], "2.41-12");
        assert_eq!(libc["checksums"][0]["checksumValue"], "ab".repeat(32));
        assert_eq!(
            libc["externalRefs"][0]["referenceLocator"],
            "pkg:deb/debian/libc6@2.41-12?arch=amd64&distro=debian-trixie"
        );
        let kernel = pkgs.iter().find(|p| p["name"] == "linux-image-6.12.117+deb13-amd64").expect("kernel");
        assert_eq!(kernel["SPDXID"], "SPDXRef-Deb-linux-image-6.12.117-deb13-amd64-amd64");
        assert!(pkgs.iter().any(|p| p["name"] == "zfs-kernel-modules" && p["versionInfo"] == "2.3.9-0+deb13u1"));
        assert!(pkgs.iter().any(|p| p["name"] == "serde"), "nasos's crates are listed");
        // Every package but the image and the build root is contained in it, and the document
        // describes the image; the build root's packages are the module's build dependencies,
        // under identifiers of their own (libc6 is in both).
        let rels = json["relationships"].as_array().expect("relationships");
        assert_eq!(rels.len(), pkgs.len());
        let gcc = pkgs.iter().find(|p| p["name"] == "gcc-14").expect("the build root's compiler");
        assert_eq!(gcc["SPDXID"], "SPDXRef-BuildDeb-gcc-14-amd64");
        let rel_of = |id: &serde_json::Value| {
            rels.iter().find(|r| r["spdxElementId"] == *id || r["relatedSpdxElement"] == *id).expect("related")
        };
        assert_eq!(rel_of(&gcc["SPDXID"])["relationshipType"], "BUILD_DEPENDENCY_OF");
        assert_eq!(rel_of(&gcc["SPDXID"])["relatedSpdxElement"], "SPDXRef-Module-zfs");
        assert_eq!(rel_of(&libc["SPDXID"])["relationshipType"], "CONTAINS");
        let ids: std::collections::BTreeSet<_> = pkgs.iter().map(|p| p["SPDXID"].as_str().expect("id")).collect();
        assert_eq!(ids.len(), pkgs.len(), "identifiers are unique");
        // The same lock gives the same document.
        let again = serde_json::to_value(document("qemu-dev", "0.1.0", &lock(), "0.1.0").expect("sbom")).expect("json");
        assert_eq!(json, again);
    }
}
