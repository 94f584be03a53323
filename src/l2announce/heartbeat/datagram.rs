//! The heartbeat datagram: the magic `PNL2`, a version byte, then the sender's
//! node name prefixed by its length in one byte. A Kubernetes node name is at
//! most 253 bytes, so a beat is at most 259 bytes; a typical one is about 20.

const MAGIC: &[u8; 4] = b"PNL2";
const VERSION: u8 = 1;
const HEADER: usize = MAGIC.len() + 2;

/// The largest datagram a beat can be: a receive buffer this big never cuts one.
pub const MAX_LEN: usize = HEADER + u8::MAX as usize;

/// The beat `node` sends, or None when its name does not fit in 255 bytes.
pub fn encode(node: &str) -> Option<Vec<u8>> {
    let len = u8::try_from(node.len()).ok()?;
    let mut datagram = Vec::with_capacity(HEADER + node.len());
    datagram.extend_from_slice(MAGIC);
    datagram.push(VERSION);
    datagram.push(len);
    datagram.extend_from_slice(node.as_bytes());
    Some(datagram)
}

/// The sender's node name, when `datagram` is exactly one beat of this version.
pub fn parse(datagram: &[u8]) -> Option<&str> {
    let rest = datagram.strip_prefix(MAGIC)?;
    let (&[version, len], name) = rest.split_first_chunk::<2>()?;
    if version != VERSION || name.len() != usize::from(len) {
        return None;
    }
    std::str::from_utf8(name).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_beat_is_magic_version_length_and_name() {
        assert_eq!(encode("node-1").unwrap(), b"PNL2\x01\x06node-1");
        assert_eq!(parse(b"PNL2\x01\x06node-1"), Some("node-1"));
    }

    #[test]
    fn every_name_up_to_255_bytes_round_trips_and_longer_ones_do_not_encode() {
        for len in [0, 1, 63, 253, 255] {
            let name = "n".repeat(len);
            let beat = encode(&name).unwrap();
            assert!(beat.len() <= MAX_LEN);
            assert_eq!(parse(&beat), Some(name.as_str()));
        }
        assert_eq!(encode(&"n".repeat(256)), None);
    }

    #[test]
    fn anything_but_exactly_one_beat_is_refused() {
        let beat = encode("node-1").unwrap();
        assert_eq!(parse(b""), None);
        assert_eq!(parse(b"PNL2"), None);
        assert_eq!(parse(b"PNL2\x01"), None);
        assert_eq!(parse(&beat[..beat.len() - 1]), None, "cut short");
        assert_eq!(
            parse(&[beat.as_slice(), b"x"].concat()),
            None,
            "trailing bytes"
        );
        assert_eq!(parse(b"PNL3\x01\x06node-1"), None, "magic");
        assert_eq!(parse(b"PNL2\x02\x06node-1"), None, "version");
        assert_eq!(parse(b"PNL2\x01\x02\xff\xfe"), None, "not UTF-8");
        assert_eq!(parse(b"GET / HTTP/1.1\r\n\r\n"), None);
    }
}
