//! What a reconcile tells on its way, before its result: the one thing it hands to the
//! runtime while it runs. The runtime (`controller`) implements [`Progress`] by
//! publishing under the worker's lease; `reconcile` and `retained` see only the trait, so
//! the dependency points one way: the runtime above the reconcile, never back.

use crate::cache::RetainedStatuses;

/// Where a reconcile tells that the channel's first read was attempted (readiness), and
/// which retained versions are being rebuilt from an older image (published at once, so
/// that they answer "not fetched yet" meanwhile).
pub(super) trait Progress: Sync {
    /// The channel's image was read (or failed) for every architecture.
    fn attempted(&self);

    /// Retained versions are being rebuilt from older images.
    fn rebuilding(&self, statuses: RetainedStatuses);
}
