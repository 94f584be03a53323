//! The process's global allocator: the backing heap (`heap_backing`), except in
//! the CNI plugin.
//!
//! A plugin run lives for about a millisecond, and musl's allocator maps and
//! unmaps memory for anything of a few pages (a netlink receive buffer, a parsed
//! link message): one ADD made 29 `mmap` and 26 `munmap` calls, and every page a
//! fresh mapping hands out is another page fault (3 µs each on this VM). The
//! plugin switches to a bump arena instead: allocations move a pointer forward in
//! one fixed region (in `.bss`, so only the pages it touches are ever backed),
//! freeing the newest allocation moves it back, anything else is left until the
//! process exits. A full arena falls back to the backing heap. The daemon never
//! switches: it is long-lived and must give memory back.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::heap_backing::Backing;

/// The plugin's region. A large GC request or result fits; more spills over to the
/// backing heap.
const REGION_BYTES: usize = 8 << 20;

#[repr(C, align(4096))]
struct Region(UnsafeCell<[u8; REGION_BYTES]>);

// SAFETY: the bytes are only reached through `Arena`, whose atomic `top` hands
// every byte range to one allocation at a time.
unsafe impl Sync for Region {}

// SAFETY: as for `Region`: `base` is only offset, and `top` is atomic.
unsafe impl Sync for Arena {}

static REGION: Region = Region(UnsafeCell::new([0; REGION_BYTES]));

/// A bump allocator over one byte range. Thread-safe: `top` moves by
/// compare-and-swap.
struct Arena {
    base: *mut u8,
    len: usize,
    /// Offset of the first free byte.
    top: AtomicUsize,
}

impl Arena {
    /// An arena over `len` bytes at `base`, which the caller owns for as long as
    /// the arena hands out memory.
    const fn new(base: *mut u8, len: usize) -> Arena {
        Arena {
            base,
            len,
            top: AtomicUsize::new(0),
        }
    }

    fn contains(&self, ptr: *mut u8) -> bool {
        let (p, base) = (ptr as usize, self.base as usize);
        p >= base && p < base + self.len
    }

    /// Bytes handed out and not given back (the offset of the first free byte).
    #[cfg(test)]
    fn used(&self) -> usize {
        self.top.load(Ordering::Relaxed)
    }

    /// Memory for `layout`, or null when the rest of the range is too small.
    fn alloc(&self, layout: Layout) -> *mut u8 {
        let base = self.base as usize;
        let mut top = self.top.load(Ordering::Relaxed);
        loop {
            let Some(start) = (base + top)
                .checked_next_multiple_of(layout.align())
                .map(|a| a - base)
            else {
                return std::ptr::null_mut();
            };
            let end = match start.checked_add(layout.size()) {
                Some(end) if end <= self.len => end,
                _ => return std::ptr::null_mut(),
            };
            match self
                .top
                .compare_exchange_weak(top, end, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return self.base.wrapping_add(start),
                Err(now) => top = now,
            }
        }
    }

