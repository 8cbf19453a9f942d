//! Freed memory goes back to the kernel within 10 ms unless
//! `MIMALLOC_PURGE_DELAY` says otherwise.
//!
//! mimalloc keeps pages it has emptied for a while before handing them back
//! (`purge_delay`, 1,000 ms in the version linked), in case they are wanted
//! again. A pipeline allocates an event on one thread and frees it on
//! another, so at a few hundred thousand events a second a second's worth
//! of emptied pages is tens of MiB: a flood of the reference pipeline at
//! `channel_capacity: 4096` peaked at 54 MiB with the default and 45 MiB at
//! 10 ms, with no CPU or throughput cost measured, where 0 ms (purge at
//! once) cost a third of the throughput (docs/benchmarks.md, "Peak RSS
//! under a flood"). An edge agent is judged by its memory; a site that
//! prefers the allocator's own default sets the variable, which mimalloc
//! reads at start and this module then leaves alone.

use std::ffi::OsString;

/// The allocator's variable for the option; set, it wins.
pub const DELAY_VARIABLE: &str = "MIMALLOC_PURGE_DELAY";

/// The delay `logbus` runs with, in milliseconds.
pub const DELAY_MS: i64 = 10;

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e` (the `-sys`
/// crate names only the options older versions had); a test checks that
/// this index reads the option's documented default.
#[cfg(feature = "mimalloc")]
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sets the purge delay to [`DELAY_MS`] unless the environment sets it.
/// Returns whether it did.
pub fn tune() -> bool {
    tune_unless(std::env::var_os(DELAY_VARIABLE))
}

fn tune_unless(set_by_environment: Option<OsString>) -> bool {
    if set_by_environment.is_some() {
        return false;
    }
    set_delay(DELAY_MS)
}

#[cfg(feature = "mimalloc")]
#[allow(unsafe_code)]
fn set_delay(ms: i64) -> bool {
    // SAFETY: mi_option_set stores an integer in mimalloc's option table;
    // PURGE_DELAY is in range (a test reads it back).
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, ms as _) };
    true
}

#[cfg(not(feature = "mimalloc"))]
fn set_delay(_ms: i64) -> bool {
    false
}

#[cfg(all(test, feature = "mimalloc"))]
mod tests {
    use super::*;

    #[allow(unsafe_code)]
    fn delay() -> i64 {
        // SAFETY: reads an integer from mimalloc's option table.
        unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) as i64 }
    }

    /// One test, as the option is process-wide.
    #[test]
    fn the_delay_is_shortened_unless_the_environment_sets_it() {
        if std::env::var_os(DELAY_VARIABLE).is_none() {
            // The index names the purge delay: its default is 1,000 ms,
            // a value no neighbouring option has.
            assert_eq!(delay(), 1000, "option {PURGE_DELAY} is not purge_delay");
        }
        let before = delay();
        assert!(!tune_unless(Some("1000".into())));
        assert_eq!(delay(), before, "a delay set by the environment is kept");
        assert!(tune_unless(None));
        assert_eq!(delay(), DELAY_MS);
    }
}
