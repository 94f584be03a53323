//! The allocator under the process's global one (`arena`): dlmalloc in the static
//! musl build, the system's elsewhere. musl's own allocator maps a fresh group of
//! pages for many allocations of a few KiB and unmaps it when they are freed, so
//! the daemon paid on every request for `mmap`, `munmap`, page faults and a TLB
//! flush on the other CPU (a quarter of its CPU in a batch of ADDs,
//! BENCHMARKS.md). dlmalloc keeps freed memory for reuse and returns it from the
//! top of its segments; blocks from [`MAPPED_APART_BYTES`] up are mapped apart.

/// Blocks from this size up are mapped apart and unmapped when freed: by musl's
/// allocator under dlmalloc (which has no such threshold: a freed large block would
/// stay a hole between live ones), and by glibc's as the daemon tunes it
/// (`daemon::heap`), so a restore's staging does not stay in the heap.
pub const MAPPED_APART_BYTES: usize = 256 * 1024;

#[cfg(any(target_env = "musl", test))]
mod dl {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::{Mutex, MutexGuard};

    use dlmalloc::Dlmalloc;

    /// dlmalloc's state. It holds raw pointers to its own segments, which any
    /// thread may use while it holds the lock.
    struct Heap(Dlmalloc);

    // SAFETY: the pointers are to memory this heap mapped; the mutex gives one
    // thread at a time access to them.
    unsafe impl Send for Heap {}

    static HEAP: Mutex<Heap> = Mutex::new(Heap(Dlmalloc::new()));

    fn heap() -> MutexGuard<'static, Heap> {
        HEAP.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_large(size: usize) -> bool {
        size >= super::MAPPED_APART_BYTES
    }

    /// dlmalloc behind one lock for small allocations, the system's for large ones.
    pub struct DlBacking;

    // SAFETY: every call goes, with the caller's layout, to the allocator its size
    // picks; a size fixes the allocator, so a block is freed by the one that made
    // it, and a realloc across the threshold moves the block between them.
    unsafe impl GlobalAlloc for DlBacking {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            if is_large(layout.size()) {
                // SAFETY: forwarded.
                return unsafe { System.alloc(layout) };
            }
            // SAFETY: forwarded.
            unsafe { heap().0.malloc(layout.size(), layout.align()) }
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            if is_large(layout.size()) {
                // SAFETY: forwarded.
                return unsafe { System.alloc_zeroed(layout) };
            }
            // SAFETY: forwarded.
            unsafe { heap().0.calloc(layout.size(), layout.align()) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            if is_large(layout.size()) {
                // SAFETY: a large block, so the system's, with its layout.
                return unsafe { System.dealloc(ptr, layout) };
            }
            // SAFETY: a small block, so dlmalloc's, with its layout.
            unsafe { heap().0.free(ptr, layout.size(), layout.align()) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            match (is_large(layout.size()), is_large(new_size)) {
                // SAFETY: the system's block, staying with it.
                (true, true) => unsafe { System.realloc(ptr, layout, new_size) },
                // SAFETY: dlmalloc's block, staying with it.
                (false, false) => unsafe {
                    heap()
                        .0
                        .realloc(ptr, layout.size(), layout.align(), new_size)
                },
                // SAFETY: a new block from the allocator the new size picks, the
                // old bytes copied (the smaller size bounds both), the old block
                // freed by its own allocator.
                _ => unsafe {
                    let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
                        return std::ptr::null_mut();
                    };
                    let new = self.alloc(new_layout);
                    if !new.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    new
                },
            }
        }
    }
}

#[cfg(target_env = "musl")]
pub use dl::DlBacking as Backing;

#[cfg(not(target_env = "musl"))]
pub use std::alloc::System as Backing;

#[cfg(test)]
mod tests {
    use super::dl::DlBacking;
    use std::alloc::{GlobalAlloc, Layout};

    const SMALL: usize = 1000;
    const LARGE: usize = 300 * 1024;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    fn fill(p: *mut u8, len: usize) {
        for i in 0..len {
            // SAFETY: `p` holds `len` bytes of the test's block.
            unsafe { p.add(i).write(i as u8) };
        }
    }

    fn holds_pattern(p: *const u8, len: usize) -> bool {
        // SAFETY: `p` holds at least `len` bytes of the test's block.
        (0..len).all(|i| unsafe { p.add(i).read() } == i as u8)
    }

    #[test]
    fn small_and_large_blocks_are_aligned_and_writable() {
        for (size, align) in [
            (1, 1),
            (SMALL, 8),
            (SMALL, 4096),
            (LARGE, 16),
            (LARGE, 4096),
        ] {
            let l = layout(size, align);
            // SAFETY: a non-zero layout; the block is freed with it.
            unsafe {
                let p = DlBacking.alloc(l);
                assert!(!p.is_null(), "{size} bytes");
                assert_eq!(p as usize % align, 0, "{size} bytes aligned to {align}");
                fill(p, size);
                assert!(holds_pattern(p, size));
                DlBacking.dealloc(p, l);
            }
        }
    }

    #[test]
    fn zeroed_blocks_are_zero_even_where_a_freed_block_was() {
        for size in [SMALL, LARGE] {
            let l = layout(size, 8);
            // SAFETY: as above.
            unsafe {
                let dirty = DlBacking.alloc(l);
                fill(dirty, size);
                DlBacking.dealloc(dirty, l);
                let p = DlBacking.alloc_zeroed(l);
                assert!((0..size).all(|i| p.add(i).read() == 0), "{size} bytes");
                DlBacking.dealloc(p, l);
            }
        }
    }

    #[test]
    fn realloc_keeps_the_bytes_within_and_across_the_threshold() {
        // small -> small -> large -> large -> small: every step keeps the prefix.
        let steps = [SMALL, 2 * SMALL, LARGE, 2 * LARGE, SMALL / 2];
        // SAFETY: each step reallocates the block with the layout it has.
        unsafe {
            let mut size = 64;
            let mut p = DlBacking.alloc(layout(size, 16));
            fill(p, size);
            for new_size in steps {
                let q = DlBacking.realloc(p, layout(size, 16), new_size);
                assert!(!q.is_null(), "{size} -> {new_size}");
                assert_eq!(q as usize % 16, 0);
                assert!(holds_pattern(q, size.min(new_size)), "{size} -> {new_size}");
                fill(q, new_size);
                (p, size) = (q, new_size);
            }
            DlBacking.dealloc(p, layout(size, 16));
        }
    }

    #[test]
    fn threads_share_the_heap() {
        let workers: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 0..2000 {
                        let size = 16 + (i * 37 + t * 11) % 5000;
                        let l = layout(size, 8);
                        // SAFETY: allocated, written and freed with the same layout.
                        unsafe {
                            let p = DlBacking.alloc(l);
                            assert!(!p.is_null());
                            fill(p, size);
                            assert!(holds_pattern(p, size));
                            DlBacking.dealloc(p, l);
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
    }
}
