//! Field deserializers shared by the resource types: `null` read as the empty
//! value, and CIDR / address fields whose errors quote the value.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::de::{self, Deserialize, Deserializer, Visitor};

/// `null` (an empty YAML value) reads as the default, as an absent field does.
pub fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

/// What a text field must parse as.
trait Parsed: Sized {
    const EXPECTING: &'static str;
    fn parse(s: &str) -> Result<Self, String>;
}

impl Parsed for IpNet {
    const EXPECTING: &'static str = "a CIDR";
    fn parse(s: &str) -> Result<Self, String> {
        s.parse().map_err(|_| {
            format!(
                "{s:?} is not a CIDR (expected <address>/<prefix length>, e.g. 10.0.0.0/16 or fd00::/104)"
            )
        })
    }
}

impl Parsed for IpAddr {
    const EXPECTING: &'static str = "an IP address";
    fn parse(s: &str) -> Result<Self, String> {
        s.parse().map_err(|_| format!("{s:?} is not an IP address"))
    }
}

/// Deserializes a string into `T` with `T`'s message on failure.
struct Text<T>(T);

impl<'de, T: Parsed> Deserialize<'de> for Text<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<T: Parsed> Visitor<'_> for V<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(T::EXPECTING)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<T, E> {
                T::parse(s).map_err(E::custom)
            }
        }
        d.deserialize_str(V(std::marker::PhantomData)).map(Text)
    }
}

/// An optional CIDR (`null` = absent).
pub fn opt_cidr<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpNet>, D::Error> {
    Ok(Option::<Text<IpNet>>::deserialize(d)?.map(|t| t.0))
}

/// A list of CIDRs (`null` = empty).
pub fn cidrs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
    let list: Option<Vec<Text<IpNet>>> = Deserialize::deserialize(d)?;
    Ok(list.unwrap_or_default().into_iter().map(|t| t.0).collect())
}

/// A list of CIDRs that must be present as a list (`null` is refused, unlike
/// [`cidrs`]).
pub fn cidr_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
    let list: Vec<Text<IpNet>> = Deserialize::deserialize(d)?;
    Ok(list.into_iter().map(|t| t.0).collect())
}

/// An optional IP address (`null` = absent).
pub fn opt_ip<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
    Ok(Option::<Text<IpAddr>>::deserialize(d)?.map(|t| t.0))
}
