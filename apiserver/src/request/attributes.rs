//! What a request asks for, in authorization terms: k8s.io/apiserver's
//! `pkg/endpoints/request/requestinfo.go` (`RequestInfoFactory.NewRequestInfo`) with the API
//! prefixes `api` (groupless) and `apis`.

use std::borrow::Cow;

use elemental_changelog_auth::{Attributes, ResourceAttributes};
use http::Method;

use super::{QueryValues, selector::FieldSelector, selector::LabelSelector};

/// URL forms `/{prefix}/{group}/{version}/{verb}/...` that put the verb in the path.
const SPECIAL_VERBS: [&str; 2] = ["proxy", "watch"];
/// Subresources of a namespace, which make `/namespaces/{ns}/{sub}` a request on the namespace.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

/// The attributes of a request from its method, its percent-decoded path and its query.
///
/// `/api/{version}/...` and `/apis/{group}/{version}/...` with at least one segment after
/// the version are resource requests: the verb comes from the method (`get` becomes
/// `list`, or `watch` with `watch=true`, without a name; `delete` without a name becomes
/// `deletecollection`; a method with no verb gives an empty one), or from a
/// `watch`/`proxy` segment after the version; `namespaces/{ns}/` scopes the request; then
/// come resource, name and subresource. A list with `fieldSelector=metadata.name=<name>`
/// names that object. Everything else (discovery, `/metrics`, `/openapi/v2`, ...) is a
/// non-resource request whose verb is the lower-case method.
pub(super) fn of(method: &Method, path: String, query: &QueryValues) -> Attributes {
    match resource(method, &path, query) {
        Some((verb, resource)) => Attributes::resource_request(path, verb, resource),
        None => {
            Attributes::non_resource_request(path, Cow::Owned(method.as_str().to_ascii_lowercase()))
        }
    }
}

/// The path's segments, without leading and trailing slashes (requestinfo.go's split).
pub(super) fn segments(path: &str) -> Vec<&str> {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        Vec::new()
    } else {
        trimmed.split('/').collect()
    }
}

/// The verb and resource attributes of a resource request; `None` for a non-resource request.
fn resource(
    method: &Method,
    path: &str,
    query: &QueryValues,
) -> Option<(Cow<'static, str>, ResourceAttributes)> {
    let parts = segments(path);
    if parts.len() < 3 {
        return None;
    }
    let (group, rest) = match parts[0] {
        "api" => ("", &parts[1..]),
        "apis" if parts.len() >= 4 => (parts[1], &parts[2..]),
        _ => return None,
    };
    let (version, mut current) = rest.split_first()?;

    let verb: Cow<'static, str> = match current.first() {
        Some(&special) if SPECIAL_VERBS.contains(&special) => {
            // Go refuses `/{prefix}/{group}/{version}/{verb}` alone ("unable to determine kind
            // and namespace"); here it is a request for no resource, which no rule grants.
            current = &current[1..];
            Cow::Owned(special.to_owned())
        }
        _ => Cow::Borrowed(match *method {
            Method::POST => "create",
            Method::GET | Method::HEAD => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        }),
    };

    let mut namespace = None;
    if current.first() == Some(&"namespaces")
        && let Some(&ns) = current.get(1)
    {
        namespace = Some(ns.to_owned());
        if current.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&current[2]) {
            current = &current[2..];
        }
    }

    let resource = current
        .first()
        .map_or_else(String::new, |r| (*r).to_owned());
    let mut name = current.get(1).map(|n| (*n).to_owned());
    let subresource = current
        .get(2)
        .filter(|_| verb != "proxy")
        .map(|s| (*s).to_owned());

    let mut verb = verb;
    if name.as_deref().unwrap_or_default().is_empty() && verb == "get" {
        let list = ListOptions::decode(query);
        verb = Cow::Borrowed(if list.watch { "watch" } else { "list" });
        name = list.name;
    }
    if name.as_deref().unwrap_or_default().is_empty() && verb == "delete" {
        verb = Cow::Borrowed("deletecollection");
    }

    Some((
        verb,
        ResourceAttributes {
            group: group.to_owned(),
            version: (*version).to_owned(),
            resource,
            subresource: subresource.filter(|s| !s.is_empty()),
            namespace: namespace.filter(|ns| !ns.is_empty()),
            name: name.filter(|n| !n.is_empty()),
        },
    ))
}

