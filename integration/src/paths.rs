//! The API paths of this server's group-version, as tests and the
//! `soak`/`bench` binaries request them (through kube-apiserver, or straight
//! from the server: the paths are the same).

use elemental_changelog_apiservice::{RESOURCE, SUBRESOURCE};

use crate::testbed::elemental::CHANNEL_LABEL;

/// `/apis/<group>/<version>`.
pub const GROUP_VERSION: &str = "/apis/changelog.elemental.cattle.io/v1beta1";

/// The changelog of ManagedOSVersion `namespace/name`, without a query.
pub fn changelog_path(namespace: &str, name: &str) -> String {
    format!("{GROUP_VERSION}/namespaces/{namespace}/{RESOURCE}/{name}/{SUBRESOURCE}")
}

/// The summary of ManagedOSVersion `namespace/name`.
pub fn summary_path(namespace: &str, name: &str) -> String {
    format!("{GROUP_VERSION}/namespaces/{namespace}/{RESOURCE}/{name}")
}

/// The list of summaries in `namespace`, without a query.
pub fn summaries_path(namespace: &str) -> String {
    format!("{GROUP_VERSION}/namespaces/{namespace}/{RESOURCE}")
}

/// The summaries of channel `channel`'s versions in `namespace` (a label selector).
pub fn channel_summaries_path(namespace: &str, channel: &str) -> String {
    format!(
        "{}?labelSelector={CHANNEL_LABEL}%3D{channel}",
        summaries_path(namespace)
    )
}

/// The list of summaries in every namespace, without a query.
pub fn all_summaries_path() -> String {
    format!("{GROUP_VERSION}/{RESOURCE}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_the_served_group_version() {
        assert_eq!(
            GROUP_VERSION,
            format!("/apis/{}", elemental_changelog_apiservice::API_VERSION)
        );
        assert_eq!(
            changelog_path("fleet-default", "v1"),
            "/apis/changelog.elemental.cattle.io/v1beta1/namespaces/fleet-default/managedosversions/v1/changelog"
        );
        assert_eq!(
            summaries_path("ns"),
            "/apis/changelog.elemental.cattle.io/v1beta1/namespaces/ns/managedosversions"
        );
        assert_eq!(
            all_summaries_path(),
            "/apis/changelog.elemental.cattle.io/v1beta1/managedosversions"
        );
        assert_eq!(
            summary_path("ns", "v1"),
            "/apis/changelog.elemental.cattle.io/v1beta1/namespaces/ns/managedosversions/v1"
        );
    }
}
