//! A `CiliumNode` kept in a file (`--node-resource FILE`) that an external tool
//! writes and the daemon watches: YAML or JSON, `apiVersion: cilium.io/v2`,
//! `kind: CiliumNode`, as `kubectl get ciliumnode <node> -o yaml|json` prints it.
//!
//! # The two-writer rule
//!
//! * The external tool owns `metadata`, `spec` and the inventory parts of
//!   `status` the operator side writes in Cilium ([`EXTERNAL_STATUS_KEYS`]:
//!   `status.eni`, `status.azure`, `status.alibaba-cloud`).
//! * The daemon owns the rest of `status` (`status.ipam`: `used`,
//!   `ipv6-used`, `operator-status`, ...). It never writes `spec`: what
//!   Cilium's agent would write there (ENI mode's `spec.ipam.pools`) is derived
//!   in memory ([`crate::ipam::eni::eni_allocation`]).
//! * [`CiliumNodeFile::write_status`] re-reads the file right before writing,
//!   replaces only the daemon's part of `status` (everything else is kept as the
//!   external writer wrote it: unknown fields included), writes a temporary
//!   file in the same directory, re-reads the file just before renaming the
//!   temporary file over it and, if the file changed in between (a spec edit),
//!   starts again from the new content, at most [`WRITE_ATTEMPTS`] times. So an
//!   update of the external writer that lands before the final check is never
//!   lost. The check and the rename are not one atomic step: a write landing in
//!   that window (microseconds) is overwritten. External writers are expected
//!   to do the same (write a temporary file and rename it, keep `status.ipam`
//!   as they found it, or write spec-only patches that way), and to retry when
//!   their own check fails.
//! * A symlinked path is resolved: the rename replaces the link's target.
//!
//! # What survives a round trip
//!
//! The document is rewritten from a parsed tree (`serde_yaml_ng::Value`, which
//! keeps key order, or `serde_json::Value`), so the meaning of every field is
//! kept, but not the bytes: **YAML comments, anchors and quoting style are
//! lost**, and a JSON file comes back pretty-printed with its keys sorted.
//! A write that would not change the document does not touch the file.
//!
//! # Polling
//!
//! [`Fingerprint`] hashes the document's meaning minus `status.ipam`, so the
//! daemon's own status writes do not show up as changes and any edit of the
//! external writer does (including one merged during a `write_status` retry).

use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::resources::{AllocationIp, NodeResource, decode};

/// The `apiVersion` accepted.
pub const API_VERSION: &str = "cilium.io/v2";
/// The `kind` accepted.
pub const KIND: &str = "CiliumNode";
/// `write_status` gives up after this many tries when the file keeps changing.
pub const WRITE_ATTEMPTS: usize = 5;
/// `status` keys the external writer owns (the operator-side inventories);
/// `write_status` keeps them as they are in the file.
pub const EXTERNAL_STATUS_KEYS: &[&str] = &["eni", "azure", "alibaba-cloud"];

/// How the file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    Yaml,
    Json,
}

/// What the external writer owns in the file (see the module comment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

/// A loaded node-resource file.
#[derive(Debug, Clone)]
pub struct CiliumNodeFile {
    path: PathBuf,
    format: FileFormat,
    name: String,
    fingerprint: Fingerprint,
}

/// Why the node-resource file could not be read or written: the path, and what
/// is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", .path.display())]
pub struct NodeFileError {
    pub path: PathBuf,
    #[source]
    pub problem: NodeFileProblem,
}

