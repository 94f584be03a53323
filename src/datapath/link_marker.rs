//! The marker podnet writes into the alias (IFLA_IFALIAS) of every pod's host-side
//! link. It is the kernel's half of the evidence restore weighs against the journal:
//! which journal (its id) handed out the link's addresses and at which commit (the
//! journal's sequence number), whether the ADD finished wiring the pod (`w=1`, set
//! by the plugin's last netlink change), and whose attachment it is (container ID,
//! interface, owner). A journal that recorded the commit and no longer accounts for
//! the link released it; any other journal never knew it, so its addresses are
//! adopted. A pending attachment whose link says it is wired is bound, not expired.
//!
//! Format (one line, at most 255 bytes, fields separated by single spaces):
//! `podnet j=<journal id>.<seq> [w=1] c=<container id> i=<ifname> o=<owner> u=<pod UID>`.
//! The pod's UID, then the owner, then the attachment, are left out when the alias
//! would be too long.

/// The longest alias the kernel keeps (IFALIASZ - 1).
pub const MAX_ALIAS_LEN: usize = 255;
const PREFIX: &str = "podnet";

/// A journal and one of its commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalMark {
    pub journal_id: String,
    pub seq: u64,
}

impl JournalMark {
    /// `<id>.<seq>`, as the daemon hands it to the plugin.
    pub fn encode(&self) -> String {
        format!("{}.{}", self.journal_id, self.seq)
    }

    /// Parses `<id>.<seq>`; the id is hex, the seq a decimal number.
    pub fn parse(s: &str) -> Option<JournalMark> {
        let (id, seq) = s.rsplit_once('.')?;
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(JournalMark {
            journal_id: id.to_string(),
            seq: seq.parse().ok()?,
        })
    }
}

/// What a host link's alias says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkMarker {
    pub journal: JournalMark,
    /// The ADD wired the pod completely (host side, pod side, routes).
    pub wired: bool,
    pub container_id: Option<String>,
    pub ifname: Option<String>,
    pub owner: Option<String>,
    /// The pod's UID (`K8S_POD_UID`), so an allocation adopted from the link
    /// keeps it for the leak check.
    pub pod_uid: Option<String>,
}

