//! Elemental channel data and the changelogs computed from it.
//!
//! A channel image carries `/channel.json` ([`channel`]) and, optionally,
//! under `/changelogs/`: precomputed advisories per version ([`updates`]),
//! package lists per version ([`packages`]) and a repodata
//! `updateinfo.xml` ([`updateinfo`]). [`data::ChannelData`] holds the parsed
//! content of one image for one architecture; [`compute::IndexedChannel`]
//! orders its versions and answers the queries (the layering is one-way:
//! `compute` builds on `data`, never the reverse). Package versions are
//! ordered by [`rpmver`]; [`package_index`] tells which versions carry a package.
//! Nothing here does I/O: callers pass bytes or
//! readers in.

pub mod channel;
pub mod compute;
pub mod data;
pub mod package_index;
pub mod packages;
pub mod rpmver;
pub mod updateinfo;
pub mod updates;
