//! Which frontend consumers are asleep and willing to help the backend.
//!
//! A frontend (FE) consumer with nothing local to do may help drain the
//! shared backend (BE). Waking it when BE work arrives is a classic
//! lost-wake-up hazard: the helper checks "BE empty" and goes to sleep
//! while a producer pushes and checks "nobody asleep". The protocol:
//!
//! 1. Helper: [`IdleSet::announce`] (a `SeqCst` read-modify-write and fence),
//!    then re-check the BE and its own ring. If either has work, it
//!    [`IdleSet::withdraw`]s and works; otherwise it parks on its own
//!    notifier, which keeps a wake-up that arrives before the park.
//! 2. Producer: publish the BE work, then [`IdleSet::wake_one`] (fence, then
//!    load): whichever of the two orders the fences take, either the helper's
//!    re-check sees the work or the producer sees the announcement.
//! 3. Hand-off: a helper that was picked but turns to local work it found
//!    meanwhile calls [`IdleSet::wake_one`] again when the BE still holds work,
//!    so the wake-up it consumed is passed to another idle helper instead of
//!    leaving BE work unattended while it is busy.
//!
//! `wake_one` removes the helper it picks from the set before waking it, so
//! a wake-up is spent on exactly one helper and two producers never pick
//! the same one.

use crate::sync::{AtomicU64, Ordering, fence};

/// Most helpers a set can hold (one bit each).
pub const MAX_HELPERS: usize = 64;

#[derive(Debug, Default)]
pub struct IdleSet {
    bits: AtomicU64,
}

impl IdleSet {
    pub fn new() -> Self {
        IdleSet {
            bits: AtomicU64::new(0),
        }
    }

    /// Step 1 of going to sleep: the caller must re-check for work after
    /// this returns, and [`withdraw`](Self::withdraw) if it finds some.
    pub fn announce(&self, slot: usize) {
        debug_assert!(slot < MAX_HELPERS);
        self.bits.fetch_or(1 << slot, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Leaves the set; returns whether the slot was still in it (`false`:
    /// a producer picked it, and its wake-up is on the way or has arrived).
    pub fn withdraw(&self, slot: usize) -> bool {
        let bit = 1 << slot;
        self.bits.fetch_and(!bit, Ordering::SeqCst) & bit != 0
    }

    /// After publishing BE work: picks one announced helper, removes it from
    /// the set and calls `wake` with its slot. Returns the slot, or `None`
    /// when nobody is idle.
    pub fn wake_one(&self, wake: impl FnOnce(usize)) -> Option<usize> {
        fence(Ordering::SeqCst);
        let mut bits = self.bits.load(Ordering::SeqCst);
        while bits != 0 {
            let slot = bits.trailing_zeros() as usize;
            let bit = 1u64 << slot;
            let before = self.bits.fetch_and(!bit, Ordering::SeqCst);
            if before & bit != 0 {
                wake(slot);
                return Some(slot);
            }
            bits = before & !bit;
        }
        None
    }

    /// Whether any helper is announced (a cheap pre-check for producers;
    /// correctness never depends on it because `wake_one` re-checks).
    pub fn is_empty(&self) -> bool {
        self.bits.load(Ordering::Relaxed) == 0
    }

    pub fn count(&self) -> u32 {
        self.bits.load(Ordering::Relaxed).count_ones()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn wake_one_picks_each_announced_helper_once() {
        let set = IdleSet::new();
        set.announce(3);
        set.announce(1);
        let mut woken = Vec::new();
        assert_eq!(set.wake_one(|s| woken.push(s)), Some(1));
        assert_eq!(set.wake_one(|s| woken.push(s)), Some(3));
        assert_eq!(set.wake_one(|s| woken.push(s)), None);
        assert_eq!(woken, vec![1, 3]);
    }

    #[test]
    fn withdraw_tells_whether_a_producer_picked_the_slot() {
        let set = IdleSet::new();
        set.announce(0);
        assert!(set.withdraw(0), "nobody picked it");
        set.announce(0);
        set.wake_one(|_| {});
        assert!(!set.withdraw(0), "picked: a wake-up is on its way");
        assert!(set.is_empty());
    }

    /// Withdrawing one slot leaves the others announced; `count` and
    /// `is_empty` follow every step.
    #[test]
    fn withdraw_leaves_the_other_slots_and_count_follows() {
        let set = IdleSet::new();
        assert!(set.is_empty());
        assert_eq!(set.count(), 0);
        for slot in [1, 3, 63] {
            set.announce(slot);
        }
        assert!(!set.is_empty());
        assert_eq!(set.count(), 3);
        assert!(set.withdraw(3));
        assert_eq!(set.count(), 2);
        assert!(!set.withdraw(3), "already out");
        assert_eq!(set.count(), 2);
        let mut woken = Vec::new();
        while set.wake_one(|s| woken.push(s)).is_some() {}
        assert_eq!(woken, [1, 63]);
        assert!(set.is_empty());
        assert_eq!(set.count(), 0);
    }
}
