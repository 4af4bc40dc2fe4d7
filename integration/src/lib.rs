//! End-to-end test bed for elemental-changelog: real etcd, kube-apiserver with
//! the aggregation layer, kubectl and helm on loopback, with our server
//! registered through an `APIService` ([`testbed`]).
//!
//! Used by the end-to-end tests under `tests/` and by the `demo` binary.

pub mod audit;
pub mod availability;
pub mod bench;
pub mod events;
pub mod faults;
pub mod fixtures;
pub mod generated;
pub mod hostile;
pub mod image;
pub mod markdown;
pub mod paths;
pub mod plugin;
pub mod publish;
pub mod rbac;
pub mod registry;
pub mod sample;
pub mod stalled;
pub mod table;
pub mod testbed;
pub mod timing;
pub mod ui_fixtures;
pub mod wait;
