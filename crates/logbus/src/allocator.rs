//! Freed memory goes back to the kernel within 10 ms unless the
//! environment sets mimalloc's purge delay.
//!
//! mimalloc keeps pages it has emptied for a while before handing them back
//! (`purge_delay`, 1,000 ms compiled into the version linked), in case they
//! are wanted again. A pipeline allocates an event on one thread and frees
//! it on another, so at a few hundred thousand events a second a second's
//! worth of emptied pages is tens of MiB: a flood of the reference pipeline
//! at `channel_capacity: 4096` peaked at 55–60 MiB with the default and
//! 41–42 MiB at 10 ms, with no CPU or throughput cost above the machine's
//! ±7 % noise, where 0 ms (purge at once) cost a third of the throughput
//! (docs/benchmarks.md, "Peak RSS under a flood"). An edge agent is judged
//! by its memory. A site that prefers another delay sets
//! `MIMALLOC_PURGE_DELAY` (mimalloc's own variable, read at start); the
//! value here is only a default, so the variable wins.

/// The delay `logbus` runs with, in milliseconds, unless the environment
/// says otherwise.
pub const DELAY_MS: i64 = 10;

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e` (the `-sys`
/// crate names only the options older versions had); a test checks that
/// this index reads the option's compiled-in default.
#[cfg(feature = "mimalloc")]
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Makes [`DELAY_MS`] the purge delay's default: mimalloc keeps a value
/// the environment gave it. Returns whether the allocator is mimalloc.
#[cfg(feature = "mimalloc")]
#[allow(unsafe_code)]
pub fn tune() -> bool {
    // SAFETY: mi_option_set_default stores an integer in mimalloc's option
    // table unless the option was set (by the environment or mi_option_set);
    // PURGE_DELAY is in range (a test reads it back).
    unsafe { libmimalloc_sys::mi_option_set_default(PURGE_DELAY, DELAY_MS as _) };
    true
}

#[cfg(not(feature = "mimalloc"))]
pub fn tune() -> bool {
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
    #[allow(unsafe_code)]
    fn the_delay_is_shortened_unless_it_was_set() {
        let from_environment = std::env::vars_os().any(|(name, _)| {
            let name = name.to_string_lossy().to_ascii_uppercase();
            name == "MIMALLOC_PURGE_DELAY" || name == "MIMALLOC_RESET_DELAY"
        });
        if !from_environment {
            // The index names the purge delay: its compiled-in default is
            // 1,000 ms, a value no neighbouring option has.
            assert_eq!(delay(), 1000, "option {PURGE_DELAY} is not purge_delay");
            assert!(tune());
            assert_eq!(delay(), DELAY_MS);
        }
        // A value set as the environment sets it is kept.
        // SAFETY: stores an integer in mimalloc's option table.
        unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, 250) };
        assert!(tune());
        assert_eq!(delay(), 250, "a delay set before is kept");
    }
}