/// The list options that matter for authorization, decoded as requestinfo.go decodes
/// `metainternalversion.ListOptions`.
#[derive(Debug, Default, PartialEq, Eq)]
struct ListOptions {
    watch: bool,
    /// From `fieldSelector=metadata.name=<name>`, when a valid path segment.
    name: Option<String>,
}

impl ListOptions {
    fn decode(query: &QueryValues) -> Self {
        let first = |key: &str| query.first(key);
        let fields = FieldSelector::parse(first("fieldSelector").unwrap_or_default());
        // The conversions that can fail: selectors that do not parse, integers that are not.
        let decodes = fields.is_ok()
            && LabelSelector::parse(first("labelSelector").unwrap_or_default()).is_ok()
            && ["limit", "timeoutSeconds"]
                .into_iter()
                .all(|key| first(key).is_none_or(|v| v.parse::<i64>().is_ok()));
        // apimachinery's bool conversion (and requestinfo.go's fallback when the options do
        // not decode): only "0" and "false" (any case) are false; "f" is true. Checked
        // against kube-apiserver's audit log in `integration/tests/request_model.rs`.
        let watch = first("watch")
            .is_some_and(|watch| !(watch == "0" || watch.eq_ignore_ascii_case("false")));
        let name = match fields {
            Ok(fields) if decodes => fields
                .exact_name()
                .filter(|name| valid_path_segment(name))
                .map(str::to_owned),
            // Undecodable options: requestinfo.go keeps only `watch`.
            _ => None,
        };
        Self { watch, name }
    }
}

