//! Keeps the daemon's heap from holding on to memory it freed. glibc keeps freed
//! chunks for reuse and, after a large block is freed, raises the size above which
//! it maps blocks apart (up to 32 MiB); restore's staging and a full status body
//! then stay in the heap for good. `tune` fixes that size at start, `trim` hands the
//! free pages back after work that leaves a lot of them (restore, a full status).
//! The static musl build's heap (`heap_backing`) maps large blocks apart from the
//! start and has neither knob: both are no-ops there.

/// Blocks from this size up are mapped apart and unmapped when freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD_BYTES: libc::c_int = crate::heap_backing::MAPPED_APART_BYTES as libc::c_int;

/// Fixes the mmap threshold (glibc: setting it turns off its dynamic raise).
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a glibc allocator parameter.
    unsafe {
        if libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 0 {
            tracing::warn!("could not set the allocator's mmap threshold");
        }
    }
}

/// Returns the heap's free pages to the kernel (every arena's).
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own heap; no pointers are passed.
    unsafe {
        libc::malloc_trim(0);
    }
}
