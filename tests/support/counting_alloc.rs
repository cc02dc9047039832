//! A global allocator that counts the heap bytes live now, for the benchmarks and tests that
//! measure what a structure or a connection keeps (`benches/model.rs`, `tests/idle_memory.rs`).
//! Include it with `#[path]` and install it with `#[global_allocator]`, around the allocator the
//! measured code runs on: `Counting(System)`, or `Counting(tikv_jemallocator::Jemalloc)` for the
//! daemon's own (benches/model.rs times the compile on it). It also counts the allocations made
//! and the bytes they asked for ([`made`]), for `benches/request_allocs.rs`.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, Ordering};

/// The allocator `A`, counting the bytes its callers asked for.
pub(crate) struct Counting<A>(pub(crate) A);

static LIVE: AtomicIsize = AtomicIsize::new(0);
static ON: AtomicBool = AtomicBool::new(true);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static ASKED: AtomicU64 = AtomicU64::new(0);

/// Heap bytes live now, over the whole process (while counting has stayed on).
#[allow(dead_code)] // Not every includer reads the live bytes.
pub(crate) fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Allocations made so far (each `alloc` and each `realloc`) and the bytes they asked for (a
/// `realloc` asks for its whole new size), over the whole process while counting has stayed on.
#[allow(dead_code)] // Not every includer counts allocations.
pub(crate) fn made() -> (u64, u64) {
    (
        ALLOCATIONS.load(Ordering::Relaxed),
        ASKED.load(Ordering::Relaxed),
    )
}

/// Stops counting for good, so what is timed next does not pay for the shared counter's atomic
/// add on every allocation; [`live`] is meaningless from then on.
#[allow(dead_code)] // Not every includer times anything.
pub(crate) fn stop() {
    ON.store(false, Ordering::Relaxed);
}

fn count(bytes: isize) {
    if ON.load(Ordering::Relaxed) {
        LIVE.fetch_add(bytes, Ordering::Relaxed);
    }
}

fn count_made(asked: usize) {
    if ON.load(Ordering::Relaxed) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        ASKED.fetch_add(asked as u64, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to the inner allocator; the counter is only
// arithmetic on the sizes the caller passes.
#[allow(unsafe_code)]
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        count_made(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { self.0.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        count_made(new_size);
        // SAFETY: forwarded with the caller's pointer, layout and size.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}
