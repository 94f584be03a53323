//! What `podnet lint --cidr-groups FILE` says about the `CiliumCIDRGroup`s of a
//! manifest file (other kinds in it are skipped): CIDRs that do not parse, a
//! missing list, an unserved or deprecated apiVersion, a name Kubernetes refuses,
//! a group defined twice (errors); CIDRs with host bits, CIDRs inside another of
//! the same group, an empty group (warnings).

use std::collections::BTreeMap;
use std::path::Path;

use super::lint_finding::{Finding, error, warning};
use crate::ipam::selection::is_dns1123_subdomain;
use crate::node::manifests::parse_objects;
use crate::resources::{
    CIDR_GROUP_KIND, CIDR_GROUP_V2, CIDR_GROUP_V2ALPHA1, CiliumCIDRGroup, decode,
};

/// The findings for every CiliumCIDRGroup of `files`.
pub fn lint_cidr_groups(files: &[impl AsRef<Path>]) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for path in files {
        let source = path.as_ref().display().to_string();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                out.push(error(format!("cidr groups {source}: cannot read: {e}")));
                continue;
            }
        };
        let objects = match parse_objects(&text, &source) {
            Ok(o) => o,
            Err(e) => {
                out.push(error(e.to_string()));
                continue;
            }
        };
        for obj in objects.iter().filter(|o| o.kind() == CIDR_GROUP_KIND) {
            let at = format!("{source}: {}", obj.describe());
            let group: CiliumCIDRGroup = match decode(&obj.value) {
                Ok(g) => g,
                Err(e) => {
                    out.push(error(format!("{at}: {e}")));
                    continue;
                }
            };
            out.extend(lint_group(&group, &at));
            let name = group.metadata.name.clone();
            if let Some(first) = seen.insert(name.clone(), source.clone()) {
                out.push(error(format!(
                    "{at}: defined twice (also in {first}); the later one replaces the earlier"
                )));
            }
        }
    }
    out
}

/// The findings for one group; `at` names it.
fn lint_group(group: &CiliumCIDRGroup, at: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    match group.api_version.as_str() {
        CIDR_GROUP_V2 => {}
        CIDR_GROUP_V2ALPHA1 => out.push(warning(format!(
            "{at}: apiVersion {CIDR_GROUP_V2ALPHA1} is deprecated; write {CIDR_GROUP_V2}"
        ))),
        other => out.push(error(format!(
            "{at}: apiVersion {other:?} is not served for {CIDR_GROUP_KIND}; write {CIDR_GROUP_V2}"
        ))),
    }
    if !is_dns1123_subdomain(&group.metadata.name) {
        out.push(error(format!(
            "{at}: metadata.name must be a DNS-1123 subdomain (lower-case letters, digits, '-' and '.')"
        )));
    }
    let cidrs = &group.spec.external_cidrs;
    if cidrs.is_empty() {
        out.push(warning(format!(
            "{at}: spec.externalCIDRs is empty: policies that reference the group match no address"
        )));
    }
    for (i, c) in cidrs.iter().enumerate() {
        if c.trunc() != *c {
            out.push(warning(format!(
                "{at}: spec.externalCIDRs[{i}]: {c} has host bits set; did you mean {}?",
                c.trunc()
            )));
        }
        if let Some((j, outer)) = cidrs.iter().enumerate().find(|(j, o)| {
            *j != i && o.trunc().contains(&c.trunc()) && (o.trunc() != c.trunc() || *j < i)
        }) {
            out.push(warning(format!(
                "{at}: spec.externalCIDRs[{i}]: {c} is already covered by spec.externalCIDRs[{j}] {outer}"
            )));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TestDir;

    fn texts(findings: &[Finding]) -> Vec<String> {
        findings
            .iter()
            .map(|f| format!("{}: {}", f.severity, f.text))
            .collect()
    }

    #[test]
    fn groups_in_a_file() {
        let dir = TestDir::new("ccg");
        let good = dir.join("good.yaml");
        std::fs::write(
            &good,
            "apiVersion: cilium.io/v2\nkind: CiliumCIDRGroup\nmetadata: {name: corp-ranges}\n\
             spec:\n  externalCIDRs: [10.30.0.0/16, 192.168.100.0/24]\n---\n\
             apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: egress-corp}\nspec: {}\n",
        )
        .unwrap();
        assert!(lint_cidr_groups(&[&good]).is_empty());

        let bad = dir.join("bad.yaml");
        std::fs::write(
            &bad,
            "apiVersion: cilium.io/v2alpha1\nkind: CiliumCIDRGroup\nmetadata: {name: Corp}\n\
             spec:\n  externalCIDRs: [10.30.1.7/16, 10.30.5.0/24, 10.30.0.0/16]\n---\n\
             apiVersion: cilium.io/v1\nkind: CiliumCIDRGroup\nmetadata: {name: empty}\nspec: {externalCIDRs: []}\n---\n\
             apiVersion: cilium.io/v2\nkind: CiliumCIDRGroup\nmetadata: {name: typo}\nspec: {externalCIDRs: [10.0.0.0/33]}\n---\n\
             apiVersion: cilium.io/v2\nkind: CiliumCIDRGroup\nmetadata: {name: corp-ranges}\nspec: {externalCIDRs: [10.9.0.0/16]}\n",
        )
        .unwrap();
        let b = bad.display().to_string();
        let got = texts(&lint_cidr_groups(&[&good, &bad]));
        let want = [
            format!(
                "warning: {b}: CiliumCIDRGroup \"Corp\": apiVersion cilium.io/v2alpha1 is deprecated; write cilium.io/v2"
            ),
            format!(
                "error: {b}: CiliumCIDRGroup \"Corp\": metadata.name must be a DNS-1123 subdomain (lower-case letters, digits, '-' and '.')"
            ),
            format!(
                "warning: {b}: CiliumCIDRGroup \"Corp\": spec.externalCIDRs[0]: 10.30.1.7/16 has host bits set; did you mean 10.30.0.0/16?"
            ),
            format!(
                "warning: {b}: CiliumCIDRGroup \"Corp\": spec.externalCIDRs[1]: 10.30.5.0/24 is already covered by spec.externalCIDRs[0] 10.30.1.7/16"
            ),
            format!(
                "warning: {b}: CiliumCIDRGroup \"Corp\": spec.externalCIDRs[2]: 10.30.0.0/16 is already covered by spec.externalCIDRs[0] 10.30.1.7/16"
            ),
            format!(
                "error: {b}: CiliumCIDRGroup \"empty\": apiVersion \"cilium.io/v1\" is not served for CiliumCIDRGroup; write cilium.io/v2"
            ),
            format!(
                "warning: {b}: CiliumCIDRGroup \"empty\": spec.externalCIDRs is empty: policies that reference the group match no address"
            ),
            format!(
                "error: {b}: CiliumCIDRGroup \"typo\": spec.externalCIDRs[0]: \"10.0.0.0/33\" is not a CIDR (expected <address>/<prefix length>, e.g. 10.0.0.0/16 or fd00::/104)"
            ),
            format!(
                "error: {b}: CiliumCIDRGroup \"corp-ranges\": defined twice (also in {}); the later one replaces the earlier",
                good.display()
            ),
        ];
        assert_eq!(got, want);
        let missing = texts(&lint_cidr_groups(&[dir.join("nope.yaml")]));
        assert!(missing[0].contains("nope.yaml: cannot read"), "{missing:?}");
    }
}
