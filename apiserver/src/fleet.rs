//! The fleet view, as pure functions: which ManagedOSVersion each registered
//! machine (MachineInventory) runs, which version it would be upgraded to
//! (a ManagedOSImage that selects it, else the newest version of its
//! channel), its state, its exposure to a CVE, and a ManagedOSImage's upgrade
//! plan grouped by the versions the machines run.
//!
//! Nothing here does I/O or reads the cache: callers pass the objects of the
//! reflector stores, each channel's version order
//! ([`IndexedChannel::order`](elemental_changelog::compute::IndexedChannel::order))
//! and, for CVEs, a predicate "version X fixes CVE Y". An unresolved machine is
//! `Unknown` with a reason, never a guess. See `docs/api.md` (The fleet view)
//! for the rules and `docs/fleet-research.md` for where they come from.

pub mod caps;
pub mod crd;
pub mod labels;
pub mod metrics;
pub mod os;
pub mod reflect;
pub mod resolve;
pub mod select;

pub use resolve::{FleetIndex, MachineResolution, Orders, Pending, PlanTarget, UpgradePlan};
pub use select::{Fleet, FleetCluster, FleetClusterGroup, Selection};

#[cfg(test)]
mod tests;

/// The wire name of an enum value (its serde name).
pub fn wire<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}
