//! Kubernetes-style manifests for the embedded backend, as a user gets them from
//! `kubectl get -o yaml` / `-o json`: single objects, multi-document files (`---`)
//! and `kind: List` with `items`. Reads `CiliumPodIPPool` (`cilium.io/v2alpha1` and
//! `cilium.io/v2`), `Pod` and `Namespace` metadata (for pool selection) and
//! `CiliumNodeConfig` (the per-node `ipam-default-ip-pool`). Each object is read
//! into its type of `crate::resources` and checked by the conversion every backend
//! shares (`ipam::pooldef`, `ipam::selection`, `ipam::node_config`); objects of
//! other kinds are ignored, and so are fields podnet does not use.
//!
//! [`ManifestDir`] loads a directory of such files and implements
//! [`MetadataSource`]; its [`Fingerprint`] lets a caller poll for changes cheaply.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::ipam::node_config::{NodeConfigDef, node_default_pool};
use crate::ipam::pooldef::PoolDef;
use crate::ipam::selection::{MetadataSource, NamespaceMeta, PodMeta};
use crate::resources::{
    CiliumNodeConfig, CiliumPodIPPool, InvalidObject, NODE_CONFIG_KIND, Namespace,
    POD_IP_POOL_KIND, Pod, decode,
};

// ---------------------------------------------------------------------------
// Errors

/// Why a manifest file (or a directory of them) could not be read. Each names
/// the file, and the object and field where there is one.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: invalid JSON: {source}")]
    InvalidJson {
        file: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{file}: invalid YAML: {source}")]
    InvalidYaml {
        file: String,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("{file}: document {doc} is not an object")]
    NotAnObject { file: String, doc: usize },
    #[error("{file}: {object}: items is not a list")]
    ItemsNotAList { file: String, object: String },
    #[error("{file}: document {doc}, item {item}: not an object")]
    ItemNotAnObject {
        file: String,
        doc: usize,
        item: usize,
    },
    /// An object of a kind podnet reads is not valid (the field and why).
    #[error("{file}: {object}: {problem}")]
    InvalidObject {
        file: String,
        object: String,
        problem: String,
    },
    /// `what` (`Pod "ns/name"`) appears twice in one file.
    #[error("{file}: {what} is defined twice")]
    DefinedTwice { file: String, what: String },
    /// `what` appears in two files of the directory.
    #[error("{what} is defined in both {first} and {second}")]
    DefinedInTwoFiles {
        what: String,
        first: String,
        second: String,
    },
}

// ---------------------------------------------------------------------------
// Documents

/// One object of a file, with its position (for messages).
#[derive(Debug, Clone)]
pub(crate) struct Object {
    pub(crate) value: Value,
    pub(crate) doc: usize,
    pub(crate) item: Option<usize>,
}

impl Object {
    fn str_at(&self, key: &str) -> Option<&str> {
        self.value.get(key).and_then(Value::as_str)
    }

    pub(crate) fn kind(&self) -> &str {
        self.str_at("kind").unwrap_or("")
    }

    fn meta(&self, key: &str) -> Option<&str> {
        self.value
            .get("metadata")
            .and_then(|m| m.get(key))
            .and_then(Value::as_str)
    }

    /// `Kind "name"`, or `Kind (document N[, item M])` when unnamed.
    pub(crate) fn describe(&self) -> String {
        let kind = if self.kind().is_empty() {
            "object"
        } else {
            self.kind()
        };
        match (self.meta("name"), self.meta("namespace")) {
            (Some(n), Some(ns)) if kind != "Namespace" && !is_cluster_scoped(kind) => {
                format!("{kind} \"{ns}/{n}\"")
            }
            (Some(n), _) => format!("{kind} \"{n}\""),
            (None, _) => match self.item {
                Some(i) => format!("{kind} (document {}, item {})", self.doc, i + 1),
                None => format!("{kind} (document {})", self.doc),
            },
        }
    }

    /// The object read as `T` and converted by `check`; errors are
    /// `<source>: <object>: <field and problem>`.
    fn convert<T: DeserializeOwned, U>(
        &self,
        source: &str,
        check: impl FnOnce(&T) -> Result<U, InvalidObject>,
    ) -> Result<U, ManifestError> {
        let at = |problem: String| ManifestError::InvalidObject {
            file: source.to_string(),
            object: self.describe(),
            problem,
        };
        let typed: T = decode(&self.value).map_err(at)?;
        check(&typed).map_err(|e| at(e.problem))
    }
}

fn is_cluster_scoped(kind: &str) -> bool {
    kind == POD_IP_POOL_KIND
}

