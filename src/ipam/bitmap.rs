//! Owns `Bitmap`, the fixed-length bit set shared by the host-scope allocator
//! (one bit per usable address offset) and the node-CIDR allocator (one bit per
//! node-CIDR index).
//!
//! Storage is a lazily grown `Vec<u64>`: words past the end of the vector are
//! implicitly zero, so a huge but sparsely used range (for example an IPv4 /8
//! node CIDR) costs memory only up to its highest set bit. A second level,
//! `full`, keeps one bit per storage word that is completely set, so a search
//! for a clear bit skips 64 full words (4,096 bits) per summary word and never
//! walks a nearly full range bit by bit.

/// A bit set of `len` bits with word-level search for clear bits.
#[derive(Debug, Clone, Default)]
pub(crate) struct Bitmap {
    /// Number of addressable bits; valid indices are `0..len`.
    len: u64,
    /// Storage words; bit `i` lives in `words[i / 64]` at position `i % 64`.
    /// Words at or past `words.len()` are implicitly zero.
    words: Vec<u64>,
    /// Summary: bit `w % 64` of `full[w / 64]` is set iff `words[w] == u64::MAX`.
    /// Invariant: `full.len() == words.len().div_ceil(64)`.
    full: Vec<u64>,
    /// Number of set bits.
    ones: u64,
}

impl Bitmap {
    /// An all-clear bitmap of `len` bits. Allocates nothing up front.
    pub(crate) fn new(len: u64) -> Self {
        Self {
            len,
            words: Vec::new(),
            full: Vec::new(),
            ones: 0,
        }
    }

    /// Number of set bits.
    pub(crate) fn count_ones(&self) -> u64 {
        self.ones
    }

    /// Whether bit `i` is set (false when `i >= len`).
    pub(crate) fn get(&self, i: u64) -> bool {
        if i >= self.len {
            return false;
        }
        let w = (i / 64) as usize;
        match self.words.get(w) {
            Some(word) => word & (1u64 << (i % 64)) != 0,
            None => false,
        }
    }