    /// Gives the memory back when it is the newest allocation; otherwise it stays
    /// used until the arena goes.
    fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let start = ptr as usize - self.base as usize;
        let _ = self.top.compare_exchange(
            start + layout.size(),
            start,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Resizes the newest allocation where it is; false (nothing changed) for any
    /// other allocation or when the range has no room.
    fn resize_in_place(&self, ptr: *mut u8, old_size: usize, new_size: usize) -> bool {
        let start = ptr as usize - self.base as usize;
        match start.checked_add(new_size) {
            Some(end) if end <= self.len => self
                .top
                .compare_exchange(start + old_size, end, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok(),
            _ => false,
        }
    }
}

/// The global allocator: the backing heap until [`use_arena`] is called, then the
/// arena over the process's region.
struct ProcessAllocator {
    arena_on: AtomicBool,
    arena: Arena,
}

impl ProcessAllocator {
    const fn new() -> ProcessAllocator {
        ProcessAllocator {
            arena_on: AtomicBool::new(false),
            arena: Arena::new(REGION.0.get().cast(), REGION_BYTES),
        }
    }

    /// Memory from the arena, when it is on and has room.
    fn arena_alloc(&self, layout: Layout) -> Option<*mut u8> {
        if !self.arena_on.load(Ordering::Relaxed) {
            return None;
        }
        let p = self.arena.alloc(layout);
        (!p.is_null()).then_some(p)
    }
}

// SAFETY: every pointer goes back to the allocator that produced it: arena
// pointers are recognised by address (the region is fixed), all others are the
// backing heap's.
unsafe impl GlobalAlloc for ProcessAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match self.arena_alloc(layout) {
            Some(p) => p,
            // SAFETY: forwarded with the caller's layout.
            None => unsafe { Backing.alloc(layout) },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match self.arena_alloc(layout) {
            Some(p) => {
                // Given-back bytes may be reused: not necessarily zero any more.
                // SAFETY: `p` is `layout.size()` bytes of ours.
                unsafe { p.write_bytes(0, layout.size()) };
                p
            }
            // SAFETY: forwarded with the caller's layout.
            None => unsafe { Backing.alloc_zeroed(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if self.arena.contains(ptr) {
            self.arena.dealloc(ptr, layout);
        } else {
            // SAFETY: not the arena's, so the backing heap's, with its layout.
            unsafe { Backing.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !self.arena.contains(ptr) {
            // SAFETY: the backing heap's pointer and layout.
            return unsafe { Backing.realloc(ptr, layout, new_size) };
        }
        if self.arena.resize_in_place(ptr, layout.size(), new_size) || new_size <= layout.size() {
            return ptr;
        }
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        // SAFETY: a fresh allocation of `new_layout`, then the old bytes copied over
        // (the smaller of the two sizes is the old one) and the old one freed.
        unsafe {
            let new = self.alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size());
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}

/// Switches the global allocator to the arena for the rest of the process (the
/// CNI plugin does, first thing). Memory allocated before stays the backing heap's.
pub fn use_arena() {
    GLOBAL.arena_on.store(true, Ordering::Relaxed);
}

#[global_allocator]
static GLOBAL: ProcessAllocator = ProcessAllocator::new();

#[cfg(test)]
mod tests {
    use super::*;

    fn arena_of(buf: &mut [u8]) -> Arena {
        Arena::new(buf.as_mut_ptr(), buf.len())
    }

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn allocations_are_aligned_disjoint_and_inside() {
        let mut buf = vec![0u8; 4096];
        let a = arena_of(&mut buf);
        let p1 = a.alloc(layout(3, 1));
        let p2 = a.alloc(layout(16, 8));
        let p3 = a.alloc(layout(1, 64));
        assert_eq!(p2 as usize % 8, 0);
        assert_eq!(p3 as usize % 64, 0);
        assert!(p2 as usize >= p1 as usize + 3);
        assert!(p3 as usize >= p2 as usize + 16);
        for p in [p1, p2, p3] {
            assert!(a.contains(p));
        }
        assert!(!a.contains(buf[4095..].as_ptr().wrapping_add(1) as *mut u8));
    }

    #[test]
    fn a_full_arena_answers_null_and_keeps_its_state() {
        let mut buf = vec![0u8; 100];
        let a = arena_of(&mut buf);
        let p = a.alloc(layout(60, 1));
        assert!(!p.is_null());
        assert!(a.alloc(layout(41, 1)).is_null());
        assert_eq!(a.used(), 60);
        assert!(!a.alloc(layout(40, 1)).is_null());
        assert_eq!(a.used(), 100);
        assert!(a.alloc(layout(1, 1)).is_null());
        assert!(a.alloc(layout(isize::MAX as usize - 8, 1)).is_null());
    }

    #[test]
    fn only_the_newest_allocation_is_given_back() {
        let mut buf = vec![0u8; 1024];
        let a = arena_of(&mut buf);
        let p1 = a.alloc(layout(10, 1));
        let p2 = a.alloc(layout(20, 1));
        a.dealloc(p1, layout(10, 1));
        assert_eq!(a.used(), 30, "an older allocation stays used");
        a.dealloc(p2, layout(20, 1));
        assert_eq!(a.used(), 10, "the newest one goes back");
        assert_eq!(a.alloc(layout(5, 1)), p2, "and is reused");
    }

    #[test]
    fn the_newest_allocation_grows_and_shrinks_in_place() {
        let mut buf = vec![0u8; 256];
        let a = arena_of(&mut buf);
        let p1 = a.alloc(layout(10, 1));
        let p2 = a.alloc(layout(10, 1));
        assert!(a.resize_in_place(p2, 10, 100));
        assert_eq!(a.used(), 110);
        assert!(a.resize_in_place(p2, 100, 4));
        assert_eq!(a.used(), 14);
        assert!(!a.resize_in_place(p1, 10, 20), "not the newest");
        assert!(!a.resize_in_place(p2, 4, 300), "no room");
        assert_eq!(a.used(), 14);
    }

    #[test]
    fn concurrent_allocations_never_overlap() {
        let mut buf = vec![0u8; 64 * 1024];
        let a = arena_of(&mut buf);
        let ptrs: Vec<usize> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..200)
                            .map(|_| a.alloc(layout(24, 8)) as usize)
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        let mut sorted = ptrs.clone();
        sorted.sort_unstable();
        assert!(sorted.windows(2).all(|w| w[1] - w[0] >= 24));
        assert_eq!(a.used(), 800 * 24);
    }
}