impl LinkMarker {
    /// The alias text: the attachment, owner and pod UID are dropped (UID first,
    /// then owner) when they would not fit, or when they hold a space (which the
    /// format cannot carry).
    pub fn encode(&self) -> String {
        let mut out = format!("{PREFIX} j={}", self.journal.encode());
        if self.wired {
            out.push_str(" w=1");
        }
        let fits = |s: &str, extra: usize| s.len() + extra <= MAX_ALIAS_LEN;
        if let (Some(c), Some(i)) = (&self.container_id, &self.ifname)
            && !c.contains(char::is_whitespace)
            && !i.contains(char::is_whitespace)
        {
            let attachment = format!(" c={c} i={i}");
            if fits(&out, attachment.len()) {
                out.push_str(&attachment);
                if let Some(o) = self.owner.as_deref().filter(|o| {
                    !o.is_empty() && !o.chars().any(|ch| ch.is_whitespace() || ch.is_control())
                }) {
                    let owner = format!(" o={o}");
                    if fits(&out, owner.len()) {
                        out.push_str(&owner);
                        if let Some(u) = self.pod_uid.as_deref().filter(|u| {
                            !u.is_empty()
                                && !u.chars().any(|ch| ch.is_whitespace() || ch.is_control())
                        }) {
                            let uid = format!(" u={u}");
                            if fits(&out, uid.len()) {
                                out.push_str(&uid);
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// Reads an alias; None when it is not podnet's marker.
    pub fn parse(alias: &str) -> Option<LinkMarker> {
        let mut fields = alias.split(' ');
        if fields.next()? != PREFIX {
            return None;
        }
        let journal = JournalMark::parse(fields.next()?.strip_prefix("j=")?)?;
        let mut marker = LinkMarker {
            journal,
            wired: false,
            container_id: None,
            ifname: None,
            owner: None,
            pod_uid: None,
        };
        for field in fields {
            let (key, value) = field.split_once('=')?;
            if value.is_empty() {
                return None;
            }
            let slot = match key {
                "w" => {
                    marker.wired = value == "1";
                    continue;
                }
                "c" => &mut marker.container_id,
                "i" => &mut marker.ifname,
                "o" => &mut marker.owner,
                "u" => &mut marker.pod_uid,
                _ => continue,
            };
            *slot = Some(value.to_string());
        }
        Some(marker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker(cid: &str, owner: Option<&str>) -> LinkMarker {
        LinkMarker {
            journal: JournalMark {
                journal_id: "0a1b2c3d4e5f6071".into(),
                seq: 42,
            },
            wired: false,
            container_id: Some(cid.into()),
            ifname: Some("eth0".into()),
            owner: owner.map(str::to_string),
            pod_uid: None,
        }
    }

    #[test]
    fn round_trip() {
        let m = marker("abc123", Some("shop/web-1"));
        let alias = m.encode();
        assert_eq!(
            alias,
            "podnet j=0a1b2c3d4e5f6071.42 c=abc123 i=eth0 o=shop/web-1"
        );
        assert_eq!(LinkMarker::parse(&alias), Some(m));
    }

    #[test]
    fn the_wired_flag_follows_the_journal_mark_and_older_markers_are_not_wired() {
        let m = LinkMarker {
            wired: true,
            ..marker("abc123", Some("shop/web-1"))
        };
        let alias = m.encode();
        assert_eq!(
            alias,
            "podnet j=0a1b2c3d4e5f6071.42 w=1 c=abc123 i=eth0 o=shop/web-1"
        );
        assert_eq!(LinkMarker::parse(&alias), Some(m));
        let long_cid = "c".repeat(250);
        let wired_long = LinkMarker {
            wired: true,
            ..marker(&long_cid, None)
        };
        assert_eq!(wired_long.encode(), "podnet j=0a1b2c3d4e5f6071.42 w=1");
        let old = LinkMarker::parse("podnet j=0a1b2c3d4e5f6071.42 c=abc123 i=eth0").unwrap();
        assert!(!old.wired);
        assert!(!LinkMarker::parse("podnet j=ab.1 w=0").unwrap().wired);
    }

    #[test]
    fn long_owner_then_long_attachment_are_dropped() {
        let long_owner = format!("ns/{}", "p".repeat(240));
        let alias = marker("abc123", Some(&long_owner)).encode();
        assert_eq!(alias, "podnet j=0a1b2c3d4e5f6071.42 c=abc123 i=eth0");
        let long_cid = "c".repeat(250);
        let alias = marker(&long_cid, Some("a/b")).encode();
        assert_eq!(alias, "podnet j=0a1b2c3d4e5f6071.42");
        let parsed = LinkMarker::parse(&alias).unwrap();
        assert_eq!(parsed.container_id, None);
        assert!(alias.len() <= MAX_ALIAS_LEN);
    }

    #[test]
    fn the_pods_uid_follows_the_owner_and_goes_first_when_too_long() {
        let uid = "6f1c2d3e-0000-4000-8000-00000000000a";
        let m = LinkMarker {
            pod_uid: Some(uid.into()),
            ..marker("abc123", Some("shop/web-1"))
        };
        let alias = m.encode();
        assert_eq!(
            alias,
            format!("podnet j=0a1b2c3d4e5f6071.42 c=abc123 i=eth0 o=shop/web-1 u={uid}")
        );
        assert_eq!(LinkMarker::parse(&alias), Some(m.clone()));
        // An owner that leaves no room for the UID keeps the owner.
        let owner = format!("ns/{}", "p".repeat(180));
        let alias = LinkMarker {
            owner: Some(owner.clone()),
            ..m.clone()
        }
        .encode();
        assert!(alias.ends_with(&format!("o={owner}")), "{alias}");
        // A UID with a space is left out; without an owner there is none either.
        let spaced = LinkMarker {
            pod_uid: Some("a b".into()),
            ..m.clone()
        };
        assert!(!spaced.encode().contains("u="));
        let ownerless = LinkMarker { owner: None, ..m };
        assert!(!ownerless.encode().contains("u="));
        // A key the reader does not know is skipped (so a podnet that predates
        // `u` reads this alias as before).
        let older = LinkMarker::parse(&format!("podnet j=ab.1 c=x i=eth0 o=a/b u={uid} z=9"));
        assert_eq!(older.and_then(|m| m.pod_uid).as_deref(), Some(uid));
    }

    #[test]
    fn owners_with_spaces_or_control_characters_are_left_out() {
        let alias = marker("abc", Some("a b")).encode();
        assert!(!alias.contains("o="), "{alias}");
        let alias = marker("abc", Some("a\nb")).encode();
        assert!(!alias.contains("o="), "{alias}");
    }

    #[test]
    fn foreign_or_damaged_aliases_are_not_markers() {
        for alias in [
            "",
            "cilium endpoint 12",
            "podnet",
            "podnet j=",
            "podnet j=xyz.1",
            "podnet j=abc",
            "podnet j=abc.notanumber",
            "podnet x=abc.1",
            "podnet j=abc.1 c=",
            "podnet j=abc.1 c",
        ] {
            assert_eq!(LinkMarker::parse(alias), None, "{alias:?}");
        }
        // Unknown fields are skipped (a newer podnet may add some).
        let m = LinkMarker::parse("podnet j=abc.7 z=1 c=x i=eth1").unwrap();
        assert_eq!(m.journal.seq, 7);
        assert_eq!(m.container_id.as_deref(), Some("x"));
        assert_eq!(m.ifname.as_deref(), Some("eth1"));
    }
}
