//! The token bucket filter qdisc (`tbf`) as netlink attributes, pure: the
//! parameters a pod's limit becomes (`TbfParams`), their `TCA_OPTIONS` (built
//! here: netlink-packet-route has no TBF types) and the reading of a dumped TBF
//! back. No rate table is sent: the rate spec says `linklayer ethernet`, for
//! which the kernel computes the rate itself (`psched_ratecfg_precompute`).

use netlink_packet_core::{DefaultNla, Nla, NlasIterator};
use netlink_packet_route::tc::TcOption;

/// `TCA_TBF_PARMS`: `struct tc_tbf_qopt`.
const TCA_TBF_PARMS: u16 = 1;
/// `TCA_TBF_RATE64`: the rate in bytes/s when it does not fit `u32`.
const TCA_TBF_RATE64: u16 = 4;
/// `TCA_TBF_BURST`: the bucket in bytes (the kernel derives its time from it).
const TCA_TBF_BURST: u16 = 6;
/// `TC_LINKLAYER_ETHERNET` (`enum tc_link_layer`).
const TC_LINKLAYER_ETHERNET: u8 = 1;
/// `sizeof(struct tc_tbf_qopt)`: two `tc_ratespec` (12 bytes), limit, buffer, mtu.
const QOPT_LEN: usize = 36;
/// A psched tick is 64 ns (`PSCHED_SHIFT` 6).
const NS_PER_TICK: u128 = 64;
/// How long a full queue may delay a packet beyond the burst: the queue holds
/// `rate × LATENCY_MS + burst` bytes (the reference `bandwidth` plugin's 25 ms).
pub const LATENCY_MS: u64 = 25;

/// One TBF: its rate, bucket and queue, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TbfParams {
    /// Bytes per second (at least 1).
    pub rate_bytes: u64,
    /// The bucket: bytes sent at line rate after an idle period.
    pub burst_bytes: u32,
    /// The queue (`bfifo` child) in bytes: `rate × 25 ms + burst`, at most `u32::MAX`.
    pub limit_bytes: u32,
}

impl TbfParams {
    /// The TBF of `rate_bytes` with a bucket of `burst_bytes` and the queue of
    /// [`LATENCY_MS`] on top of the bucket.
    pub fn new(rate_bytes: u64, burst_bytes: u32) -> Self {
        let queue = u128::from(rate_bytes) * u128::from(LATENCY_MS) / 1000;
        let limit = queue + u128::from(burst_bytes);
        TbfParams {
            rate_bytes,
            burst_bytes,
            limit_bytes: u32::try_from(limit).unwrap_or(u32::MAX),
        }
    }

    /// The bucket as time in psched ticks, as `tc` computes `buffer`
    /// (saturated: the kernel takes the time from `TCA_TBF_BURST` anyway).
    pub fn buffer_ticks(&self) -> u32 {
        let ns = u128::from(self.burst_bytes) * 1_000_000_000 / u128::from(self.rate_bytes.max(1));
        u32::try_from(ns / NS_PER_TICK).unwrap_or(u32::MAX)
    }

    /// `struct tc_tbf_qopt`: the rate spec (ethernet link layer, the rate
    /// saturated at `u32::MAX` when `TCA_TBF_RATE64` carries it), no peak rate,
    /// the queue, the bucket's time, no MTU (no peak rate). `cell_log` 3 and
    /// `cell_align` -1 are what `tc` writes beside its rate table; the kernel
    /// reads neither without one.
    pub fn qopt(&self) -> [u8; QOPT_LEN] {
        let mut q = [0u8; QOPT_LEN];
        q[0] = 3;
        q[1] = TC_LINKLAYER_ETHERNET;
        q[4..6].copy_from_slice(&(-1i16).to_ne_bytes());
        let rate32 = u32::try_from(self.rate_bytes).unwrap_or(u32::MAX);
        q[8..12].copy_from_slice(&rate32.to_ne_bytes());
        q[24..28].copy_from_slice(&self.limit_bytes.to_ne_bytes());
        q[28..32].copy_from_slice(&self.buffer_ticks().to_ne_bytes());
        q
    }

    /// The `TCA_OPTIONS` of an RTM_NEWQDISC of kind `tbf`, in `tc`'s order:
    /// parameters, bucket, and the 64-bit rate when the rate does not fit `u32`.
    pub fn options(&self) -> Vec<TcOption> {
        let mut opts = vec![
            raw(TCA_TBF_PARMS, self.qopt().to_vec()),
            raw(TCA_TBF_BURST, self.burst_bytes.to_ne_bytes().to_vec()),
        ];
        if self.rate_bytes > u64::from(u32::MAX) {
            opts.push(raw(TCA_TBF_RATE64, self.rate_bytes.to_ne_bytes().to_vec()));
        }
        opts
    }
}

fn raw(kind: u16, value: Vec<u8>) -> TcOption {
    TcOption::Other(DefaultNla::new(kind, value))
}

/// A TBF as the kernel dumps it: its rate and queue (the bucket comes back
/// only as time, which is not compared).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TbfReading {
    pub rate_bytes: u64,
    pub limit_bytes: u32,
}

