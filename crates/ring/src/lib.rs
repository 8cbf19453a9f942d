//! Building blocks of the local-scope stage queue, kept apart from the
//! engine so they can be model-checked on their own: run
//! `RUSTFLAGS="--cfg loom" cargo test -p logbus-ring --release --test loom`
//! to explore every interleaving of the ring and of the idle-helper
//! hand-off with [loom](https://docs.rs/loom).
//!
//! - [`spsc`]: a bounded single-producer/single-consumer ring whose producer
//!   publishes a whole batch or nothing, as the admission predicate needs.
//! - [`idle`]: the set of frontend consumers asleep and willing to help the
//!   shared backend, with the announce/re-check/wake protocol that makes a
//!   lost wake-up impossible.

pub mod idle;
pub mod spsc;

pub(crate) mod sync {
    #[cfg(loom)]
    pub(crate) use loom::cell::UnsafeCell;
    #[cfg(loom)]
    pub(crate) use loom::sync::Arc;
    #[cfg(loom)]
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};

    #[cfg(not(loom))]
    pub(crate) use std::sync::Arc;
    #[cfg(not(loom))]
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};

    /// `std`'s cell with loom's closure-style access, so one body of code
    /// runs under both.
    #[cfg(not(loom))]
    #[derive(Debug)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    #[cfg(not(loom))]
    impl<T> UnsafeCell<T> {
        pub(crate) fn new(value: T) -> Self {
            UnsafeCell(std::cell::UnsafeCell::new(value))
        }
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}