/// Parses a file into objects: YAML (multi-document) or, for `*.json` sources, a
/// JSON stream; `*List` objects are replaced by their items; empty documents skipped.
pub(crate) fn parse_objects(text: &str, source: &str) -> Result<Vec<Object>, ManifestError> {
    let file = || source.to_string();
    let mut docs = Vec::new();
    if source.to_ascii_lowercase().ends_with(".json") {
        for v in serde_json::Deserializer::from_str(text).into_iter::<Value>() {
            docs.push(v.map_err(|e| ManifestError::InvalidJson {
                file: file(),
                source: e,
            })?);
        }
    } else {
        for d in serde_yaml_ng::Deserializer::from_str(text) {
            docs.push(
                Value::deserialize(d).map_err(|e| ManifestError::InvalidYaml {
                    file: file(),
                    source: e,
                })?,
            );
        }
    }
    let mut out = Vec::new();
    for (i, v) in docs.into_iter().enumerate() {
        let doc = i + 1;
        match v {
            Value::Null => {}
            Value::Object(_) => flatten(
                Object {
                    value: v,
                    doc,
                    item: None,
                },
                source,
                &mut out,
            )?,
            _ => return Err(ManifestError::NotAnObject { file: file(), doc }),
        }
    }
    Ok(out)
}

fn flatten(obj: Object, source: &str, out: &mut Vec<Object>) -> Result<(), ManifestError> {
    if obj.kind().ends_with("List") && obj.value.get("items").is_some() {
        let items = match obj.value.get("items") {
            Some(Value::Array(a)) => a.clone(),
            Some(Value::Null) => Vec::new(),
            _ => {
                return Err(ManifestError::ItemsNotAList {
                    file: source.to_string(),
                    object: obj.describe(),
                });
            }
        };
        for (i, item) in items.into_iter().enumerate() {
            if !item.is_object() {
                return Err(ManifestError::ItemNotAnObject {
                    file: source.to_string(),
                    doc: obj.doc,
                    item: i + 1,
                });
            }
            flatten(
                Object {
                    value: item,
                    doc: obj.doc,
                    item: Some(i),
                },
                source,
                out,
            )?;
        }
        return Ok(());
    }
    out.push(obj);
    Ok(())
}

// ---------------------------------------------------------------------------
// The objects of a file

/// Parses the `CiliumPodIPPool` objects (`cilium.io/v2alpha1` or `cilium.io/v2`) of
/// a file. `source` names the file in errors. Objects of other kinds are ignored.
pub fn parse_pools(yaml: &str, source: &str) -> Result<Vec<PoolDef>, ManifestError> {
    pools_from(&parse_objects(yaml, source)?, source)
}

/// `what` is defined twice in the file `source`.
fn defined_twice(source: &str, what: String) -> ManifestError {
    ManifestError::DefinedTwice {
        file: source.to_string(),
        what,
    }
}

fn pools_from(objs: &[Object], source: &str) -> Result<Vec<PoolDef>, ManifestError> {
    let mut out: Vec<PoolDef> = Vec::new();
    for obj in objs.iter().filter(|o| o.kind() == POD_IP_POOL_KIND) {
        let pool = obj.convert(source, |p: &CiliumPodIPPool| PoolDef::try_from(p))?;
        if out.iter().any(|p| p.name == pool.name) {
            return Err(defined_twice(
                source,
                format!("CiliumPodIPPool {:?}", pool.name),
            ));
        }
        out.push(pool);
    }
    Ok(out)
}

/// Parses the `Pod` and `Namespace` objects of a file (name, labels, annotations;
/// a pod without `metadata.namespace` is in `default`). Namespaces get the
/// `kubernetes.io/metadata.name` label the API server always sets, when missing.
pub fn parse_metadata(
    yaml: &str,
    source: &str,
) -> Result<(Vec<PodMeta>, Vec<NamespaceMeta>), ManifestError> {
    metadata_from(&parse_objects(yaml, source)?, source)
}

fn metadata_from(
    objs: &[Object],
    source: &str,
) -> Result<(Vec<PodMeta>, Vec<NamespaceMeta>), ManifestError> {
    let mut pods: Vec<PodMeta> = Vec::new();
    let mut namespaces: Vec<NamespaceMeta> = Vec::new();
    for obj in objs {
        match obj.kind() {
            "Pod" => {
                let pod = obj.convert(source, |p: &Pod| PodMeta::try_from(p))?;
                if pods
                    .iter()
                    .any(|p| p.namespace == pod.namespace && p.name == pod.name)
                {
                    return Err(defined_twice(
                        source,
                        format!("Pod \"{}/{}\"", pod.namespace, pod.name),
                    ));
                }
                pods.push(pod);
            }
            "Namespace" => {
                let ns = obj.convert(source, |n: &Namespace| NamespaceMeta::try_from(n))?;
                if namespaces.iter().any(|n| n.name == ns.name) {
                    return Err(defined_twice(source, format!("Namespace \"{}\"", ns.name)));
                }
                namespaces.push(ns);
            }
            _ => {}
        }
    }
    Ok((pods, namespaces))
}

fn node_configs_from(objs: &[Object], source: &str) -> Result<Vec<NodeConfigDef>, ManifestError> {
    objs.iter()
        .filter(|o| o.kind() == NODE_CONFIG_KIND)
        .map(|o| o.convert(source, |c: &CiliumNodeConfig| NodeConfigDef::try_from(c)))
        .collect()
}