    fn ensure_word(&mut self, w: usize) {
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
            self.full.resize(self.words.len().div_ceil(64), 0);
        }
    }

    /// Sets bit `i`; returns true if it was clear before. Out-of-range indices
    /// are ignored (returns false).
    pub(crate) fn set(&mut self, i: u64) -> bool {
        if i >= self.len {
            return false;
        }
        let w = (i / 64) as usize;
        self.ensure_word(w);
        let mask = 1u64 << (i % 64);
        let word = &mut self.words[w];
        if *word & mask != 0 {
            return false;
        }
        *word |= mask;
        if *word == u64::MAX {
            self.full[w / 64] |= 1u64 << (w % 64);
        }
        self.ones += 1;
        true
    }

    /// Clears bit `i`; returns true if it was set before.
    pub(crate) fn clear(&mut self, i: u64) -> bool {
        if i >= self.len {
            return false;
        }
        let w = (i / 64) as usize;
        let Some(word) = self.words.get_mut(w) else {
            return false;
        };
        let mask = 1u64 << (i % 64);
        if *word & mask == 0 {
            return false;
        }
        *word &= !mask;
        self.full[w / 64] &= !(1u64 << (w % 64));
        self.ones -= 1;
        true
    }

    /// Sets every bit in `begin..=end` (clamped to `len`); returns how many
    /// were newly set.
    pub(crate) fn set_range(&mut self, begin: u64, end: u64) -> u64 {
        let mut n = 0;
        let end = end.min(self.len.saturating_sub(1));
        let mut i = begin;
        while i <= end && i < self.len {
            if self.set(i) {
                n += 1;
            }
            i += 1;
        }
        n
    }

    /// Clears every bit in `begin..=end` (clamped to `len`); returns how many
    /// were previously set.
    pub(crate) fn clear_range(&mut self, begin: u64, end: u64) -> u64 {
        let mut n = 0;
        let end = end.min(self.len.saturating_sub(1));
        let mut i = begin;
        while i <= end && i < self.len {
            if self.clear(i) {
                n += 1;
            }
            i += 1;
        }
        n
    }

    /// Whether every bit in `begin..=end` is set (an empty or out-of-range
    /// interval gives false).
    pub(crate) fn all_set(&self, begin: u64, end: u64) -> bool {
        if begin > end || end >= self.len {
            return false;
        }
        (begin..=end).all(|i| self.get(i))
    }

    /// Lowest clear bit in `from..to`, if any.
    pub(crate) fn find_clear(&self, from: u64, to: u64) -> Option<u64> {
        let mut steps = 0;
        self.find_clear_counting(from, to, &mut steps)
    }

    /// Next-fit search: the first clear bit at or after `start`, wrapping
    /// around to `0..start`. `None` when every bit is set.
    pub(crate) fn find_next_clear(&self, start: u64) -> Option<u64> {
        let start = if start >= self.len { 0 } else { start };
        self.find_clear(start, self.len)
            .or_else(|| self.find_clear(0, start))
    }

    /// [`Self::find_clear`], counting loop iterations in `steps` (tests use
    /// this to prove that full words are skipped without bit-by-bit scans).
    pub(crate) fn find_clear_counting(&self, from: u64, to: u64, steps: &mut u64) -> Option<u64> {
        let to = to.min(self.len);
        let mut pos = from;
        while pos < to {
            *steps += 1;
            let w = (pos / 64) as usize;
            if w >= self.words.len() {
                // Unmaterialised words are all clear.
                return Some(pos);
            }
            // Summary level: treat words before `w` in this group as full.
            let group = w / 64;
            let below = (1u64 << (w % 64)) - 1;
            let summary = self.full[group] | below;
            if summary == u64::MAX {
                pos = (group as u64 + 1) * 64 * 64;
                continue;
            }
            let first_open = group * 64 + (!summary).trailing_zeros() as usize;
            if first_open != w {
                pos = first_open as u64 * 64;
                continue;
            }
            // Word level: mask off bits below `pos`.
            let word = self.words[w] | ((1u64 << (pos % 64)) - 1);
            if word == u64::MAX {
                pos = (w as u64 + 1) * 64;
                continue;
            }
            let found = w as u64 * 64 + u64::from((!word).trailing_zeros());
            return (found < to).then_some(found);
        }
        None
    }

    /// Indices of set bits in ascending order.
    pub(crate) fn iter_ones(&self) -> impl Iterator<Item = u64> + '_ {
        self.words.iter().enumerate().flat_map(|(w, &word)| {
            let mut rest = word;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let bit = u64::from(rest.trailing_zeros());
                rest &= rest - 1;
                Some(w as u64 * 64 + bit)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_clear_get_and_count() {
        let mut b = Bitmap::new(130);
        assert_eq!(b.len, 130);
        assert!(!b.get(5));
        assert!(b.set(5));
        assert!(!b.set(5));
        assert!(b.get(5));
        assert!(b.set(129));
        assert!(!b.set(130), "out of range is ignored");
        assert_eq!(b.count_ones(), 2);
        assert!(b.clear(5));
        assert!(!b.clear(5));
        assert!(!b.clear(1000));
        assert_eq!(b.count_ones(), 1);
        assert_eq!(b.iter_ones().collect::<Vec<_>>(), vec![129]);
    }

    #[test]
    fn lazy_storage_only_grows_to_highest_set_bit() {
        let mut b = Bitmap::new(1 << 30);
        assert_eq!(b.find_next_clear(0), Some(0));
        b.set(100);
        assert_eq!(b.words.len(), 2);
        assert_eq!(b.find_clear(100, 1 << 30), Some(101));
        assert_eq!(b.find_clear(128, 1 << 30), Some(128));
    }

    #[test]
    fn find_clear_respects_bounds_and_partial_last_word() {
        let mut b = Bitmap::new(70);
        for i in 0..70 {
            b.set(i);
        }
        assert_eq!(b.find_next_clear(0), None);
        b.clear(69);
        assert_eq!(b.find_clear(0, 69), None);
        assert_eq!(b.find_clear(0, 70), Some(69));
        assert_eq!(b.find_next_clear(3), Some(69));
        b.set(69);
        b.clear(2);
        assert_eq!(b.find_next_clear(3), Some(2), "wraps around");
        assert_eq!(b.find_next_clear(2), Some(2));
        assert_eq!(
            b.find_next_clear(500),
            Some(2),
            "start past end restarts at 0"
        );
    }

    #[test]
    fn full_words_are_skipped_not_scanned_bit_by_bit() {
        let len = 1u64 << 16;
        let mut b = Bitmap::new(len);
        for i in 0..len {
            b.set(i);
        }
        let target = len - 300;
        b.clear(target);
        let mut steps = 0;
        assert_eq!(b.find_clear_counting(0, len, &mut steps), Some(target));
        // 1,024 words = 16 summary groups: at most one step per group plus a
        // couple inside the target group. A bit-by-bit or word-by-word scan
        // would need far more.
        assert!(steps <= 20, "took {steps} steps");

        let mut steps = 0;
        assert_eq!(b.find_clear_counting(target + 1, len, &mut steps), None);
        assert!(steps <= 4, "took {steps} steps");
    }

    #[test]
    fn summary_tracks_full_words_through_set_and_clear() {
        let mut b = Bitmap::new(256);
        for i in 0..128 {
            b.set(i);
        }
        assert_eq!(b.full[0] & 0b11, 0b11);
        b.clear(70);
        assert_eq!(b.full[0] & 0b11, 0b01);
        assert_eq!(b.find_next_clear(0), Some(70));
        b.set(70);
        assert_eq!(b.find_next_clear(0), Some(128));
    }

    #[test]
    fn ranges() {
        let mut b = Bitmap::new(10);
        assert_eq!(b.set_range(2, 4), 3);
        assert_eq!(b.set_range(3, 6), 2);
        assert!(b.all_set(2, 6));
        assert!(!b.all_set(1, 6));
        assert!(!b.all_set(6, 2));
        assert!(!b.all_set(8, 12));
        assert_eq!(b.clear_range(0, 3), 2);
        assert_eq!(b.count_ones(), 3);
        assert_eq!(b.set_range(8, 100), 2, "clamped to len");
        assert_eq!(b.clear_range(0, u64::MAX), 5);
        assert_eq!(b.count_ones(), 0);
    }

    #[test]
    fn iter_ones_in_order() {
        let mut b = Bitmap::new(300);
        for i in [299, 0, 64, 63, 128, 5] {
            b.set(i);
        }
        assert_eq!(
            b.iter_ones().collect::<Vec<_>>(),
            vec![0, 5, 63, 64, 128, 299]
        );
    }
}
