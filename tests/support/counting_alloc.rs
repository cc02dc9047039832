//! A global allocator that counts the heap bytes live now, for the benchmarks and tests that
//! measure what a structure or a connection keeps (`benches/model.rs`, `tests/idle_memory.rs`).
//! Include it with `#[path]` and install it with `#[global_allocator]`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// The system allocator, counting.
pub(crate) struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

/// Heap bytes live now, over the whole process.
pub(crate) fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is only
// arithmetic on the sizes the caller passes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: forwarded with the caller's pointer, layout and size.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
