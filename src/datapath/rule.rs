//! Policy-routing rules (`ip rule`): `from <ip>/32 lookup <table> priority <p>`,
//! `to <ip>/32 lookup main priority 20`; add / delete / list.

use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};

use super::error::{DatapathError, Result};
use super::route::{IpFamily, TABLE_MAIN};
use super::socket::NetlinkSocket;

/// A `lookup <table>` rule. Also the listing type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    pub family: IpFamily,
    /// `from <net>`; `None` = from all.
    pub src: Option<IpNet>,
    /// `to <net>`; `None` = to all.
    pub dst: Option<IpNet>,
    /// Table looked up (254 = main).
    pub table: u32,
    pub priority: u32,
}

impl RuleSpec {
    /// `from <ip>/32|128 lookup <table> priority <priority>`.
    pub fn from_ip(ip: IpAddr, table: u32, priority: u32) -> Self {
        RuleSpec {
            family: IpFamily::of(&ip),
            src: Some(IpNet::from(ip)),
            dst: None,
            table,
            priority,
        }
    }

    /// `to <ip>/32|128 lookup main priority <priority>`.
    pub fn to_ip_main(ip: IpAddr, priority: u32) -> Self {
        RuleSpec {
            family: IpFamily::of(&ip),
            src: None,
            dst: Some(IpNet::from(ip)),
            table: TABLE_MAIN,
            priority,
        }
    }

    fn describe(&self) -> String {
        let mut s = format!("rule priority {}", self.priority);
        if let Some(n) = self.src {
            s.push_str(&format!(" from {n}"));
        }
        if let Some(n) = self.dst {
            s.push_str(&format!(" to {n}"));
        }
        s.push_str(&format!(" lookup {}", self.table));
        s
    }

    fn to_message(&self) -> Result<RuleMessage> {
        for net in [self.src, self.dst].into_iter().flatten() {
            if IpFamily::of(&net.addr()) != self.family {
                return Err(DatapathError::Invalid(format!(
                    "{}: {net} does not match the rule's address family",
                    self.describe()
                )));
            }
        }
        let mut msg = RuleMessage::default();
        msg.header.family = self.family.to_nl();
        msg.header.action = RuleAction::ToTable;
        msg.header.table = u8::try_from(self.table).unwrap_or(0);
        msg.attributes.push(RuleAttribute::Table(self.table));
        msg.attributes.push(RuleAttribute::Priority(self.priority));
        if let Some(n) = self.src {
            msg.header.src_len = n.prefix_len();
            msg.attributes.push(RuleAttribute::Source(n.trunc().addr()));
        }
        if let Some(n) = self.dst {
            msg.header.dst_len = n.prefix_len();
            msg.attributes
                .push(RuleAttribute::Destination(n.trunc().addr()));
        }
        Ok(msg)
    }

    fn from_message(family: IpFamily, msg: RuleMessage) -> Option<Self> {
        if msg.header.action != RuleAction::ToTable {
            return None;
        }
        let mut rule = RuleSpec {
            family,
            src: None,
            dst: None,
            table: u32::from(msg.header.table),
            priority: 0,
        };
        for attr in msg.attributes {
            match attr {
                RuleAttribute::Source(ip) => {
                    rule.src = IpNet::new(ip, msg.header.src_len).ok();
                }
                RuleAttribute::Destination(ip) => {
                    rule.dst = IpNet::new(ip, msg.header.dst_len).ok();
                }
                RuleAttribute::Table(t) => rule.table = t,
                RuleAttribute::Priority(p) => rule.priority = p,
                _ => {}
            }
        }
        Some(rule)
    }
}

impl NetlinkSocket {
    /// Add a rule. EEXIST when an identical rule exists.
    pub fn add_rule(&self, rule: &RuleSpec) -> Result<()> {
        let msg = rule.to_message()?;
        self.request(
            RouteNetlinkMessage::NewRule(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            || format!("adding {}{}", rule.describe(), self.where_()),
        )
        .map(|_| ())
    }

    /// Delete a rule (ENOENT when absent).
    pub fn delete_rule(&self, rule: &RuleSpec) -> Result<()> {
        let msg = rule.to_message()?;
        self.request(RouteNetlinkMessage::DelRule(msg), 0, || {
            format!("deleting {}{}", rule.describe(), self.where_())
        })
        .map(|_| ())
    }

    /// The `lookup <table>` rules of `family` (including the kernel's default
    /// local/main/default rules). Rules with other actions are skipped.
    pub fn list_rules(&self, family: IpFamily) -> Result<Vec<RuleSpec>> {
        let mut req = RuleMessage::default();
        req.header.family = family.to_nl();
        let msgs = self.dump(RouteNetlinkMessage::GetRule(req), || {
            format!("listing rules{}", self.where_())
        })?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRule(r) => RuleSpec::from_message(family, r),
                _ => None,
            })
            .collect())
    }
}
