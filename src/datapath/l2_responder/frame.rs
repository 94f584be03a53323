//! Ethernet framing shared by the ARP and NDP code, and the classic BPF
//! programs that keep the responder's sockets from waking for other traffic.

/// Length of an untagged Ethernet header.
pub const ETH_HEADER_LEN: usize = 14;

/// An Ethernet header from `src` to `dst` carrying `ethertype`, with room for
/// the payload that follows.
pub fn ethernet_header(dst: [u8; 6], src: [u8; 6], ethertype: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(ETH_HEADER_LEN + 64);
    out.extend_from_slice(&dst);
    out.extend_from_slice(&src);
    out.extend_from_slice(&ethertype.to_be_bytes());
    out
}

/// The big-endian 16 bits at `at` of `b`, if it is that long.
pub fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Test-only: the bytes of hex string `s` (a captured frame).
#[cfg(test)]
pub fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// One classic BPF instruction (`struct sock_filter`).
pub type BpfInstruction = libc::sock_filter;

const BPF_LD_H_ABS: u16 = (libc::BPF_LD | libc::BPF_H | libc::BPF_ABS) as u16;
const BPF_LD_B_ABS: u16 = (libc::BPF_LD | libc::BPF_B | libc::BPF_ABS) as u16;
const BPF_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
/// What an accepting program keeps of a packet: all of it.
const ACCEPT: u32 = 0xffff;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> BpfInstruction {
    BpfInstruction { code, jt, jf, k }
}

/// Passes only ARP requests (opcode 1, at offset 20 of the frame).
pub fn arp_request_filter() -> Vec<BpfInstruction> {
    vec![
        insn(BPF_LD_H_ABS, 0, 0, (ETH_HEADER_LEN + 6) as u32),
        insn(BPF_JEQ_K, 0, 1, 1),
        insn(BPF_RET_K, 0, 0, ACCEPT),
        insn(BPF_RET_K, 0, 0, 0),
    ]
}

/// Passes only IPv6 packets whose next header is ICMPv6 (58, offset 20) and
/// whose ICMPv6 type is neighbour solicitation (135, offset 54).
pub fn neighbour_solicitation_filter() -> Vec<BpfInstruction> {
    vec![
        insn(BPF_LD_B_ABS, 0, 0, (ETH_HEADER_LEN + 6) as u32),
        insn(BPF_JEQ_K, 0, 3, 58),
        insn(BPF_LD_B_ABS, 0, 0, (ETH_HEADER_LEN + 40) as u32),
        insn(BPF_JEQ_K, 0, 1, 135),
        insn(BPF_RET_K, 0, 0, ACCEPT),
        insn(BPF_RET_K, 0, 0, 0),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny classic BPF interpreter for the instructions the filters use.
    fn run(program: &[BpfInstruction], packet: &[u8]) -> u32 {
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = program[pc];
            let at = i.k as usize;
            match i.code {
                BPF_LD_H_ABS => match packet.get(at..at + 2) {
                    Some(b) => acc = u32::from(u16::from_be_bytes([b[0], b[1]])),
                    None => return 0,
                },
                BPF_LD_B_ABS => match packet.get(at) {
                    Some(b) => acc = u32::from(*b),
                    None => return 0,
                },
                BPF_JEQ_K => {
                    pc += usize::from(if acc == i.k { i.jt } else { i.jf });
                }
                BPF_RET_K => return i.k,
                other => panic!("unexpected BPF opcode {other:#x}"),
            }
            pc += 1;
        }
    }

    #[test]
    fn arp_filter_passes_requests_only() {
        let mut frame = vec![0u8; 42];
        frame[20..22].copy_from_slice(&1u16.to_be_bytes());
        assert_eq!(run(&arp_request_filter(), &frame), ACCEPT);
        frame[20..22].copy_from_slice(&2u16.to_be_bytes());
        assert_eq!(run(&arp_request_filter(), &frame), 0);
        assert_eq!(run(&arp_request_filter(), &frame[..20]), 0);
    }

    #[test]
    fn ndp_filter_passes_solicitations_only() {
        let mut frame = vec![0u8; 86];
        frame[20] = 58;
        frame[54] = 135;
        let filter = neighbour_solicitation_filter();
        assert_eq!(run(&filter, &frame), ACCEPT);
        frame[54] = 136; // an advertisement
        assert_eq!(run(&filter, &frame), 0);
        frame[54] = 135;
        frame[20] = 17; // UDP
        assert_eq!(run(&filter, &frame), 0);
        assert_eq!(run(&filter, &frame[..40]), 0);
    }
}
