//! The fleet view's paths (see `docs/api.md`, The fleet view):
//!
//! | path | [`FleetResource`] |
//! |---|---|
//! | `.../machineinventories`, `.../namespaces/{ns}/machineinventories` | `Machines` |
//! | `.../namespaces/{ns}/machineinventories/{name}` | `Machine` |
//! | `.../namespaces/{ns}/machineinventories/{name}/changelog` | `MachineChangelog` |
//! | `.../namespaces/{ns}/managedosimages/{name}/changelog` | `ImageChangelog` |

use elemental_changelog_apiservice::{
    Arch, IMAGE_RESOURCE, MACHINE_RESOURCE, SUBRESOURCE, content::IncludeObject,
    status::StatusError,
};

use super::RequestResource;
use super::{
    Format, ListParams, QueryValues, Target, arch, cve_id, include_object, invalid_value,
    is_dns1123_subdomain, namespace, non_empty,
};

/// A request of the fleet view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FleetResource {
    /// Machines, in a namespace or in all.
    Machines {
        /// Namespace, or all.
        namespace: Option<String>,
        /// Parameters (`labelSelector`, `fieldSelector`, `cve`, `arch`, `includeObject`).
        params: ListParams,
    },
    /// One machine.
    Machine {
        /// Namespace.
        namespace: String,
        /// MachineInventory name.
        name: String,
        /// Parameters.
        params: MachineParams,
    },
    /// The changelog pending for a machine.
    MachineChangelog {
        /// Namespace.
        namespace: String,
        /// MachineInventory name.
        name: String,
        /// Parameters.
        params: MachineChangelogParams,
    },
    /// A ManagedOSImage's upgrade plan.
    ImageChangelog {
        /// Namespace.
        namespace: String,
        /// ManagedOSImage name.
        name: String,
        /// `arch`; the server's default when `None`.
        arch: Option<Arch>,
    },
}

/// Parameters of one machine.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineParams {
    /// `arch`.
    pub arch: Option<Arch>,
    /// `cve`.
    pub cve: Option<String>,
    /// `includeObject`, for Table answers.
    pub include_object: IncludeObject,
}

/// Parameters of a machine's changelog.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineChangelogParams {
    /// `to`: a ManagedOSVersion of the channel of the machine's current version; its target
    /// when `None`.
    pub to: Option<String>,
    /// `arch`.
    pub arch: Option<Arch>,
    /// `format`.
    pub format: Format,
}

/// The target of `rest` (the segments after `/apis/<group>/<version>/`) when it is a fleet
/// path; `NotFound` otherwise.
pub(super) fn target(
    rest: &[&str],
    query: &QueryValues,
) -> Result<Target, (RequestResource, StatusError)> {
    let machines = |e| (RequestResource::Machines, e);
    let machine_changelog = |e| (RequestResource::MachineChangelog, e);
    let image_changelog = |e| (RequestResource::ImageChangelog, e);
    Ok(Target::Fleet(match rest {
        [r] if *r == MACHINE_RESOURCE => FleetResource::Machines {
            namespace: None,
            params: ListParams::parse(query).map_err(machines)?,
        },
        ["namespaces", ns, r] if *r == MACHINE_RESOURCE && !ns.is_empty() => {
            FleetResource::Machines {
                namespace: Some(namespace(ns).map_err(machines)?),
                params: ListParams::parse(query).map_err(machines)?,
            }
        }
        ["namespaces", ns, r, name]
            if *r == MACHINE_RESOURCE && !ns.is_empty() && !name.is_empty() =>
        {
            FleetResource::Machine {
                namespace: namespace(ns).map_err(machines)?,
                name: name_of("name", name, "MachineInventory").map_err(machines)?,
                params: MachineParams {
                    arch: arch(query).map_err(machines)?,
                    cve: non_empty(query, "cve")
                        .map(cve_id)
                        .transpose()
                        .map_err(machines)?,
                    include_object: include_object(query).map_err(machines)?,
                },
            }
        }
        ["namespaces", ns, r, name, s]
            if *r == MACHINE_RESOURCE
                && *s == SUBRESOURCE
                && !ns.is_empty()
                && !name.is_empty() =>
        {
            FleetResource::MachineChangelog {
                namespace: namespace(ns).map_err(machine_changelog)?,
                name: name_of("name", name, "MachineInventory").map_err(machine_changelog)?,
                params: MachineChangelogParams {
                    to: non_empty(query, "to")
                        .map(|to| name_of("to", to, "ManagedOSVersion"))
                        .transpose()
                        .map_err(machine_changelog)?,
                    arch: arch(query).map_err(machine_changelog)?,
                    format: Format::parse(query.first("format").unwrap_or_default())
                        .map_err(machine_changelog)?,
                },
            }
        }
        ["namespaces", ns, r, name, s]
            if *r == IMAGE_RESOURCE && *s == SUBRESOURCE && !ns.is_empty() && !name.is_empty() =>
        {
            FleetResource::ImageChangelog {
                namespace: namespace(ns).map_err(image_changelog)?,
                name: name_of("name", name, "ManagedOSImage").map_err(image_changelog)?,
                arch: arch(query).map_err(image_changelog)?,
            }
        }
        _ => return Ok(Target::NotFound),
    }))
}

