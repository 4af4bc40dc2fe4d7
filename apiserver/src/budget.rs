//! One memory budget for everything an image can make the server hold:
//! pulls (the decompressor's window, chunks in flight, the kept files) and
//! parses (the parsed form of those files, `updateinfo.xml` included).
//!
//! The operator sets it (`--memory-budget`, sized from the container's
//! memory limit); the server's resident memory stays under the budget plus a
//! constant for the process itself (see `docs/operations.md`).
//!
//! - A pull reserves its fixed part up front ([`Budget::reserve`]) and
//!   **waits** while the budget is spent; a request larger than the whole
//!   budget is **refused** at once, naming the limit.
//! - What a pull keeps grows its reservation as it goes
//!   ([`Reservation::try_grow`]). Growing never waits: a waiting grower holds
//!   memory while it waits, and two of them (or one behind a waiting pull)
//!   would wait for each other forever. It fails instead ([`BudgetError::Busy`])
//!   and the channel retries later with backoff, keeping its last good data.
//! - A reservation is given back when dropped, in part with
//!   [`Reservation::shrink`].
//!
//! Amounts are counted in KiB (rounded up) so that a `u32` of semaphore
//! permits covers budgets up to 4 TiB.

use std::{fmt, sync::Arc};

use tokio::sync::Semaphore;

/// Why memory could not be reserved.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// More than the whole budget: it could never be given.
    #[error(
        "{what} needs {needed} bytes, more than the whole memory budget of {budget} bytes (--memory-budget)"
    )]
    NeverFits {
        /// What asked.
        what: &'static str,
        /// Bytes it needs in all.
        needed: u64,
        /// The budget.
        budget: u64,
    },
    /// The budget is spent by other pulls and parses right now.
    #[error(
        "{what} needs {needed} bytes more, but the memory budget of {budget} bytes (--memory-budget) is in use; retried later"
    )]
    Busy {
        /// What asked.
        what: &'static str,
        /// Bytes asked for.
        needed: u64,
        /// The budget.
        budget: u64,
    },
}

/// The process's memory budget. Cheap to clone; clones share it.
#[derive(Clone)]
pub struct Budget {
    inner: Arc<Inner>,
}

struct Inner {
    total_kib: u32,
    permits: Semaphore,
}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Budget")
            .field("bytes", &self.bytes())
            .field("available", &self.available())
            .finish()
    }
}

fn to_kib(bytes: u64) -> u64 {
    bytes.div_ceil(1024)
}

impl Budget {
    /// A budget of `bytes` (at most 4 TiB).
    pub fn new(bytes: u64) -> Self {
        let total_kib = u32::try_from(to_kib(bytes)).unwrap_or(u32::MAX);
        Self {
            inner: Arc::new(Inner {
                total_kib,
                permits: Semaphore::new(total_kib as usize),
            }),
        }
    }

    /// The whole budget, in bytes.
    pub fn bytes(&self) -> u64 {
        u64::from(self.inner.total_kib) * 1024
    }

    /// Bytes not reserved now.
    pub fn available(&self) -> u64 {
        self.inner.permits.available_permits() as u64 * 1024
    }

    fn never_fits(&self, what: &'static str, needed: u64) -> BudgetError {
        BudgetError::NeverFits {
            what,
            needed,
            budget: self.bytes(),
        }
    }

    /// Reserves `bytes` for `what`, waiting (first come, first served) while
    /// the budget is spent; refuses at once what is more than the whole
    /// budget.
    pub async fn reserve(
        &self,
        what: &'static str,
        bytes: u64,
    ) -> Result<Reservation, BudgetError> {
        let kib = to_kib(bytes);
        let kib = u32::try_from(kib)
            .ok()
            .filter(|kib| *kib <= self.inner.total_kib)
            .ok_or_else(|| self.never_fits(what, bytes))?;
        let permits = self
            .inner
            .permits
            .acquire_many(kib)
            .await
            .map_err(|_| self.never_fits(what, bytes))?;
        permits.forget();
        Ok(Reservation {
            budget: self.clone(),
            what,
            kib,
        })
    }

    /// An empty reservation, to grow with [`Reservation::try_grow`].
    pub fn empty(&self, what: &'static str) -> Reservation {
        Reservation {
            budget: self.clone(),
            what,
            kib: 0,
        }
    }
}