/// Go's `path.IsValidPathSegmentName`: not `.` or `..`, no `/` or `%`.
fn valid_path_segment(name: &str) -> bool {
    name != "." && name != ".." && !name.contains(['/', '%'])
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const BASE: &str = "/apis/changelog.elemental.cattle.io/v1beta1";

    /// The attributes of a raw path and query, as [`crate::request::RequestInfo`] builds them.
    fn attributes(method: &Method, path: &str, query: Option<&str>) -> Attributes {
        let path = super::super::decode_path(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        of(method, path, &QueryValues::parse(query.unwrap_or_default()))
    }

    #[test]
    fn with_name_is_the_request_on_the_other_object() {
        let path = format!("{BASE}/namespaces/fleet-default/managedosversions/v2/changelog");
        let a = attributes(&Method::GET, &path, Some("from=v1"));
        let other = a.with_name("v1").unwrap_or_else(|| panic!("named"));
        assert_eq!(
            other,
            attributes(
                &Method::GET,
                &format!("{BASE}/namespaces/fleet-default/managedosversions/v1/changelog"),
                None
            )
        );
        let list = attributes(&Method::GET, &format!("{BASE}/managedosversions"), None);
        assert_eq!(list.with_name("v1"), None);
    }

    fn resource_of(
        method: Method,
        path: &str,
        query: Option<&str>,
    ) -> (String, ResourceAttributes) {
        let attributes = attributes(&method, path, query);
        let verb = attributes.verb().to_owned();
        match attributes.resource().cloned() {
            Some(resource) => (verb, resource),
            None => panic!("{path} is not a resource request"),
        }
    }

    fn expected(
        group: &str,
        resource: &str,
        namespace: Option<&str>,
        name: Option<&str>,
        subresource: Option<&str>,
    ) -> ResourceAttributes {
        ResourceAttributes {
            group: group.to_owned(),
            version: if group.is_empty() { "v1" } else { "v1beta1" }.to_owned(),
            resource: resource.to_owned(),
            subresource: subresource.map(str::to_owned),
            namespace: namespace.map(str::to_owned),
            name: name.map(str::to_owned),
        }
    }

    const GROUP: &str = "changelog.elemental.cattle.io";

    #[test]
    fn a_named_object_is_get() {
        let (verb, attrs) = resource_of(
            Method::GET,
            &format!("{BASE}/namespaces/ns/managedosversions/v1"),
            None,
        );
        assert_eq!(verb, "get");
        assert_eq!(
            attrs,
            expected(GROUP, "managedosversions", Some("ns"), Some("v1"), None)
        );
    }

    #[test]
    fn a_collection_is_list_or_watch() {
        let path = format!("{BASE}/namespaces/ns/managedosversions");
        let (verb, attrs) = resource_of(Method::GET, &path, None);
        assert_eq!(verb, "list");
        assert_eq!(
            attrs,
            expected(GROUP, "managedosversions", Some("ns"), None, None)
        );
        for (query, verb) in [
            ("watch=true", "watch"),
            ("watch=1", "watch"),
            ("watch=", "watch"),
            ("watch=0", "list"),
            ("watch=F", "watch"),
            ("watch=f", "watch"),
            ("watch=False", "list"),
            ("watch=FALSE", "list"),
            ("watch=false&watch=true", "list"),
            ("labelSelector=a%3Db&watch=true", "watch"),
        ] {
            assert_eq!(
                resource_of(Method::GET, &path, Some(query)).0,
                verb,
                "{query}"
            );
        }
        assert_eq!(resource_of(Method::HEAD, &path, None).0, "list");
    }

    #[test]
    fn a_cluster_wide_list_has_no_namespace() {
        let (verb, attrs) = resource_of(Method::GET, &format!("{BASE}/managedosversions"), None);
        assert_eq!(verb, "list");
        assert_eq!(
            attrs,
            expected(GROUP, "managedosversions", None, None, None)
        );
    }

    #[test]
    fn a_subresource_is_named() {
        let path = format!("{BASE}/namespaces/fleet-default/managedosversions/v1.2.3/changelog");
        let (verb, attrs) = resource_of(Method::GET, &path, Some("from=v1.2.2&format=text"));
        assert_eq!(verb, "get");
        assert_eq!(
            attrs,
            expected(
                GROUP,
                "managedosversions",
                Some("fleet-default"),
                Some("v1.2.3"),
                Some("changelog")
            )
        );
        let (_, attrs) = resource_of(Method::GET, &format!("{path}/extra/segments"), None);
        assert_eq!(attrs.subresource.as_deref(), Some("changelog"));
    }

    #[test]
    fn writes_map_to_their_verbs() {
        let named = format!("{BASE}/namespaces/ns/managedosversions/v1");
        let collection = format!("{BASE}/namespaces/ns/managedosversions");
        assert_eq!(resource_of(Method::POST, &collection, None).0, "create");
        assert_eq!(resource_of(Method::PUT, &named, None).0, "update");
        assert_eq!(resource_of(Method::PATCH, &named, None).0, "patch");
        assert_eq!(resource_of(Method::DELETE, &named, None).0, "delete");
        assert_eq!(
            resource_of(Method::DELETE, &collection, None).0,
            "deletecollection"
        );
        assert_eq!(resource_of(Method::OPTIONS, &named, None).0, "");
    }

    #[test]
    fn special_verbs_come_from_the_path() {
        let (verb, attrs) = resource_of(
            Method::GET,
            &format!("{BASE}/watch/namespaces/ns/managedosversions/v1"),
            None,
        );
        assert_eq!(verb, "watch");
        assert_eq!(
            attrs,
            expected(GROUP, "managedosversions", Some("ns"), Some("v1"), None)
        );
        let (verb, attrs) = resource_of(
            Method::GET,
            &format!("{BASE}/proxy/namespaces/ns/things/a/b/c"),
            None,
        );
        assert_eq!(verb, "proxy");
        assert_eq!(
            attrs,
            expected(GROUP, "things", Some("ns"), Some("a"), None)
        );
        let (verb, attrs) = resource_of(Method::GET, &format!("{BASE}/watch"), None);
        assert_eq!(verb, "watch");
        assert_eq!(attrs.resource, "");
    }

    #[test]
    fn namespaces_themselves() {
        let (verb, attrs) = resource_of(Method::GET, "/api/v1/namespaces/ns", None);
        assert_eq!(verb, "get");
        assert_eq!(
            attrs,
            expected("", "namespaces", Some("ns"), Some("ns"), None)
        );
        let (_, attrs) = resource_of(Method::PUT, "/api/v1/namespaces/ns/finalize", None);
        assert_eq!(
            attrs,
            expected("", "namespaces", Some("ns"), Some("ns"), Some("finalize"))
        );
        let (verb, attrs) = resource_of(Method::GET, "/api/v1/namespaces", None);
        assert_eq!(verb, "list");
        assert_eq!(attrs, expected("", "namespaces", None, None, None));
    }

    #[test]
    fn a_field_selector_on_the_name_names_the_object() {
        let path = format!("{BASE}/namespaces/ns/managedosversions");
        let named = |query: &str| resource_of(Method::GET, &path, Some(query)).1.name;
        assert_eq!(
            named("fieldSelector=metadata.name%3Dv1").as_deref(),
            Some("v1")
        );
        assert_eq!(
            named("fieldSelector=metadata.name==v1").as_deref(),
            Some("v1")
        );
        assert_eq!(named("fieldSelector=metadata.name!=v1"), None);
        assert_eq!(named("fieldSelector=metadata.namespace=ns"), None);
        assert_eq!(
            named("fieldSelector=a=b,metadata.name=v2").as_deref(),
            Some("v2")
        );
        assert_eq!(
            named("fieldSelector=metadata.name=a%2Fb"),
            None,
            "not a valid path segment"
        );
        assert_eq!(named("fieldSelector=metadata.name=.."), None);
        assert_eq!(
            named("fieldSelector=metadata.name=x\\,y").as_deref(),
            Some("x,y")
        );
        assert_eq!(
            named("fieldSelector=metadata.name=x,bad"),
            None,
            "an invalid term voids the selector"
        );
        // Invalid selector: Go falls back to a lenient read of `watch` ("f" is true there).
        let (verb, attrs) = resource_of(Method::GET, &path, Some("fieldSelector=nonsense&watch=f"));
        assert_eq!((verb.as_str(), attrs.name), ("watch", None));
        // Any list option that does not decode voids the name, as in Go.
        for void in ["labelSelector=a+in+b", "limit=x", "timeoutSeconds=1.5"] {
            let query = format!("fieldSelector=metadata.name%3Dv1&{void}");
            assert_eq!(named(&query), None, "{void}");
        }
        // Repeated: the first value counts.
        assert_eq!(
            named("fieldSelector=metadata.name%3Da&fieldSelector=").as_deref(),
            Some("a")
        );
        assert_eq!(
            named("fieldSelector=&fieldSelector=metadata.name%3Da"),
            None
        );
    }

    #[test]
    fn other_paths_are_non_resource() {
        for (path, verb) in [
            ("/", "get"),
            ("/apis", "get"),
            ("/apis/changelog.elemental.cattle.io", "get"),
            (BASE, "get"),
            ("/api/v1", "get"),
            ("/metrics", "get"),
            (
                "/openapi/v3/apis/changelog.elemental.cattle.io/v1beta1",
                "get",
            ),
            ("/healthz/ping", "post"),
        ] {
            let method = Method::from_bytes(verb.to_uppercase().as_bytes()).unwrap_or(Method::GET);
            let attributes = attributes(&method, path, None);
            assert_eq!(attributes.resource(), None, "{path}");
            assert_eq!((attributes.verb(), attributes.path()), (verb, path));
        }
    }

    #[test]
    fn the_path_is_percent_decoded_before_splitting() {
        let attributes = attributes(&Method::GET, "/apis/g/v1/namespaces/a%2Fb/things", None);
        assert_eq!(attributes.path(), "/apis/g/v1/namespaces/a/b/things");
        let resource = attributes
            .resource()
            .cloned()
            .unwrap_or_else(|| panic!("resource"));
        assert_eq!(
            (resource.namespace.as_deref(), resource.resource.as_str()),
            (Some("a"), "b")
        );
    }

    proptest! {
        #[test]
        fn never_panics(method in "[A-Z]{1,8}", path in "(/[a-z%2F.]{0,8}){0,8}/?", query in "[a-z=&%+;,.!\\\\]{0,30}") {
            let method = Method::from_bytes(method.as_bytes()).unwrap_or(Method::GET);
            let Ok(path) = super::super::decode_path(&path) else { return Ok(()) };
            let attributes = of(&method, path, &QueryValues::parse(&query));
            if let Some(resource) = attributes.resource() {
                prop_assert!(resource.name.as_deref() != Some(""));
                prop_assert!(resource.namespace.as_deref() != Some(""));
            }
        }

        #[test]
        fn named_and_collection_requests(ns in "[a-z0-9-]{1,20}", name in "[a-z0-9.-]{1,20}") {
            prop_assume!(name != "." && name != "..");
            let collection = format!("{BASE}/namespaces/{ns}/managedosversions");
            let (verb, attrs) = resource_of(Method::GET, &collection, None);
            prop_assert_eq!(verb, "list");
            prop_assert_eq!(attrs, expected(GROUP, "managedosversions", Some(&ns), None, None));
            let (verb, attrs) = resource_of(Method::GET, &format!("{collection}/{name}/changelog"), None);
            prop_assert_eq!(verb, "get");
            prop_assert_eq!(attrs, expected(GROUP, "managedosversions", Some(&ns), Some(&name), Some("changelog")));
        }
    }
}