/// What is wrong with the node-resource file (or with writing it).
#[derive(Debug, thiserror::Error)]
pub enum NodeFileProblem {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("invalid JSON: {0}")]
    InvalidJson(#[source] serde_json::Error),
    #[error("invalid YAML: {0}")]
    InvalidYaml(#[source] serde_yaml_ng::Error),
    #[error("unsupported YAML: {0}")]
    UnsupportedYaml(#[source] serde_json::Error),
    #[error("empty file: expected one {KIND}")]
    Empty,
    #[error("{0} YAML documents: expected exactly one {KIND}")]
    ManyDocuments(usize),
    #[error("not an object: expected one {KIND}")]
    NotAnObject,
    #[error("kind is {0:?}, expected {KIND}")]
    WrongKind(String),
    #[error("kind is missing, expected {KIND}")]
    NoKind,
    #[error("apiVersion is {0:?}, expected {API_VERSION}")]
    WrongApiVersion(String),
    #[error("apiVersion is missing, expected {API_VERSION}")]
    NoApiVersion,
    #[error("metadata.name is missing")]
    NoName,
    /// The document does not decode as a `CiliumNode` (the decoder's words: the
    /// field and what is wrong with it).
    #[error("not a valid {KIND}: {0}")]
    NotACiliumNode(String),
    /// A field (or map key) that must be an address is not one.
    #[error("{field} {value:?} is not an IP address")]
    NotAnAddress { field: String, value: String },
    /// A map key of an `ipv6-` map is an IPv4 address.
    #[error("{field}: {value:?} is not an IPv6 address")]
    NotAnIpv6Address { field: String, value: String },
    /// The ENI inventory is inconsistent (`ipam::eni`'s check says how).
    #[error("status.eni.enis: {0}")]
    EniInventory(#[source] crate::ipam::eni::EniError),
    #[error("writing status: the status is not an object")]
    StatusNotAnObject,
    #[error("writing status: {0}")]
    EncodeJson(#[source] serde_json::Error),
    #[error("writing status: {0}")]
    EncodeYaml(#[source] serde_yaml_ng::Error),
    #[error("no parent directory")]
    NoParent,
    #[error("the file now describes node {found:?}, not {expected:?}: status not written")]
    OtherNode { found: String, expected: String },
    #[error("writing {}: {source}", .tmp.display())]
    WriteTemporary {
        tmp: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("replacing with {}: {source}", .tmp.display())]
    Replace {
        tmp: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the file changed while the status was being written")]
    Changed,
    #[error("status not written after {WRITE_ATTEMPTS} attempts: {0}")]
    KeptChanging(#[source] Box<NodeFileProblem>),
}

impl NodeFileProblem {
    fn at(self, path: &Path) -> NodeFileError {
        NodeFileError {
            path: path.to_path_buf(),
            problem: self,
        }
    }
}

/// The parsed document, in the file's own tree type.
enum Doc {
    Json(serde_json::Value),
    Yaml(serde_yaml_ng::Value),
}

/// JSON when the first significant character is `{`, else YAML.
fn detect(text: &str) -> FileFormat {
    match text
        .trim_start_matches('\u{feff}')
        .trim_start()
        .chars()
        .next()
    {
        Some('{') => FileFormat::Json,
        _ => FileFormat::Yaml,
    }
}

/// Parses the text into the native tree and its JSON view.
fn parse(text: &str) -> Result<(FileFormat, Doc, serde_json::Value), NodeFileProblem> {
    let format = detect(text);
    let doc = match format {
        FileFormat::Json => Doc::Json(
            serde_json::from_str(text.trim_start_matches('\u{feff}'))
                .map_err(NodeFileProblem::InvalidJson)?,
        ),
        FileFormat::Yaml => {
            let mut docs = Vec::new();
            for d in serde_yaml_ng::Deserializer::from_str(text) {
                let v = <serde_yaml_ng::Value as serde::Deserialize>::deserialize(d)
                    .map_err(NodeFileProblem::InvalidYaml)?;
                if !v.is_null() {
                    docs.push(v);
                }
            }
            match docs.len() {
                0 => return Err(NodeFileProblem::Empty),
                1 => Doc::Yaml(docs.pop().unwrap_or_default()),
                n => return Err(NodeFileProblem::ManyDocuments(n)),
            }
        }
    };
    let json = match &doc {
        Doc::Json(v) => v.clone(),
        Doc::Yaml(v) => serde_json::to_value(v).map_err(NodeFileProblem::UnsupportedYaml)?,
    };
    if !json.is_object() {
        return Err(NodeFileProblem::NotAnObject);
    }
    Ok((format, doc, json))
}

/// kind, apiVersion and metadata.name; returns the name.
fn check_identity(json: &serde_json::Value) -> Result<String, NodeFileProblem> {
    let field = |k: &str| json.get(k).and_then(serde_json::Value::as_str);
    match field("kind") {
        Some(KIND) => {}
        Some(k) => return Err(NodeFileProblem::WrongKind(k.to_string())),
        None => return Err(NodeFileProblem::NoKind),
    }
    match field("apiVersion") {
        Some(API_VERSION) => {}
        Some(v) => return Err(NodeFileProblem::WrongApiVersion(v.to_string())),
        None => return Err(NodeFileProblem::NoApiVersion),
    }
    match json
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(serde_json::Value::as_str)
    {
        Some(n) if !n.is_empty() => Ok(n.to_string()),
        _ => Err(NodeFileProblem::NoName),
    }
}

fn fingerprint_of(json: &serde_json::Value) -> Fingerprint {
    let mut v = json.clone();
    if let Some(st) = v.get_mut("status").and_then(|s| s.as_object_mut()) {
        st.remove("ipam");
        if st.is_empty() {
            v.as_object_mut().map(|o| o.remove("status"));
        }
    }
    let bytes = serde_json::to_vec(&v).unwrap_or_default();
    Fingerprint(Sha256::digest(&bytes).into())
}

/// Addresses of the resource parse (see [`CiliumNodeFile::load`]; its CIDRs are
/// checked when it is read).
fn validate(node: &NodeResource) -> Result<(), NodeFileProblem> {
    for (i, a) in node.spec.addresses.iter().enumerate() {
        a.ip.trim()
            .parse::<IpAddr>()
            .map_err(|_| NodeFileProblem::NotAnAddress {
                field: format!("spec.addresses[{i}].ip"),
                value: a.ip.clone(),
            })?;
    }
    let keys = |what: &str, m: &std::collections::BTreeMap<String, AllocationIp>, v6: bool| {
        for k in m.keys() {
            match k.trim().parse::<IpAddr>() {
                Ok(ip) if v6 && ip.is_ipv4() => {
                    return Err(NodeFileProblem::NotAnIpv6Address {
                        field: what.to_string(),
                        value: k.clone(),
                    });
                }
                Ok(_) => {}
                Err(_) => {
                    return Err(NodeFileProblem::NotAnAddress {
                        field: format!("{what}:"),
                        value: k.clone(),
                    });
                }
            }
        }
        Ok(())
    };
    keys("spec.ipam.pool", &node.spec.ipam.pool, false)?;
    keys("spec.ipam.ipv6-pool", &node.spec.ipam.ipv6_pool, true)?;
    keys("status.ipam.used", &node.status.ipam.used, false)?;
    keys("status.ipam.ipv6-used", &node.status.ipam.ipv6_used, true)?;
    crate::ipam::eni::validate_inventory(&node.status.eni.enis)
        .map_err(NodeFileProblem::EniInventory)
}

/// The file's typed content.
fn typed(json: &serde_json::Value) -> Result<NodeResource, NodeFileProblem> {
    let node: NodeResource = decode(json).map_err(NodeFileProblem::NotACiliumNode)?;
    validate(&node)?;
    Ok(node)
}

/// `status` = the daemon's status with the [`EXTERNAL_STATUS_KEYS`] taken from
/// the file (kept in the file's key order, new keys appended).
fn merged_status_json(
    file: Option<&serde_json::Map<String, serde_json::Value>>,
    daemon: &serde_json::Map<String, serde_json::Value>,
) -> serde_json::Map<String, serde_json::Value> {
    let ext = |k: &str| EXTERNAL_STATUS_KEYS.contains(&k);
    let mut out = serde_json::Map::new();
    for (k, v) in daemon.iter().filter(|(k, _)| !ext(k)) {
        out.insert(k.clone(), v.clone());
    }
    if let Some(file) = file {
        for (k, v) in file.iter().filter(|(k, _)| ext(k)) {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

fn merged_status_yaml(
    file: Option<&serde_yaml_ng::Mapping>,
    daemon: &serde_yaml_ng::Mapping,
) -> serde_yaml_ng::Mapping {
    let ext = |k: &serde_yaml_ng::Value| {
        k.as_str()
            .is_some_and(|k| EXTERNAL_STATUS_KEYS.contains(&k))
    };
    let mut out = serde_yaml_ng::Mapping::new();
    // The file's order first, then keys only the daemon has.
    for (k, v) in file.into_iter().flatten() {
        if ext(k) {
            out.insert(k.clone(), v.clone());
        } else if let Some(d) = daemon.get(k) {
            out.insert(k.clone(), d.clone());
        }
    }
    for (k, v) in daemon {
        if !ext(k) && !out.contains_key(k) {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

/// The document with its `status` replaced; serialized. `parse` made sure the
/// document is an object.
fn with_status(
    doc: Doc,
    status: &serde_json::Map<String, serde_json::Value>,
) -> Result<String, NodeFileProblem> {
    match doc {
        Doc::Json(mut v) => {
            let obj = v.as_object_mut().ok_or(NodeFileProblem::NotAnObject)?;
            let merged = merged_status_json(
                obj.get("status").and_then(serde_json::Value::as_object),
                status,
            );
            obj.insert("status".into(), serde_json::Value::Object(merged));
            serde_json::to_string_pretty(&v)
                .map(|s| s + "\n")
                .map_err(NodeFileProblem::EncodeJson)
        }
        Doc::Yaml(mut v) => {
            let daemon =
                match serde_yaml_ng::to_value(status).map_err(NodeFileProblem::EncodeYaml)? {
                    serde_yaml_ng::Value::Mapping(m) => m,
                    _ => return Err(NodeFileProblem::StatusNotAnObject),
                };
            let map = v.as_mapping_mut().ok_or(NodeFileProblem::NotAnObject)?;
            let merged = merged_status_yaml(
                map.get("status").and_then(serde_yaml_ng::Value::as_mapping),
                &daemon,
            );
            map.insert("status".into(), serde_yaml_ng::Value::Mapping(merged));
            serde_yaml_ng::to_string(&v).map_err(NodeFileProblem::EncodeYaml)
        }
    }
}

impl CiliumNodeFile {
    /// Reads and checks the file: one YAML document or JSON object, `kind:
    /// CiliumNode`, `apiVersion: cilium.io/v2`, a `metadata.name`, fields of
    /// the right types, and addresses that are addresses: `spec.addresses`,
    /// `spec.ipam.podCIDRs`, `spec.ipam.pools.allocated`, the keys of
    /// `spec.ipam.pool` / `ipv6-pool` and `status.ipam.used` / `ipv6-used`
    /// (the `ipv6-` maps IPv6 only) and the ENI inventory
    /// ([`crate::ipam::eni::validate_inventory`]: addresses inside their ENI's
    /// subnet). Every error starts with the path.
    pub fn load(path: impl AsRef<Path>) -> Result<(CiliumNodeFile, NodeResource), NodeFileError> {
        let path = path.as_ref();
        let read = || -> Result<_, NodeFileProblem> {
            let text = fs::read_to_string(path)?;
            let (format, _doc, json) = parse(&text)?;
            let name = check_identity(&json)?;
            let node = typed(&json)?;
            Ok((format, json, name, node))
        };
        let (format, json, name, node) = read().map_err(|p| p.at(path))?;
        Ok((
            CiliumNodeFile {
                path: path.to_path_buf(),
                format,
                name,
                fingerprint: fingerprint_of(&json),
            },
            node,
        ))
    }

    /// The path given to [`load`](Self::load).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format found at load.
    pub fn format(&self) -> FileFormat {
        self.format
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fingerprint of what was loaded.
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// The fingerprint of the file as it is now (read and parsed).
    pub fn current_fingerprint(path: impl AsRef<Path>) -> Result<Fingerprint, NodeFileError> {
        let path = path.as_ref();
        let read = || -> Result<_, NodeFileProblem> {
            let (_, _, json) = parse(&fs::read_to_string(path)?)?;
            Ok(fingerprint_of(&json))
        };
        read().map_err(|p| p.at(path))
    }

    /// Whether the external writer changed the file since it was loaded (a
    /// file that cannot be read or parsed counts as changed: reloading reports
    /// why). The daemon's own status writes do not count.
    pub fn changed(&self) -> bool {
        Self::current_fingerprint(&self.path).map_or(true, |f| f != self.fingerprint)
    }

    /// Replaces the daemon's part of `status` (everything but
    /// [`EXTERNAL_STATUS_KEYS`]) with `status` (the serialized
    /// `NodeResource::status`), keeping every other field of the file as it is
    /// at the time of writing: see the module comment for the protocol.
    /// Fails when `status` is not an object, when the file no longer is this
    /// node's `CiliumNode`, or when it kept changing for [`WRITE_ATTEMPTS`]
    /// tries.
    pub fn write_status(&self, status: &serde_json::Value) -> Result<(), NodeFileError> {
        self.write_status_inner(status, &mut |_| {})
            .map_err(|p| p.at(&self.path))
    }

    /// `write_status` with a hook run after the temporary file is written and
    /// before the final check (attempt number from 0), for tests.
    fn write_status_inner(
        &self,
        status: &serde_json::Value,
        before_commit: &mut dyn FnMut(usize),
    ) -> Result<(), NodeFileProblem> {
        let status = status
            .as_object()
            .ok_or(NodeFileProblem::StatusNotAnObject)?;
        let target = fs::canonicalize(&self.path)?;
        let dir = target
            .parent()
            .ok_or(NodeFileProblem::NoParent)?
            .to_path_buf();
        let file_name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut last_err = NodeFileProblem::Changed;
        for attempt in 0..WRITE_ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(10 * attempt as u64));
            }
            let before = fs::read(&target)?;
            let text = String::from_utf8_lossy(&before);
            let (_, doc, json) = match parse(&text) {
                Ok(p) => p,
                Err(e) => {
                    // Maybe caught half-written by a non-atomic writer: retry.
                    last_err = e;
                    continue;
                }
            };
            let name = check_identity(&json)?;
            if name != self.name {
                return Err(NodeFileProblem::OtherNode {
                    found: name,
                    expected: self.name.clone(),
                });
            }
            let out = with_status(doc, status)?;
            if out.as_bytes() == before.as_slice() {
                return Ok(());
            }
            let tmp = dir.join(format!(
                ".{file_name}.podnet-{}-{attempt}.tmp",
                std::process::id()
            ));
            let perms = fs::metadata(&target).map(|m| m.permissions()).ok();
            let written = (|| -> std::io::Result<()> {
                let mut f = fs::File::create(&tmp)?;
                f.write_all(out.as_bytes())?;
                if let Some(p) = perms {
                    f.set_permissions(p)?;
                }
                f.sync_all()
            })();
            if let Err(source) = written {
                let _ = fs::remove_file(&tmp);
                return Err(NodeFileProblem::WriteTemporary { tmp, source });
            }
            before_commit(attempt);
            let now = fs::read(&target).map_err(|e| {
                let _ = fs::remove_file(&tmp);
                NodeFileProblem::Io(e)
            })?;
            if now != before {
                let _ = fs::remove_file(&tmp);
                last_err = NodeFileProblem::Changed;
                continue;
            }
            if let Err(source) = fs::rename(&tmp, &target) {
                let _ = fs::remove_file(&tmp);
                return Err(NodeFileProblem::Replace { tmp, source });
            }
            if let Ok(d) = fs::File::open(&dir) {
                let _ = d.sync_all();
            }
            return Ok(());
        }
        Err(NodeFileProblem::KeptChanging(Box::new(last_err)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TestDir;

    const YAML: &str = r#"# written by the node tool
apiVersion: cilium.io/v2
kind: CiliumNode
metadata:
  name: node-a
  uid: 1b2c
  resourceVersion: "42"
  labels:
    topology.kubernetes.io/zone: eu-west-1a
spec:
  instance-id: i-0abc
  addresses:
  - type: InternalIP
    ip: 10.0.0.10
  health:
    ipv4: 10.0.1.99
  future-field: {keep: me}
  eni:
    first-interface-index: 1
    use-primary-address: false
    instance-type: m5.large
    subnet-tags:
      pod-subnet: "true"
  ipam:
    pre-allocate: 8
    min-allocate: 16
    pool:
      10.0.1.20: {resource: eni-1}
status:
  eni:
    enis:
      eni-1:
        id: eni-1
        ip: 10.0.1.10
        mac: 0a:00:00:00:00:01
        number: 1
        subnet: {id: subnet-1, cidr: 10.0.1.0/24}
        vpc: {id: vpc-1, primary-cidr: 10.0.0.0/16, cidrs: [10.0.0.0/16]}
        addresses: [10.0.1.10, 10.0.1.20, 10.0.1.21]
        tags: {cluster: c1}
        unknown-eni-field: 7
  ipam:
    operator-status: {}
    release-ips:
      10.0.1.30: released
"#;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        fs::write(&p, text).unwrap();
        p
    }

    fn json_of(path: &Path) -> serde_json::Value {
        let text = fs::read_to_string(path).unwrap();
        parse(&text).unwrap().2
    }

    fn without_status_ipam(mut v: serde_json::Value) -> serde_json::Value {
        v["status"].as_object_mut().unwrap().remove("ipam");
        v
    }

    #[test]
    fn load_yaml() {
        let dir = TestDir::new("cnf");
        let p = write(&dir, "node.yaml", YAML);
        let (f, node) = CiliumNodeFile::load(&p).unwrap();
        assert_eq!(f.format(), FileFormat::Yaml);
        assert_eq!(f.name(), "node-a");
        assert_eq!(node.metadata.name, "node-a");
        assert_eq!(node.spec.eni.first_interface_index, Some(1));
        assert_eq!(node.spec.ipam.min_allocate, 16);
        assert_eq!(node.spec.ipam.pool["10.0.1.20"].resource, "eni-1");
        assert_eq!(node.status.eni.enis["eni-1"].number, 1);
        let alloc =
            crate::ipam::eni::eni_allocation(&node.status.eni.enis, &node.spec.eni).unwrap();
        assert_eq!(
            alloc[0].cidrs,
            vec![
                "10.0.1.20/32".parse::<ipnet::IpNet>().unwrap(),
                "10.0.1.21/32".parse().unwrap()
            ]
        );
        assert!(!f.changed());
    }

    #[test]
    fn round_trip_keeps_unknown_fields_yaml() {
        let dir = TestDir::new("cnf");
        let p = write(&dir, "node.yaml", YAML);
        let before = json_of(&p);
        let (f, mut node) = CiliumNodeFile::load(&p).unwrap();
        node.status.ipam.used.insert(
            "10.0.1.20".into(),
            AllocationIp {
                owner: "default/pod-1".into(),
                resource: "eni-1".into(),
            },
        );
        // The daemon's copy of the inventory is stale: it must not win.
        node.status.eni.enis.clear();
        f.write_status(&serde_json::to_value(&node.status).unwrap())
            .unwrap();

        let text = fs::read_to_string(&p).unwrap();
        let after = json_of(&p);
        // Everything but status.ipam is as the external writer wrote it.
        assert_eq!(
            without_status_ipam(after.clone()),
            without_status_ipam(before)
        );
        assert_eq!(
            after["status"]["ipam"]["used"]["10.0.1.20"]["owner"],
            "default/pod-1"
        );
        // Unknown status.ipam keys are the daemon's to keep or drop: dropped.
        assert!(after["status"]["ipam"].get("release-ips").is_none());
        // Key order kept, comments lost.
        assert!(text.starts_with("apiVersion: cilium.io/v2\nkind: CiliumNode\n"));
        assert!(!text.contains("# written by the node tool"));
        // Own writes are not external changes; the result still loads.
        assert!(!f.changed());
        let (_, again) = CiliumNodeFile::load(&p).unwrap();
        assert_eq!(again.status.ipam.used.len(), 1);
        assert_eq!(again.status.eni.enis.len(), 1);
        // Writing the same status again leaves the file alone.
        let mtime = fs::metadata(&p).unwrap().modified().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        f.write_status(&serde_json::to_value(&again.status).unwrap())
            .unwrap();
        assert_eq!(fs::metadata(&p).unwrap().modified().unwrap(), mtime);
    }

    #[test]
    fn round_trip_json() {
        let dir = TestDir::new("cnf");
        let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(YAML).unwrap();
        let text = serde_json::to_string(&yaml).unwrap();
        let p = write(&dir, "node.json", &text);
        let before = json_of(&p);
        let (f, mut node) = CiliumNodeFile::load(&p).unwrap();
        assert_eq!(f.format(), FileFormat::Json);
        node.status.ipam.operator_status.error = "boom".into();
        f.write_status(&serde_json::to_value(&node.status).unwrap())
            .unwrap();
        let out = fs::read_to_string(&p).unwrap();
        assert!(out.trim_start().starts_with('{'));
        let after: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            without_status_ipam(after.clone()),
            without_status_ipam(before)
        );
        assert_eq!(after["status"]["ipam"]["operator-status"]["error"], "boom");
        assert_eq!(after["spec"]["future-field"]["keep"], "me");
    }

    #[test]
    fn concurrent_spec_edit_is_not_lost() {
        let dir = TestDir::new("cnf");
        let p = write(&dir, "node.yaml", YAML);
        let (f, mut node) = CiliumNodeFile::load(&p).unwrap();
        node.status
            .ipam
            .used
            .insert("10.0.1.21".into(), AllocationIp::default());
        let status = serde_json::to_value(&node.status).unwrap();
        let mut calls = 0;
        let edited = YAML.replace("pre-allocate: 8", "pre-allocate: 12");
        f.write_status_inner(&status, &mut |attempt| {
            calls += 1;
            if attempt == 0 {
                // The external tool rewrites the spec between read and rename.
                fs::write(&p, &edited).unwrap();
            }
        })
        .unwrap();
        assert_eq!(calls, 2);
        let (_, now) = CiliumNodeFile::load(&p).unwrap();
        assert_eq!(now.spec.ipam.pre_allocate, 12);
        assert!(now.status.ipam.used.contains_key("10.0.1.21"));
        // The daemon sees the spec change on its next poll.
        assert!(f.changed());
        assert_ne!(
            &CiliumNodeFile::current_fingerprint(&p).unwrap(),
            f.fingerprint()
        );
        // No temporary file left behind.
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);

        // A file that never stops changing: bounded retries, clear error.
        fs::write(&p, YAML).unwrap();
        let mut n = 0;
        let err = f
            .write_status_inner(&status, &mut |_| {
                n += 1;
                fs::write(
                    &p,
                    YAML.replace("pre-allocate: 8", &format!("pre-allocate: {n}")),
                )
                .unwrap();
            })
            .unwrap_err()
            .to_string();
        assert_eq!(n, WRITE_ATTEMPTS);
        assert!(err.contains("status not written after 5 attempts"), "{err}");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
    }

    #[test]
    fn refuses_another_node() {
        let dir = TestDir::new("cnf");
        let p = write(&dir, "node.yaml", YAML);
        let (f, node) = CiliumNodeFile::load(&p).unwrap();
        fs::write(&p, YAML.replace("name: node-a", "name: node-b")).unwrap();
        let err = f
            .write_status(&serde_json::to_value(&node.status).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("now describes node \"node-b\""), "{err}");
        assert!(f.write_status(&serde_json::json!([1])).is_err());
    }

    #[test]
    fn bad_files() {
        let dir = TestDir::new("cnf");
        let err = |text: &str| {
            let p = write(&dir, "bad.yaml", text);
            let e = CiliumNodeFile::load(&p).unwrap_err().to_string();
            assert!(e.starts_with(&p.display().to_string()), "{e}");
            e
        };
        assert!(err("apiVersion: [").contains("invalid YAML"));
        assert!(err("").contains("empty file"));
        assert!(err(&format!("{YAML}---\n{YAML}")).contains("2 YAML documents"));
        assert!(err("- a\n- b\n").contains("not an object"));
        assert!(
            err(&YAML.replace("kind: CiliumNode", "kind: Node"))
                .contains("kind is \"Node\", expected CiliumNode")
        );
        assert!(
            err(&YAML.replace("apiVersion: cilium.io/v2", "apiVersion: cilium.io/v2alpha1"))
                .contains("apiVersion is \"cilium.io/v2alpha1\", expected cilium.io/v2")
        );
        assert!(err(&YAML.replace("name: node-a", "name: \"\"")).contains("metadata.name"));
        assert!(
            err(&YAML.replace("ip: 10.0.0.10", "ip: ten"))
                .contains("spec.addresses[0].ip \"ten\" is not an IP address")
        );
        assert!(
            err(&YAML.replace("10.0.1.20: {resource", "10.0.1.x: {resource"))
                .contains("spec.ipam.pool: \"10.0.1.x\" is not an IP address")
        );
        let e = err(&YAML.replace("10.0.1.10, 10.0.1.20", "10.0.1.10, 10.0.9.20"));
        assert!(
            e.contains(
                "status.eni.enis: ENI \"eni-1\": address 10.0.9.20 is outside its subnet \
                 subnet-1 10.0.1.0/24"
            ),
            "{e}"
        );
        let e = err(&YAML.replace("first-interface-index: 1", "first-interface-index: -1"));
        assert!(e.contains("not a valid CiliumNode"), "{e}");
        let e = err("{\"kind\": ");
        assert!(e.contains("invalid JSON"), "{e}");
        let missing = dir.join("missing.yaml");
        assert!(
            CiliumNodeFile::load(&missing)
                .unwrap_err()
                .to_string()
                .starts_with(&missing.display().to_string())
        );
    }
}