/// An object name: a DNS-1123 subdomain.
fn name_of(field: &str, name: &str, kind: &str) -> Result<String, StatusError> {
    if is_dns1123_subdomain(name) {
        Ok(name.to_owned())
    } else {
        Err(invalid_value(
            field,
            name,
            &format!(
                "a {kind} name is a DNS-1123 subdomain: lower-case alphanumerics, '-' and '.', at most 253"
            ),
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use http::{Method, Uri};

    use super::*;
    use crate::request::RequestInfo;

    fn parse(path: &str) -> RequestInfo {
        RequestInfo::parse(&Method::GET, &path.parse::<Uri>().unwrap()).unwrap()
    }

    const BASE: &str = "/apis/changelog.elemental.cattle.io/v1beta1";

    #[test]
    fn fleet_paths_parse_with_their_attributes() {
        let info = parse(&format!("{BASE}/machineinventories?cve=cve-2024-1234"));
        assert_eq!(info.verb(), "list");
        let Target::Fleet(FleetResource::Machines { namespace, params }) = info.target() else {
            panic!("{:?}", info.target());
        };
        assert_eq!(*namespace, None);
        assert_eq!(params.cve.as_deref(), Some("CVE-2024-1234"));
        assert_eq!(info.metric(), RequestResource::Machines);

        let info = parse(&format!(
            "{BASE}/namespaces/fleet-default/machineinventories/m-1/changelog?to=v2&format=md&arch=arm64"
        ));
        assert_eq!(info.verb(), "get");
        let r = info.attributes().resource().unwrap();
        assert_eq!(
            (
                r.resource.as_str(),
                r.subresource.as_deref(),
                r.name.as_deref()
            ),
            ("machineinventories", Some("changelog"), Some("m-1"))
        );
        let Target::Fleet(FleetResource::MachineChangelog { params, .. }) = info.target() else {
            panic!("{:?}", info.target());
        };
        assert_eq!(params.to.as_deref(), Some("v2"));
        assert_eq!(params.format, Format::Markdown);
        assert_eq!(info.metric(), RequestResource::MachineChangelog);

        let info = parse(&format!(
            "{BASE}/namespaces/fleet-default/managedosimages/up/changelog"
        ));
        assert!(matches!(
            info.target(),
            Target::Fleet(FleetResource::ImageChangelog { .. })
        ));
        // Only the changelog of a ManagedOSImage is served.
        let info = parse(&format!(
            "{BASE}/namespaces/fleet-default/managedosimages/up"
        ));
        assert_eq!(*info.target(), Target::NotFound);
    }

    #[test]
    fn invalid_values_are_400_after_authorization() {
        for (path, field) in [
            (
                "/namespaces/ns/machineinventories/m/changelog?to=Not_A_Name",
                "to",
            ),
            (
                "/namespaces/ns/machineinventories/m/changelog?format=pdf",
                "format",
            ),
            ("/namespaces/ns/machineinventories/m?cve=nope", "cve"),
            (
                "/machineinventories?labelSelector=a%20in%20(",
                "labelSelector",
            ),
            ("/namespaces/ns/machineinventories/Bad_Name", "name"),
        ] {
            let info = parse(&format!("{BASE}{path}"));
            let Target::Invalid { error, .. } = info.target() else {
                panic!("{path}: {:?}", info.target());
            };
            assert_eq!(error.code(), 400, "{path}");
            let _ = field;
        }
    }
}
