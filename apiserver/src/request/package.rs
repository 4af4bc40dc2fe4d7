//! `package`, `packageAtLeast` and `packageBelow` (the lists of versions and machines, and
//! their watches): a package name and an optional range of EVRs, each checked by the rules
//! of [`elemental_changelog::package_index`], which a 400 answer states.

use elemental_changelog::package_index::{self, Bound, PackageQuery};
use elemental_changelog_apiservice::status::StatusError;

use super::{QueryValues, invalid_value, non_empty};

/// The query parameter of the package name.
pub const NAME: &str = "package";
/// The query parameter of the lowest EVR selected.
pub const AT_LEAST: &str = "packageAtLeast";
/// The query parameter of the lowest EVR no longer selected.
pub const BELOW: &str = "packageBelow";

/// The package query of `query`, if `package` is given; a bound without `package`, a name
/// or a bound breaking its rule, or an empty range is a 400 naming the parameter.
pub(super) fn parse(query: &QueryValues) -> Result<Option<Box<PackageQuery>>, StatusError> {
    let at_least = non_empty(query, AT_LEAST);
    let below = non_empty(query, BELOW);
    let Some(name) = non_empty(query, NAME) else {
        return match (at_least, below) {
            (Some(value), _) => Err(invalid_value(AT_LEAST, value, "needs package")),
            (None, Some(value)) => Err(invalid_value(BELOW, value, "needs package")),
            (None, None) => Ok(None),
        };
    };
    PackageQuery::new(name, at_least, below)
        .map(|query| Some(Box::new(query)))
        .map_err(|error| {
            let (field, value) = match &error {
                package_index::Error::Name => (NAME, name),
                package_index::Error::Evr {
                    bound: Bound::AtLeast,
                }
                | package_index::Error::EmptyRange => (AT_LEAST, at_least.unwrap_or_default()),
                package_index::Error::Evr {
                    bound: Bound::Below,
                } => (BELOW, below.unwrap_or_default()),
            };
            invalid_value(field, value, &error.to_string())
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
