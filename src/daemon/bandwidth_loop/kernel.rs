//! Where the loop reads and writes a pod's shaping: the [`Shaper`] of a host
//! link, the kernel's ([`Kernel`], netlink, the qdiscs `plugin::shaping`
//! sets) or a test's. A host link that is missing, or whose podnet marker
//! says its ADD has not finished wiring it, is left to its ADD (no reading):
//! the loop never races the ADD that shapes the pod first.

use crate::datapath::ifb_of_host_link;
use crate::datapath::link_marker::LinkMarker;
use crate::datapath::{DatapathError, IFB_ALIAS, NetlinkSocket, QdiscInfo, TBF_HANDLE};

use super::plan::{IfbSeen, Observed, Step};

/// Why a pod's shaping could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    #[error("{link}: {source}")]
    Kernel {
        link: String,
        #[source]
        source: DatapathError,
    },
    #[error("{0}: not a podnet host link name (lxc + 12 hex characters): it has no IFB name")]
    NoIfbName(String),
}

/// A node's pods' host links, read and shaped.
pub trait Shaper {
    /// What the host link `link` has; None when it is missing or its ADD has
    /// not finished.
    fn observe(&mut self, link: &str) -> Result<Option<Observed>, ShapeError>;
    /// Writes `steps` on `link` (and its IFB), in order.
    fn write(&mut self, link: &str, steps: &[Step]) -> Result<(), ShapeError>;
}

/// The kernel, through one netlink socket in the agent's netns.
pub struct Kernel(pub NetlinkSocket);

fn kernel(link: &str) -> impl Fn(DatapathError) -> ShapeError + '_ {
    move |source| ShapeError::Kernel {
        link: link.to_string(),
        source,
    }
}

fn ifb_name(link: &str) -> Result<String, ShapeError> {
    ifb_of_host_link(link).ok_or_else(|| ShapeError::NoIfbName(link.to_string()))
}

fn root_tbf(qdiscs: &[QdiscInfo]) -> Option<crate::datapath::TbfReading> {
    qdiscs
        .iter()
        .find(|q| q.handle == TBF_HANDLE && q.kind == "tbf")
        .and_then(|q| q.tbf)
}

impl Shaper for Kernel {
    fn observe(&mut self, link: &str) -> Result<Option<Observed>, ShapeError> {
        let sock = &self.0;
        let Some(host) = sock.link_by_name(link).map_err(kernel(link))? else {
            return Ok(None);
        };
        let marker = host.alias.as_deref().and_then(LinkMarker::parse);
        if marker.is_some_and(|m| !m.wired) {
            return Ok(None);
        }
        let qdiscs = sock.qdiscs(host.index).map_err(kernel(link))?;
        let ingress_qdisc = qdiscs.iter().any(|q| q.kind == "ingress");
        let ifb = sock
            .link_by_name(&ifb_name(link)?)
            .map_err(kernel(link))?
            .filter(|l| l.kind.as_deref() == Some("ifb"));
        let (ifb, redirect) = match ifb {
            None => (None, false),
            Some(l) => {
                let tbf = root_tbf(&sock.qdiscs(l.index).map_err(kernel(link))?);
                let ready = l.up && l.alias.as_deref() == Some(IFB_ALIAS);
                let redirect = ingress_qdisc
                    && sock
                        .ingress_redirects(host.index)
                        .map_err(kernel(link))?
                        .contains(&l.index);
                (Some(IfbSeen { ready, tbf }), redirect)
            }
        };
        Ok(Some(Observed {
            to_pod: root_tbf(&qdiscs),
            ingress_qdisc,
            redirect,
            ifb,
        }))
    }

    fn write(&mut self, link: &str, steps: &[Step]) -> Result<(), ShapeError> {
        let sock = &self.0;
        let Some(host) = sock.link_by_name(link).map_err(kernel(link))? else {
            return Ok(());
        };
        let ifb_name = ifb_name(link)?;
        let ifb_index = |sock: &NetlinkSocket| -> Result<Option<u32>, ShapeError> {
            let l = sock.link_by_name(&ifb_name).map_err(kernel(link))?;
            Ok(l.filter(|l| l.kind.as_deref() == Some("ifb"))
                .map(|l| l.index))
        };
        for step in steps {
            let req = match step {
                Step::SetToPod(s) => sock.tbf_request(host.index, s),
                Step::ClearToPod => sock.delete_qdisc_request(host.index, false),
                Step::CreateIfb => {
                    let ifb = sock.create_ifb(&ifb_name, host.mtu).map_err(kernel(link))?;
                    sock.link_up_with_alias_request(ifb.index, IFB_ALIAS)
                }
                Step::SetFromPod(s) => match ifb_index(sock)? {
                    Some(i) => sock.tbf_request(i, s),
                    None => continue,
                },
                Step::AddIngressQdisc => sock.ingress_qdisc_request(host.index),
                Step::AddRedirect => match ifb_index(sock)? {
                    Some(i) => sock.redirect_request(host.index, i),
                    None => continue,
                },
                Step::ClearFromPod => sock.delete_qdisc_request(host.index, true),
                Step::DeleteIfb => match ifb_index(sock)? {
                    Some(i) => match sock.delete_link(i) {
                        Err(e) if !e.is_not_found() => return Err(kernel(link)(e)),
                        _ => continue,
                    },
                    None => continue,
                },
            };
            match sock.perform(req) {
                Err(e) if !e.is_not_found() => return Err(kernel(link)(e)),
                _ => {}
            }
        }
        Ok(())
    }
}