/// The node's default pool from the `CiliumNodeConfig` objects of a file whose
/// `spec.nodeSelector` matches `node_labels` (`spec.defaults["ipam-default-ip-pool"]`),
/// or `None`. The object's namespace is not checked.
pub fn parse_node_config(
    yaml: &str,
    source: &str,
    node_labels: &BTreeMap<String, String>,
) -> Result<Option<String>, ManifestError> {
    let configs = node_configs_from(&parse_objects(yaml, source)?, source)?;
    Ok(node_default_pool(&configs, node_labels))
}

// ---------------------------------------------------------------------------
// A directory of manifests

/// One file's name, resolved path (through symlinks, e.g. a mounted ConfigMap's
/// `..data`), modification time and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStamp {
    pub name: String,
    pub target: PathBuf,
    pub modified: Option<SystemTime>,
    pub len: u64,
}

/// What a directory's manifests looked like, cheaply: compare two to see whether
/// anything changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fingerprint(pub Vec<FileStamp>);

/// Every `*.yaml` / `*.yml` / `*.json` file of a directory (names starting with `.`
/// skipped), parsed in name order.
#[derive(Debug, Clone)]
pub struct ManifestDir {
    dir: PathBuf,
    fingerprint: Fingerprint,
    pools: Vec<PoolDef>,
    pods: BTreeMap<(String, String), PodMeta>,
    namespaces: BTreeMap<String, NamespaceMeta>,
    node_configs: Vec<NodeConfigDef>,
}

fn is_manifest_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !name.starts_with('.')
        && [".yaml", ".yml", ".json"]
            .iter()
            .any(|e| lower.ends_with(e))
}

impl ManifestDir {
    /// The directory's current fingerprint (names, resolved paths, mtimes, sizes of
    /// the manifest files, sorted by name), without reading any file.
    pub fn fingerprint(dir: &Path) -> Result<Fingerprint, ManifestError> {
        let unreadable = |source| ManifestError::Read {
            path: dir.to_path_buf(),
            source,
        };
        let entries = fs::read_dir(dir).map_err(unreadable)?;
        let mut stamps = Vec::new();
        for entry in entries {
            let entry = entry.map_err(unreadable)?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if !is_manifest_name(&name) {
                continue;
            }
            let path = entry.path();
            let Ok(md) = fs::metadata(&path) else {
                continue;
            }; // dangling symlink
            if !md.is_file() {
                continue;
            }
            stamps.push(FileStamp {
                target: fs::canonicalize(&path).unwrap_or(path),
                name,
                modified: md.modified().ok(),
                len: md.len(),
            });
        }
        stamps.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Fingerprint(stamps))
    }

    /// Reads and parses every manifest file. A file that does not parse (or an
    /// object defined in two files) is an error naming it.
    pub fn load(dir: &Path) -> Result<ManifestDir, ManifestError> {
        let fingerprint = Self::fingerprint(dir)?;
        let mut md = ManifestDir {
            dir: dir.to_path_buf(),
            fingerprint,
            pools: Vec::new(),
            pods: BTreeMap::new(),
            namespaces: BTreeMap::new(),
            node_configs: Vec::new(),
        };
        let mut origin: BTreeMap<String, String> = BTreeMap::new();
        let mut once = |key: String, file: &str| match origin.get(&key) {
            Some(first) => Err(ManifestError::DefinedInTwoFiles {
                what: key,
                first: first.clone(),
                second: file.to_string(),
            }),
            None => {
                origin.insert(key, file.to_string());
                Ok(())
            }
        };
        for stamp in &md.fingerprint.0 {
            let path = dir.join(&stamp.name);
            let source = path.display().to_string();
            let text = fs::read_to_string(&path).map_err(|e| ManifestError::Read {
                path: path.clone(),
                source: e,
            })?;
            let objs = parse_objects(&text, &source)?;
            for p in pools_from(&objs, &source)? {
                once(format!("CiliumPodIPPool {:?}", p.name), &source)?;
                md.pools.push(p);
            }
            let (pods, namespaces) = metadata_from(&objs, &source)?;
            for p in pods {
                once(format!("Pod \"{}/{}\"", p.namespace, p.name), &source)?;
                md.pods.insert((p.namespace.clone(), p.name.clone()), p);
            }
            for n in namespaces {
                once(format!("Namespace {:?}", n.name), &source)?;
                md.namespaces.insert(n.name.clone(), n);
            }
            for c in node_configs_from(&objs, &source)? {
                once(format!("CiliumNodeConfig {:?}", c.name), &source)?;
                md.node_configs.push(c);
            }
        }
        Ok(md)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The fingerprint taken when loading (before reading the files).
    pub fn loaded_fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// Whether the directory changed since it was loaded (an unreadable directory
    /// counts as changed).
    pub fn changed(&self) -> bool {
        Self::fingerprint(&self.dir).map_or(true, |f| f != self.fingerprint)
    }

    /// The `CiliumPodIPPool`s, in file order.
    pub fn pools(&self) -> &[PoolDef] {
        &self.pools
    }

    /// The pods, by namespace and name.
    pub fn pods(&self) -> impl Iterator<Item = &PodMeta> {
        self.pods.values()
    }

    /// The namespaces, by name.
    pub fn namespaces(&self) -> impl Iterator<Item = &NamespaceMeta> {
        self.namespaces.values()
    }

    /// The node's default pool from the `CiliumNodeConfig`s of all files.
    pub fn node_default_pool(&self, node_labels: &BTreeMap<String, String>) -> Option<String> {
        node_default_pool(&self.node_configs, node_labels)
    }
}

