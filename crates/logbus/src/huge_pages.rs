//! Transparent huge pages are off for the process unless
//! `LOGBUS_HUGE_PAGES=1` says otherwise.
//!
//! The allocator asks the kernel for huge pages (`madvise`), and the kernel
//! then backs any 2 MiB region touched at all with a whole huge page. A
//! pipeline's heap is a few MiB in use spread over many such regions, so
//! huge pages cost the reference pipeline about 15 MiB of peak RSS and a
//! one-event run 12 MiB, for no throughput measured on these workloads
//! (docs/benchmarks.md, "Peak RSS"). An edge agent is judged by its memory;
//! a site that wants the huge pages back sets the variable.

/// The variable that keeps the system's huge-page setting.
pub const KEEP_VARIABLE: &str = "LOGBUS_HUGE_PAGES";

/// Turns transparent huge pages off for this process (what it maps from
/// now on), unless [`KEEP_VARIABLE`] is `1`. Returns whether it did.
pub fn limit() -> bool {
    if std::env::var_os(KEEP_VARIABLE).is_some_and(|v| v == "1") {
        return false;
    }
    disable()
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn disable() -> bool {
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and changes
    // a flag of this process; it touches no memory of ours.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn disable() -> bool {
    false
}
