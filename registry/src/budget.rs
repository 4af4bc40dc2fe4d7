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
//!
//! How much a pull reserves, grows to and keeps for the parse of its files is
//! decided in one place, [`PullMemory`].

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

/// All the memory arithmetic of a pull and of the parse of what it keeps, for
/// a budget of a given size: what a pull reserves up front, how far keeping
/// files grows that reservation, what it holds for the parse afterwards, and
/// whether the largest image the limits allow can fit at all.
///
/// A pull holds, in turn:
/// 1. up front ([`PullMemory::pull`]): the working set, the `updateinfo.xml`
///    allowance, and the [typical kept files](PullMemory::KEPT_ALLOWANCE)
///    with their parse;
/// 2. while keeping files ([`PullMemory::while_keeping`]): that, grown by what
///    is kept beyond the typical allowance;
/// 3. once pulled ([`PullMemory::parse`]): the working set given back; the
///    kept files (at least the typical allowance), their parse
///    ([`PullMemory::PARSE_BYTES_PER_KEPT_BYTE`] per byte) and the
///    `updateinfo.xml` allowance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PullMemory {
    budget: u64,
}

/// The memory a pulled image holds for the parse of its files (step 3 of
/// [`PullMemory`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseMemory {
    /// The whole reservation to hold.
    pub total: u64,
    /// Of it, the cap on one `updateinfo.xml` parse.
    pub updateinfo_bytes: u64,
    /// Of it, the cap on the parse of the other kept files together.
    pub parse_bytes: u64,
}

impl PullMemory {
    /// Memory a pull needs besides the files it keeps: the zstd window (up to
    /// 32 MiB), the chunks in flight and decoder buffers; the manifests (at
    /// most `client::MAX_MANIFEST_BYTES` each, parsed) come before the
    /// layers and fit in it too.
    pub const PULL_WORKING_SET: u64 = 40 << 20;
    /// Memory reserved per kept byte for parsing it, besides the byte itself. An `updates.log`
    /// is read advisory by advisory into its type (measured: a peak of 1.7 bytes per byte of
    /// JSON for 27 000 real-shaped advisories, all of it kept); package lists are interned (a
    /// line seen before costs a pointer). Both are metered as they are parsed, together: past
    /// this allowance a file is rejected, however many tiny advisories or distinct short
    /// package lines an image carries.
    pub const PARSE_BYTES_PER_KEPT_BYTE: u64 = 3;
    /// Share of the budget one `updateinfo.xml` parse may take (the parsed
    /// advisories, as estimated while they are built): one in this many bytes.
    pub const UPDATEINFO_BUDGET_SHARE: u64 = 4;
    /// Kept files (and their parse) reserved with the working set, so that typical images
    /// (kept files of some KiB) never grow their reservation: growth cannot wait (two pulls
    /// each holding part of the budget and waiting for more would wait forever), so it fails
    /// when other pulls hold the rest, and a pull that waits for its whole reservation up
    /// front is never refused for that.
    pub const KEPT_ALLOWANCE: u64 = 256 << 10;

    /// The arithmetic for a budget of `budget` bytes.
    pub fn new(budget: u64) -> Self {
        Self { budget }
    }

    /// The cap on one `updateinfo.xml` parse.
    pub fn updateinfo_bytes(&self) -> u64 {
        self.budget / Self::UPDATEINFO_BUDGET_SHARE
    }

    /// What typical kept files and their parse take, reserved up front.
    fn kept_allowance() -> u64 {
        Self::KEPT_ALLOWANCE * (1 + Self::PARSE_BYTES_PER_KEPT_BYTE)
    }

    /// What a pull reserves (and waits for) before it starts.
    pub fn pull(&self) -> u64 {
        Self::PULL_WORKING_SET + self.updateinfo_bytes() + Self::kept_allowance()
    }

    /// What a pull that reserved `base` up front must hold once it keeps
    /// `kept` bytes of files: the files beyond the typical allowance grow it.
    pub fn while_keeping(base: u64, kept: u64) -> u64 {
        base + kept.saturating_sub(Self::kept_allowance())
    }

    /// What a pulled image that kept `kept` bytes holds until its files are
    /// parsed.
    pub fn parse(&self, kept: u64) -> ParseMemory {
        let kept = kept.max(Self::KEPT_ALLOWANCE);
        let parse_bytes = kept * Self::PARSE_BYTES_PER_KEPT_BYTE;
        let updateinfo_bytes = self.updateinfo_bytes();
        ParseMemory {
            total: updateinfo_bytes + kept + parse_bytes,
            updateinfo_bytes,
            parse_bytes,
        }
    }

    /// Whether the largest image whose kept files reach `max_kept` bytes fits
    /// the budget: the working set and the `updateinfo.xml` allowance while it
    /// is pulled, then the allowance and its kept files with their parse.
    pub fn largest_pull_fits(&self, max_kept: u64) -> Result<(), BudgetError> {
        let updateinfo = self.updateinfo_bytes();
        let needed = (Self::PULL_WORKING_SET + updateinfo)
            .max(updateinfo + max_kept.saturating_mul(1 + Self::PARSE_BYTES_PER_KEPT_BYTE));
        if needed > self.budget {
            return Err(BudgetError::NeverFits {
                what: "an image of --max-kept-size",
                needed,
                budget: self.budget,
            });
        }
        Ok(())
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

    #[test]
    fn the_memory_of_a_pull() {
        let memory = PullMemory::new(160 * MIB);
        assert_eq!(memory.updateinfo_bytes(), 40 * MIB);
        assert_eq!(memory.pull(), 40 * MIB + 40 * MIB + MIB);
        // Typical files fit what was reserved up front.
        assert_eq!(
            PullMemory::while_keeping(memory.pull(), 100 << 10),
            memory.pull()
        );
        assert_eq!(
            PullMemory::while_keeping(memory.pull(), 2 * MIB),
            memory.pull() + MIB
        );
        let small = memory.parse(1);
        assert_eq!(small.parse_bytes, 768 << 10);
        assert_eq!(small.total, 40 * MIB + MIB);
        let large = memory.parse(8 * MIB);
        assert_eq!((large.total, large.parse_bytes), (72 * MIB, 24 * MIB));
        assert_eq!(large.updateinfo_bytes, 40 * MIB);
    }

    #[test]
    fn the_defaults_fit_the_default_budget() {
        PullMemory::new(160 * MIB)
            .largest_pull_fits(24 * MIB)
            .unwrap();
        let error = PullMemory::new(64 * MIB)
            .largest_pull_fits(24 * MIB)
            .unwrap_err();
        assert!(error.to_string().contains("--memory-budget"), "{error}");
    }
}