/// Reads a dumped TBF's `TCA_OPTIONS`: netlink-packet-route hands the options
/// of a kind it does not know over as one attribute, whose value holds the
/// nested `TCA_TBF_*` attributes. `None` when there is no `TCA_TBF_PARMS`.
pub fn read_tbf(options: &[TcOption]) -> Option<TbfReading> {
    let mut nested = Vec::new();
    for opt in options {
        let mut value = vec![0u8; opt.value_len()];
        opt.emit_value(&mut value);
        nested.extend(value);
    }
    let (mut rate32, mut rate64, mut limit) = (None, None, None);
    for nla in NlasIterator::new(&nested[..]).flatten() {
        let v = nla.value();
        match nla.kind() & 0x3fff {
            TCA_TBF_PARMS if v.len() >= QOPT_LEN => {
                rate32 = v
                    .get(8..12)
                    .and_then(|b| b.try_into().ok())
                    .map(u32::from_ne_bytes);
                limit = v
                    .get(24..28)
                    .and_then(|b| b.try_into().ok())
                    .map(u32::from_ne_bytes);
            }
            TCA_TBF_RATE64 => {
                rate64 = v
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_ne_bytes);
            }
            _ => {}
        }
    }
    Some(TbfReading {
        rate_bytes: rate64.unwrap_or(u64::from(rate32?)),
        limit_bytes: limit?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::Emitable;
    use netlink_packet_route::tc::TcAttribute;

    fn options_bytes(p: &TbfParams) -> Vec<u8> {
        let attr = TcAttribute::Options(p.options());
        let mut buf = vec![0u8; attr.buffer_len()];
        attr.emit(&mut buf);
        buf
    }

    /// `tc qdisc add dev v0 root handle 1: tbf rate 1mbit burst 16kb limit
    /// 50000` (iproute2 6.x, strace of its sendmsg): its TCA_OPTIONS up to the
    /// rate table, which podnet does not send.
    const TC_1MBIT_16KB: [u8; 52] = [
        0x34, 0x00, 0x02, 0x00, // TCA_OPTIONS (length here: without the table)
        0x28, 0x00, 0x01, 0x00, // TCA_TBF_PARMS
        0x03, 0x01, 0x00, 0x00, 0xff, 0xff, 0x00, 0x00, 0x48, 0xe8, 0x01, 0x00, // rate 125000
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // no peak
        0x50, 0xc3, 0x00, 0x00, // limit 50000
        0x00, 0x40, 0x1f, 0x00, // buffer 2048000 ticks
        0x00, 0x00, 0x00, 0x00, // mtu
        0x08, 0x00, 0x06, 0x00, 0x00, 0x40, 0x00, 0x00, // TCA_TBF_BURST 16384
    ];

    #[test]
    fn options_are_the_bytes_tc_sends_without_its_rate_table() {
        let p = TbfParams {
            rate_bytes: 125_000,
            burst_bytes: 16_384,
            limit_bytes: 50_000,
        };
        assert_eq!(options_bytes(&p), TC_1MBIT_16KB);
    }

    #[test]
    fn a_rate_above_u32_goes_in_rate64_with_the_spec_saturated() {
        // tc qdisc add ... tbf rate 40gbit: rate 0xffffffff and TCA_TBF_RATE64.
        let p = TbfParams::new(5_000_000_000, 1_000_000);
        let b = options_bytes(&p);
        assert_eq!(&b[16..20], &u32::MAX.to_ne_bytes());
        assert_eq!(&b[52..56], &[0x0c, 0x00, 0x04, 0x00]);
        assert_eq!(&b[56..64], &5_000_000_000u64.to_ne_bytes());
        assert_eq!(b.len(), 64);
        // Exactly u32::MAX bytes/s still fits the spec: no RATE64.
        assert_eq!(
            options_bytes(&TbfParams::new(u64::from(u32::MAX), 2000)).len(),
            52
        );
    }

    #[test]
    fn the_queue_is_25_ms_of_rate_on_top_of_the_bucket_saturated() {
        assert_eq!(TbfParams::new(125_000, 16_384).limit_bytes, 3_125 + 16_384);
        assert_eq!(TbfParams::new(1, 1600).limit_bytes, 1600);
        assert_eq!(TbfParams::new(1 << 40, u32::MAX).limit_bytes, u32::MAX);
        assert_eq!(
            TbfParams::new(u64::MAX, u32::MAX - 10).limit_bytes,
            u32::MAX
        );
    }

    #[test]
    fn buffer_ticks_as_tc_computes_them_saturated() {
        assert_eq!(TbfParams::new(125_000, 16_384).buffer_ticks(), 2_048_000);
        // 512 MiB at 1 kbit/s is far beyond u32 ticks.
        assert_eq!(TbfParams::new(125, u32::MAX).buffer_ticks(), u32::MAX);
        assert_eq!(TbfParams::new(u64::MAX, 1).buffer_ticks(), 0);
    }

    #[test]
    fn a_dumped_tbf_reads_back() {
        for p in [
            TbfParams::new(125_000, 16_384),
            TbfParams::new(5_000_000_000, 9000),
        ] {
            // A dump carries TCA_OPTIONS as one unparsed attribute.
            let nested: Vec<u8> = options_bytes(&p)[4..].to_vec();
            let dumped = vec![raw(2, nested)];
            assert_eq!(
                read_tbf(&dumped),
                Some(TbfReading {
                    rate_bytes: p.rate_bytes,
                    limit_bytes: p.limit_bytes
                })
            );
        }
        assert_eq!(read_tbf(&[]), None);
        assert_eq!(read_tbf(&[raw(2, vec![8, 0, 6, 0, 1, 0, 0, 0])]), None);
    }
}