/// Memory reserved from a [`Budget`], given back when dropped.
pub struct Reservation {
    budget: Budget,
    what: &'static str,
    kib: u32,
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("what", &self.what)
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl Reservation {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        u64::from(self.kib) * 1024
    }

    /// The budget it is taken from.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Holds `bytes` more, if the budget has them now; never waits.
    pub fn try_grow(&mut self, bytes: u64) -> Result<(), BudgetError> {
        let kib = to_kib(bytes);
        let total = u64::from(self.kib) + kib;
        if total > u64::from(self.budget.inner.total_kib) {
            return Err(self.budget.never_fits(self.what, total * 1024));
        }
        let kib = u32::try_from(kib).map_err(|_| self.budget.never_fits(self.what, bytes))?;
        match self.budget.inner.permits.try_acquire_many(kib) {
            Ok(permits) => {
                permits.forget();
                self.kib += kib;
                Ok(())
            }
            Err(_) => Err(BudgetError::Busy {
                what: self.what,
                needed: bytes,
                budget: self.budget.bytes(),
            }),
        }
    }

    /// Gives back `bytes` (at most what is held).
    pub fn shrink(&mut self, bytes: u64) {
        let kib = u32::try_from(bytes / 1024)
            .unwrap_or(u32::MAX)
            .min(self.kib);
        self.kib -= kib;
        self.budget.inner.permits.add_permits(kib as usize);
    }

    /// Keeps at most `bytes` (rounded up to a KiB) and gives back the rest.
    pub fn shrink_to(&mut self, bytes: u64) {
        let keep = u32::try_from(to_kib(bytes)).unwrap_or(u32::MAX);
        if keep < self.kib {
            let give = self.kib - keep;
            self.kib = keep;
            self.budget.inner.permits.add_permits(give as usize);
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.inner.permits.add_permits(self.kib as usize);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MIB: u64 = 1 << 20;

    #[tokio::test]
    async fn reservations_are_given_back() {
        let budget = Budget::new(10 * MIB);
        let mut a = budget.reserve("a", 4 * MIB).await.unwrap();
        assert_eq!(budget.available(), 6 * MIB);
        a.try_grow(MIB).unwrap();
        assert_eq!(a.bytes(), 5 * MIB);
        a.shrink(2 * MIB);
        assert_eq!(budget.available(), 7 * MIB);
        a.shrink_to(MIB);
        assert_eq!(budget.available(), 9 * MIB);
        drop(a);
        assert_eq!(budget.available(), 10 * MIB);
        // Rounded up to whole KiB.
        let b = budget.reserve("b", 1).await.unwrap();
        assert_eq!(b.bytes(), 1024);
    }

    #[tokio::test]
    async fn what_never_fits_is_refused_at_once() {
        let budget = Budget::new(10 * MIB);
        let error = budget.reserve("pull", 11 * MIB).await.unwrap_err();
        assert!(
            matches!(error, BudgetError::NeverFits { needed, budget, .. } if needed == 11 * MIB && budget == 10 * MIB)
        );
        assert!(error.to_string().contains("--memory-budget"), "{error}");
        let mut a = budget.reserve("pull", 6 * MIB).await.unwrap();
        assert!(matches!(
            a.try_grow(5 * MIB).unwrap_err(),
            BudgetError::NeverFits { .. }
        ));
        assert_eq!(a.bytes(), 6 * MIB);
        assert!(matches!(
            budget.reserve("x", u64::MAX).await,
            Err(BudgetError::NeverFits { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_spent_budget_makes_reservations_wait_and_growth_fail() {
        let budget = Budget::new(10 * MIB);
        let held = budget.reserve("a", 8 * MIB).await.unwrap();
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move { budget.reserve("b", 4 * MIB).await.map(|r| r.bytes()) }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!waiting.is_finished(), "waits while the budget is spent");
        // The waiting reservation is served first: growth finds nothing.
        let mut small = budget.empty("c");
        assert!(matches!(small.try_grow(MIB), Err(BudgetError::Busy { .. })));
        assert_eq!(small.bytes(), 0);
        drop(held);
        assert_eq!(waiting.await.unwrap().unwrap(), 4 * MIB);
        assert_eq!(budget.available(), 10 * MIB);
    }
}