impl MetadataSource for ManifestDir {
    fn pod(&self, namespace: &str, name: &str) -> Option<PodMeta> {
        self.pods
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    fn namespace(&self, name: &str) -> Option<NamespaceMeta> {
        self.namespaces.get(name).cloned()
    }

    /// A directory is read whole: it is synced once loaded.
    fn synced(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use ipnet::IpNet;

    use super::*;
    use crate::ipam::Family;
    use crate::ipam::selection::{LABEL_NAMESPACE_NAME, Step, select_pool};
    use crate::test_dir::TestDir;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    /// `kubectl get ciliumpodippools -o yaml` (1.20, v2alpha1).
    const POOLS_LIST: &str = r#"apiVersion: v1
items:
- apiVersion: cilium.io/v2alpha1
  kind: CiliumPodIPPool
  metadata:
    annotations:
      kubectl.kubernetes.io/last-applied-configuration: |
        {"apiVersion":"cilium.io/v2alpha1","kind":"CiliumPodIPPool","metadata":{"annotations":{},"name":"default"},"spec":{"ipv4":{"cidrs":["10.10.0.0/16"],"maskSize":27}}}
    creationTimestamp: "2026-09-20T10:11:12Z"
    generation: 1
    managedFields:
    - apiVersion: cilium.io/v2alpha1
      fieldsType: FieldsV1
      fieldsV1:
        f:metadata:
          f:annotations:
            .: {}
            f:kubectl.kubernetes.io/last-applied-configuration: {}
        f:spec:
          .: {}
          f:ipv4:
            .: {}
            f:cidrs: {}
            f:maskSize: {}
      manager: kubectl-client-side-apply
      operation: Update
      time: "2026-09-20T10:11:12Z"
    name: default
    resourceVersion: "1234"
    uid: 6f1c7f2e-0d4b-4c53-9a1e-2b2f7a6d9c11
  spec:
    ipv4:
      cidrs:
      - 10.10.0.0/16
      maskSize: 27
- apiVersion: cilium.io/v2alpha1
  kind: CiliumPodIPPool
  metadata:
    annotations:
      ipam.cilium.io/skip-masquerade: "true"
    creationTimestamp: "2026-09-20T10:11:13Z"
    generation: 2
    name: mars
    resourceVersion: "1240"
    uid: 0b8e5d77-3c2a-4a0e-8f7e-5b9f6a1d2e33
  spec:
    allowFirstIP: true
    ipv4:
      cidrs:
      - 10.20.0.0/16
      - 10.21.0.0/16
      maskSize: 27
    ipv6:
      cidrs:
      - fd00:20::/104
      maskSize: 120
    namespaceSelector:
      matchLabels:
        tenant: mars
    podSelector:
      matchExpressions:
      - key: app
        operator: In
        values:
        - rover
        - lander
  status:
    conditions: []
kind: List
metadata:
  resourceVersion: ""
"#;

    #[test]
    fn kubectl_list_of_v2alpha1_pools() {
        let pools = parse_pools(POOLS_LIST, "pools.yaml").unwrap();
        assert_eq!(pools.len(), 2);
        let d = &pools[0];
        assert_eq!(d.name, "default");
        assert_eq!(d.ipv4.as_ref().unwrap().cidrs, vec![net("10.10.0.0/16")]);
        assert_eq!(d.ipv4.as_ref().unwrap().mask_size, 27);
        assert!(d.ipv6.is_none() && !d.skip_masquerade && !d.allow_first_ip);
        assert!(d.pod_selector.is_none() && d.namespace_selector.is_none());
        let m = &pools[1];
        assert_eq!(m.name, "mars");
        assert!(m.skip_masquerade && m.allow_first_ip && !m.allow_last_ip);
        assert_eq!(m.ipv4.as_ref().unwrap().cidrs.len(), 2);
        assert_eq!(m.ipv6.as_ref().unwrap().mask_size, 120);
        assert_eq!(
            m.namespace_selector.as_ref().unwrap().match_labels,
            labels(&[("tenant", "mars")])
        );
        let e = &m.pod_selector.as_ref().unwrap().match_expressions[0];
        assert_eq!(
            (e.key.as_str(), e.operator.as_str(), e.values.len()),
            ("app", "In", 2)
        );
    }

    #[test]
    fn v2_pool_with_reserved_ranges_and_other_kinds_ignored() {
        let y = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: cilium-config, namespace: kube-system}
data: {ipam: multi-pool}
---
apiVersion: cilium.io/v2
kind: CiliumPodIPPool
metadata:
  name: default
spec:
  ipv4:
    cidrs: ["10.10.0.0/16", "10.20.0.0/16"]
    maskSize: 24
    pool:
    - cidr: 10.10.0.0/16
      reservedRanges:
      - start: 10.10.0.0
        end: 10.10.255.255
    - cidr: 10.20.0.0/16
  ipv6:
    cidrs: ["fd00::/104"]
    maskSize: 120
    pool:
    - cidr: fd00::/104
      reservedRanges:
      - {start: "fd00::", end: "fd00::ff"}
---
"#;
        let pools = parse_pools(y, "v2.yaml").unwrap();
        assert_eq!(pools.len(), 1);
        let v4 = pools[0].ipv4.as_ref().unwrap();
        assert_eq!(
            v4.reserved_ranges,
            vec![(
                "10.10.0.0".parse().unwrap(),
                "10.10.255.255".parse().unwrap()
            )]
        );
        let v6 = pools[0].ipv6.as_ref().unwrap();
        assert_eq!(
            v6.reserved_ranges,
            vec![("fd00::".parse().unwrap(), "fd00::ff".parse().unwrap())]
        );
    }

    fn pool_err(spec: &str) -> String {
        let y = format!(
            "apiVersion: cilium.io/v2alpha1\nkind: CiliumPodIPPool\nmetadata:\n  name: p1\nspec:\n{spec}"
        );
        parse_pools(&y, "bad.yaml").unwrap_err().to_string()
    }

    fn pool_err_v2(spec: &str) -> String {
        let y = format!(
            "apiVersion: cilium.io/v2\nkind: CiliumPodIPPool\nmetadata:\n  name: p1\nspec:\n{spec}"
        );
        parse_pools(&y, "bad.yaml").unwrap_err().to_string()
    }

    #[test]
    fn pool_validation_errors_name_file_and_object() {
        assert_eq!(
            pool_err("  ipv4:\n    cidrs: []\n    maskSize: 24\n"),
            r#"bad.yaml: CiliumPodIPPool "p1": spec.ipv4.cidrs must have at least 1 item"#
        );
        assert_eq!(
            pool_err("  ipv4:\n    maskSize: 24\n"),
            r#"bad.yaml: CiliumPodIPPool "p1": spec.ipv4.cidrs must have at least 1 item"#
        );
        assert_eq!(
            pool_err("  ipv4:\n    cidrs: [10.0.0.0/8]\n    maskSize: 33\n"),
            r#"bad.yaml: CiliumPodIPPool "p1": spec.ipv4.maskSize 33 is out of range (1..32)"#
        );
        assert_eq!(
            pool_err("  ipv4:\n    cidrs: [10.0.0.0/8]\n    maskSize: 0\n"),
            r#"bad.yaml: CiliumPodIPPool "p1": spec.ipv4.maskSize 0 is out of range (1..32)"#
        );
        assert_eq!(
            pool_err("  ipv6:\n    cidrs: [\"fd00::/104\"]\n    maskSize: 129\n"),
            r#"bad.yaml: CiliumPodIPPool "p1": spec.ipv6.maskSize 129 is out of range (1..128)"#
        );
        assert_eq!(
            pool_err("  ipv4:\n    cidrs: [10.0.0.0/8]\n"),
            r#"bad.yaml: CiliumPodIPPool "p1": spec.ipv4.maskSize is missing"#
        );
        assert_eq!(
            pool_err("  ipv4:\n    cidrs: [10.0.0.0/8]\n    maskSize: \"24\"\n"),
            r#"bad.yaml: CiliumPodIPPool "p1": spec.ipv4.maskSize must be a number, not a string"#
        );
        assert_eq!(
            pool_err("  ipv4:\n    cidrs: [\"fd00::/104\"]\n    maskSize: 24\n"),
            r#"bad.yaml: CiliumPodIPPool "p1": spec.ipv4.cidrs[0]: fd00::/104 is not an IPv4 CIDR"#
        );
        assert_eq!(
            pool_err("  ipv6:\n    cidrs: [10.0.0.0/8]\n    maskSize: 120\n"),
            r#"bad.yaml: CiliumPodIPPool "p1": spec.ipv6.cidrs[0]: 10.0.0.0/8 is not an IPv6 CIDR"#
        );
        assert_eq!(
            pool_err("  ipv4:\n    cidrs: [10.0.0.0/8, 10.1.2.3/16]\n    maskSize: 24\n"),
            r#"bad.yaml: CiliumPodIPPool "p1": spec.ipv4.cidrs[1]: 10.1.2.3/16 has host bits set; did you mean 10.1.0.0/16?"#
        );
        assert!(
            pool_err("  ipv4:\n    cidrs: [10.0.0.0]\n    maskSize: 24\n")
                .contains("\"10.0.0.0\" is not a CIDR")
        );
        assert_eq!(
            pool_err(
                "  podSelector:\n    matchExpressions:\n    - {key: a, operator: Gt, values: [\"1\"]}\n"
            ),
            r#"bad.yaml: CiliumPodIPPool "p1": spec.podSelector.matchExpressions[0].operator "Gt" is not one of In, NotIn, Exists, DoesNotExist"#
        );
        assert_eq!(
            pool_err(
                "  ipv4:\n    cidrs: [10.0.0.0/8]\n    maskSize: 24\n    pool:\n    - cidr: 10.0.0.0/8\n"
            ),
            r#"bad.yaml: CiliumPodIPPool "p1": spec.ipv4.pool is a cilium.io/v2 field; this object is cilium.io/v2alpha1"#
        );
        assert_eq!(
            pool_err_v2(
                "  ipv4:\n    cidrs: [10.0.0.0/8]\n    maskSize: 24\n    pool:\n    - cidr: 10.30.0.0/16\n"
            ),
            r#"bad.yaml: CiliumPodIPPool "p1": spec.ipv4.pool[0].cidr 10.30.0.0/16 is not one of spec.ipv4.cidrs"#
        );
        assert_eq!(
            pool_err_v2(
                "  ipv4:\n    cidrs: [10.0.0.0/16]\n    maskSize: 24\n    pool:\n    - cidr: 10.0.0.0/16\n      reservedRanges:\n      - {start: 10.0.0.9, end: 10.0.0.1}\n"
            ),
            r#"bad.yaml: CiliumPodIPPool "p1": spec.ipv4.pool[0].reservedRanges[0]: start 10.0.0.9 is after end 10.0.0.1"#
        );
        assert_eq!(
            pool_err_v2(
                "  ipv4:\n    cidrs: [10.0.0.0/16]\n    maskSize: 24\n    pool:\n    - cidr: 10.0.0.0/16\n      reservedRanges:\n      - {start: 10.0.0.0, end: 10.1.0.0}\n"
            ),
            r#"bad.yaml: CiliumPodIPPool "p1": spec.ipv4.pool[0].reservedRanges[0].end 10.1.0.0 is outside pool CIDR 10.0.0.0/16"#
        );
        let many: Vec<String> = (0..33).map(|i| format!("10.{i}.0.0/16")).collect();
        assert!(
            pool_err_v2(&format!(
                "  ipv4:\n    cidrs: [{}]\n    maskSize: 24\n",
                many.join(", ")
            ))
            .ends_with("spec.ipv4.cidrs has 33 items; cilium.io/v2 allows at most 32")
        );
    }

    #[test]
    fn pool_object_errors() {
        let e = parse_pools(
            "apiVersion: cilium.io/v2alpha1\nkind: CiliumPodIPPool\nspec: {}\n",
            "a.yaml",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "a.yaml: CiliumPodIPPool (document 1): metadata.name is missing"
        );
        let e = parse_pools(
            "apiVersion: cilium.io/v1\nkind: CiliumPodIPPool\nmetadata: {name: x}\nspec: {}\n",
            "a.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with(r#"a.yaml: CiliumPodIPPool "x": unsupported apiVersion "cilium.io/v1""#),
            "{e}"
        );
        let e = parse_pools("a: [\n", "broken.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("broken.yaml: invalid YAML:"), "{e}");
        let e = parse_pools("- 1\n", "l.yaml").unwrap_err().to_string();
        assert_eq!(e, "l.yaml: document 1 is not an object");
        let two = "apiVersion: cilium.io/v2alpha1\nkind: CiliumPodIPPool\nmetadata: {name: x}\nspec: {}\n---\n";
        let e = parse_pools(&two.repeat(2), "d.yaml")
            .unwrap_err()
            .to_string();
        assert_eq!(e, r#"d.yaml: CiliumPodIPPool "x" is defined twice"#);
        // A pool with no family is valid (skipped for both families).
        let p = parse_pools(two, "ok.yaml").unwrap();
        assert!(p[0].ipv4.is_none() && p[0].ipv6.is_none());
    }

    #[test]
    fn json_list_from_kubectl() {
        let j = r#"{
    "apiVersion": "v1",
    "items": [
        {
            "apiVersion": "cilium.io/v2alpha1",
            "kind": "CiliumPodIPPool",
            "metadata": {"name": "blue", "uid": "x", "managedFields": [{"manager": "kubectl"}]},
            "spec": {"ipv6": {"cidrs": ["fd00:1::/96"], "maskSize": 112}, "allowLastIP": true}
        }
    ],
    "kind": "List",
    "metadata": {"resourceVersion": ""}
}"#;
        let p = parse_pools(j, "pools.json").unwrap();
        assert_eq!(p[0].name, "blue");
        assert!(p[0].allow_last_ip);
        assert_eq!(p[0].ipv6.as_ref().unwrap().cidrs, vec![net("fd00:1::/96")]);
        let e = parse_pools("{", "pools.json").unwrap_err().to_string();
        assert!(e.starts_with("pools.json: invalid JSON:"), "{e}");
    }

    /// `kubectl get pod,ns -o yaml` style, trimmed.
    const METADATA: &str = r#"apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata:
    annotations:
      ipam.cilium.io/ip-pool: mars
    creationTimestamp: "2026-09-20T10:00:00Z"
    labels:
      kubernetes.io/metadata.name: tenant-mars
      tenant: mars
    name: tenant-mars
    resourceVersion: "99"
    uid: 11111111-2222-3333-4444-555555555555
  spec:
    finalizers:
    - kubernetes
  status:
    phase: Active
- apiVersion: v1
  kind: Pod
  metadata:
    annotations:
      ipam.cilium.io/ipv4-pool: blue
    creationTimestamp: "2026-09-20T10:05:00Z"
    generateName: rover-7d9f8b6c5-
    labels:
      app: rover
      pod-template-hash: 7d9f8b6c5
    name: rover-7d9f8b6c5-x2k4j
    namespace: tenant-mars
    ownerReferences:
    - apiVersion: apps/v1
      blockOwnerDeletion: true
      controller: true
      kind: ReplicaSet
      name: rover-7d9f8b6c5
      uid: 66666666-7777-8888-9999-000000000000
    managedFields:
    - apiVersion: v1
      fieldsType: FieldsV1
      fieldsV1:
        f:metadata:
          f:labels: {}
      manager: kube-controller-manager
      operation: Update
      time: "2026-09-20T10:05:00Z"
  spec:
    containers:
    - image: registry.k8s.io/pause:3.10
      name: app
    nodeName: worker-1
  status:
    phase: Running
    podIP: 10.20.0.17
    podIPs:
    - ip: 10.20.0.17
---
apiVersion: v1
kind: Pod
metadata:
  name: bare
spec:
  containers: [{name: app, image: busybox}]
---
apiVersion: v1
kind: Namespace
metadata:
  name: default
"#;

    #[test]
    fn pods_and_namespaces() {
        let (pods, nss) = parse_metadata(METADATA, "meta.yaml").unwrap();
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[0].namespace, "tenant-mars");
        assert_eq!(pods[0].name, "rover-7d9f8b6c5-x2k4j");
        assert_eq!(pods[0].labels["app"], "rover");
        assert_eq!(pods[0].annotations["ipam.cilium.io/ipv4-pool"], "blue");
        assert_eq!(
            (pods[1].namespace.as_str(), pods[1].name.as_str()),
            ("default", "bare")
        );
        assert!(pods[1].labels.is_empty() && pods[1].annotations.is_empty());
        assert_eq!(nss.len(), 2);
        assert_eq!(
            nss[0].labels,
            labels(&[(LABEL_NAMESPACE_NAME, "tenant-mars"), ("tenant", "mars")])
        );
        assert_eq!(nss[1].labels, labels(&[(LABEL_NAMESPACE_NAME, "default")]));
    }

    #[test]
    fn metadata_errors() {
        let e = parse_metadata(
            "kind: Pod\nmetadata:\n  name: p\n  labels:\n    version: 1.0\n",
            "m.yaml",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            r#"m.yaml: Pod "p": metadata.labels.version must be a string, not a number (quote it)"#
        );
        let e = parse_metadata("kind: Namespace\nmetadata: {}\n", "m.yaml")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "m.yaml: Namespace (document 1): metadata.name is missing"
        );
        let e = parse_metadata("kind: Pod\nmetadata: {name: p}\n---\nkind: Pod\nmetadata: {name: p, namespace: default}\n", "m.yaml")
            .unwrap_err().to_string();
        assert_eq!(e, r#"m.yaml: Pod "default/p" is defined twice"#);
    }

    const NODE_CONFIGS: &str = r#"apiVersion: cilium.io/v2
kind: CiliumNodeConfig
metadata:
  name: ip-pool-dc1
  namespace: kube-system
  creationTimestamp: "2026-09-20T10:00:00Z"
  generation: 1
spec:
  defaults:
    ipam-default-ip-pool: dc1-pool
  nodeSelector:
    matchLabels:
      topology.kubernetes.io/zone: dc1
---
apiVersion: cilium.io/v2
kind: CiliumNodeConfig
metadata:
  name: z-gpu
  namespace: kube-system
spec:
  defaults:
    ipam-default-ip-pool: gpu-pool
  nodeSelector:
    matchExpressions:
    - {key: gpu, operator: Exists}
---
apiVersion: cilium.io/v2
kind: CiliumNodeConfig
metadata:
  name: a-unrelated
  namespace: kube-system
spec:
  defaults:
    bpf-lb-acceleration: native
  nodeSelector: {}
---
apiVersion: cilium.io/v2
kind: CiliumNodeConfig
metadata:
  name: no-selector
  namespace: kube-system
spec:
  defaults:
    ipam-default-ip-pool: never
"#;

    #[test]
    fn node_config_default_pool() {
        let f =
            |l: &[(&str, &str)]| parse_node_config(NODE_CONFIGS, "cnc.yaml", &labels(l)).unwrap();
        assert_eq!(
            f(&[("topology.kubernetes.io/zone", "dc1")]),
            Some("dc1-pool".into())
        );
        assert_eq!(f(&[("topology.kubernetes.io/zone", "dc2")]), None);
        assert_eq!(f(&[]), None);
        // Both match: the later name (z-gpu) wins.
        assert_eq!(
            f(&[("topology.kubernetes.io/zone", "dc1"), ("gpu", "")]),
            Some("gpu-pool".into())
        );
        // v2alpha1 is only consulted when no v2 config applies.
        let old = "apiVersion: cilium.io/v2alpha1\nkind: CiliumNodeConfig\nmetadata: {name: zz-old}\n\
                   spec:\n  defaults: {ipam-default-ip-pool: old}\n  nodeSelector: {}\n---\n";
        let both = format!("{old}{NODE_CONFIGS}");
        let g = |l: &[(&str, &str)]| parse_node_config(&both, "cnc.yaml", &labels(l)).unwrap();
        assert_eq!(
            g(&[("topology.kubernetes.io/zone", "dc1")]),
            Some("dc1-pool".into())
        );
        // a-unrelated (v2, empty selector) applies, so v2alpha1 is ignored even
        // though a-unrelated does not set the key.
        assert_eq!(g(&[]), None);
        assert_eq!(
            parse_node_config(old, "o.yaml", &labels(&[])).unwrap(),
            Some("old".into())
        );
        let e = parse_node_config(
            "apiVersion: cilium.io/v2\nkind: CiliumNodeConfig\nmetadata: {name: e}\nspec:\n  defaults: {ipam-default-ip-pool: \"\"}\n",
            "e.yaml",
            &labels(&[]),
        )
        .unwrap_err().to_string();
        assert_eq!(
            e,
            r#"e.yaml: CiliumNodeConfig "e": spec.defaults.ipam-default-ip-pool is empty"#
        );
    }

    #[test]
    fn manifest_dir_loads_selects_and_detects_changes() {
        let d = TestDir::new("manifests-load");
        fs::write(d.join("10-pools.yaml"), POOLS_LIST).unwrap();
        fs::write(d.join("20-meta.yml"), METADATA).unwrap();
        fs::write(d.join("30-cnc.yaml"), NODE_CONFIGS).unwrap();
        fs::write(d.join("README.md"), "not a manifest: [").unwrap();
        fs::write(d.join(".hidden.yaml"), "not: [valid").unwrap();
        fs::create_dir(d.join("sub.yaml")).unwrap();

        let md = ManifestDir::load(&d).unwrap();
        let names: Vec<&str> = md
            .loaded_fingerprint()
            .0
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(names, ["10-pools.yaml", "20-meta.yml", "30-cnc.yaml"]);
        assert_eq!(md.pools().len(), 2);
        assert_eq!(md.pods().count(), 2);
        assert_eq!(md.namespaces().count(), 2);
        assert_eq!(
            md.node_default_pool(&labels(&[("topology.kubernetes.io/zone", "dc1")])),
            Some("dc1-pool".into())
        );
        assert!(md.pod("default", "bare").is_some());
        assert!(md.namespace("tenant-mars").is_some());
        assert!(!md.changed());

        // Pool selection over the directory: the pod's ipv4 annotation, then the
        // namespace's ip-pool for ipv6.
        let owner = "tenant-mars/rover-7d9f8b6c5-x2k4j";
        let o = select_pool(owner, Family::V4, md.pools(), &md, "default").unwrap();
        assert_eq!((o.pool.as_str(), o.step), ("blue", Step::PodAnnotation));
        let o = select_pool(owner, Family::V6, md.pools(), &md, "default").unwrap();
        assert_eq!(
            (o.pool.as_str(), o.step),
            ("mars", Step::NamespaceAnnotation)
        );
        let o = select_pool("default/bare", Family::V4, md.pools(), &md, "default").unwrap();
        assert_eq!((o.pool.as_str(), o.step), ("default", Step::Default));

        // A change in size is seen; a broken file is an error naming it.
        fs::write(d.join("20-meta.yml"), format!("{METADATA}\n# edited\n")).unwrap();
        assert!(md.changed());
        fs::write(d.join("40-broken.json"), "{\"kind\": ").unwrap();
        let e = ManifestDir::load(&d).unwrap_err().to_string();
        assert!(e.contains("40-broken.json: invalid JSON"), "{e}");
        fs::remove_file(d.join("40-broken.json")).unwrap();

        // The same object in two files.
        fs::write(
            d.join("50-dup.yaml"),
            "kind: Namespace\napiVersion: v1\nmetadata: {name: default}\n",
        )
        .unwrap();
        let e = ManifestDir::load(&d).unwrap_err().to_string();
        assert!(
            e.starts_with("Namespace \"default\" is defined in both "),
            "{e}"
        );
        assert!(
            e.contains("20-meta.yml") && e.ends_with("50-dup.yaml"),
            "{e}"
        );

        assert!(ManifestDir::load(&d.join("missing")).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn manifest_dir_follows_configmap_symlinks() {
        let d = TestDir::new("manifests-cm");
        fs::create_dir(d.join("..2026_09_20_1")).unwrap();
        fs::write(d.join("..2026_09_20_1/pools.yaml"), POOLS_LIST).unwrap();
        std::os::unix::fs::symlink("..2026_09_20_1", d.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/pools.yaml", d.join("pools.yaml")).unwrap();
        let md = ManifestDir::load(&d).unwrap();
        assert_eq!(md.pools().len(), 2);
        // An atomic ConfigMap update swaps ..data; the fingerprint sees it.
        fs::create_dir(d.join("..2026_09_20_2")).unwrap();
        fs::write(d.join("..2026_09_20_2/pools.yaml"), POOLS_LIST).unwrap();
        fs::remove_file(d.join("..data")).unwrap();
        std::os::unix::fs::symlink("..2026_09_20_2", d.join("..data")).unwrap();
        assert!(md.changed());
    }
}
