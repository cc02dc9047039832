//! aether's pure core: the registry model and its compile (`model`), the answers to one
//! connection or request (`resolve`), the converters of registry objects, the capture plan, the
//! sniffer's verdicts, the mesh DNS table and the wire's constants. No IO, no clock, no tasks, no
//! globals: the daemon (`aether`) brings the world in as values and acts on what comes back.
//!
//! The fence is the compiler's, not a convention (issue #38):
//! - the crate is `no_std` outside its own tests, and every file imports `prelude`, whose
//!   `std` is a facade ([`facade`]) of the parts of the standard library that do no IO:
//!   `std::fs`, `std::process`, `std::thread`, `std::env`, the sockets of `std::net` and the
//!   clocks of `std::time` are not in it, so naming them fails the build;
//! - `include!`, `include_str!`, `include_bytes!`, `env!` and `option_env!` are shadowed below by
//!   macros that fail the build; the forms written with a full path (`core::include!`) are
//!   refused by this crate's `clippy.toml`, with the methods that reach IO through a type a
//!   dependency hands over (`Path::exists`, ...);
//! - `Cargo.toml` lists only the pure layer's allowed crates (STYLE.md §6.2).
//!
//! The syn check of `tests/purity.rs` reads these files as a second net.

#![cfg_attr(not(test), no_std)]
// Under test the real `std` is in scope and the prelude's facade is not: a file that names
// only `std` imports the prelude for nothing there.
#![cfg_attr(test, allow(unused_imports))]

#[macro_use]
extern crate alloc;

/// Refuses a build-time read of a file, by name: aether-core takes its data as arguments.
#[cfg(not(test))]
#[allow(unused_macros)]
macro_rules! include {
    ($($t:tt)*) => {
        compile_error!("aether-core reads no files: `include!` is not allowed here (issue #38)")
    };
}

/// Refuses a build-time read of a file, by name.
#[cfg(not(test))]
#[allow(unused_macros)]
macro_rules! include_str {
    ($($t:tt)*) => {
        compile_error!("aether-core reads no files: `include_str!` is not allowed here (issue #38)")
    };
}

/// Refuses a build-time read of a file, by name.
#[cfg(not(test))]
#[allow(unused_macros)]
macro_rules! include_bytes {
    ($($t:tt)*) => {
        compile_error!(
            "aether-core reads no files: `include_bytes!` is not allowed here (issue #38)"
        )
    };
}

/// Refuses a read of the build's environment.
#[cfg(not(test))]
#[allow(unused_macros)]
macro_rules! env {
    ($($t:tt)*) => {
        compile_error!("aether-core reads no environment: `env!` is not allowed here (issue #38)")
    };
}

/// Refuses a read of the build's environment.
#[cfg(not(test))]
#[allow(unused_macros)]
macro_rules! option_env {
    ($($t:tt)*) => {
        compile_error!(
            "aether-core reads no environment: `option_env!` is not allowed here (issue #38)"
        )
    };
}

/// The parts of the standard library aether-core may name: data structures, formatting,
/// addresses and durations. No files, processes, threads, environment, sockets or clocks.
pub mod facade {
    extern crate std as real;

    pub use self::real::{
        borrow, boxed, char, cmp, collections, convert, error, fmt, hash, iter, mem, num, ops,
        option, ptr, rc, result, slice, str, string, vec,
    };

    /// Shared ownership only: no locks, atomics or once-cells (the model keeps no shared
    /// state).
    pub mod sync {
        pub use super::real::sync::{Arc, Weak};
    }
    /// Addresses only (`core::net`): `std::net`'s sockets are left out.
    pub use core::net;

    /// Durations only: `Instant` and `SystemTime` read a clock.
    pub mod time {
        pub use core::time::Duration;
    }
}

/// What every file of aether-core imports: the standard prelude's owned types (this crate is
/// `no_std`) and `std`, the [`facade`].
pub(crate) mod prelude {
    #[cfg(not(test))]
    pub(crate) use crate::facade as std;
    pub(crate) use alloc::borrow::ToOwned;
    pub(crate) use alloc::boxed::Box;
    pub(crate) use alloc::string::{String, ToString};
    pub(crate) use alloc::vec::Vec;
}

/// The capture plan of a pod: which rules and listeners its network namespace gets.
pub mod capture {
    pub mod plan;
}

/// The mesh DNS table and the resolver configuration it answers by.
pub mod dns {
    pub mod resolv;
    pub mod table;
}

/// SPIFFE identities as the mesh writes and reads them.
pub mod identity {
    pub mod id;
}

pub mod marks;
pub mod model;

/// The sniffer's verdicts on a connection's first bytes.
pub mod proxy {
    pub mod sniff;
}

/// The registrar's Lease election, as a state machine given the clock.
pub mod registrar {
    pub mod lease;
}

/// Registry objects as the sources read them, and their conversion to the model's rows.
pub mod registry {
    /// The Kubernetes objects' converters.
    pub mod kube {
        pub mod convert;
        pub mod mesh_filter;
        pub mod pod;
    }
}

/// The reference evaluator and comparable verdicts, for tests (here and, through the `testing`
/// feature, the daemon's).
#[cfg(any(test, feature = "testing"))]
pub mod reference;
pub mod resolve;

/// The merge of a route's status with other writers' entries.
pub mod route_status {
    pub mod merge;
}

pub mod wire;
