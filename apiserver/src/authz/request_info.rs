//! What a request asks for, in authorization terms: k8s.io/apiserver's
//! `pkg/endpoints/request/requestinfo.go` (`RequestInfoFactory.NewRequestInfo`) with the API
//! prefixes `api` (groupless) and `apis`.

use std::borrow::Cow;

use http::Method;

use super::{Attributes, ResourceAttributes};

/// URL forms `/{prefix}/{group}/{version}/{verb}/...` that put the verb in the path.
const SPECIAL_VERBS: [&str; 2] = ["proxy", "watch"];
/// Subresources of a namespace, which make `/namespaces/{ns}/{sub}` a request on the namespace.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

/// The attributes of a request from its method, its path (as sent, percent-encoded) and its
/// query string.
///
/// `/api/{version}/...` and `/apis/{group}/{version}/...` with at least one segment after the
/// version are resource requests: the verb comes from the method (`get` becomes `list`, or
/// `watch` with `watch=true`, without a name; `delete` without a name becomes
/// `deletecollection`; a method with no verb gives an empty one), or from a `watch`/`proxy`
/// segment after the version; `namespaces/{ns}/` scopes the request; then come resource, name
/// and subresource. A list with `fieldSelector=metadata.name=<name>` names that object.
/// Everything else (discovery, `/metrics`, `/openapi/v2`, ...) is a non-resource request whose
/// verb is the lower-case method.
///
/// As Go's `url.URL.Path`, the path is percent-decoded before it is split.
pub fn attributes(method: &Method, path: &str, query: Option<&str>) -> Attributes {
    let path = percent_encoding::percent_decode_str(path)
        .decode_utf8_lossy()
        .into_owned();
    let method_verb = method.as_str().to_ascii_lowercase();
    match resource(method, &path, query.unwrap_or_default()) {
        Some((verb, resource)) => Attributes {
            path,
            verb: verb.into_owned(),
            resource: Some(resource),
        },
        None => Attributes {
            path,
            verb: method_verb,
            resource: None,
        },
    }
}

/// The verb and resource attributes of a resource request; `None` for a non-resource request.
fn resource<'a>(
    method: &Method,
    path: &'a str,
    query: &str,
) -> Option<(Cow<'static, str>, ResourceAttributes)> {
    let trimmed = path.trim_matches('/');
    let parts: Vec<&'a str> = if trimmed.is_empty() {
        Vec::new()
    } else {
        trimmed.split('/').collect()
    };
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
        let list = ListQuery::parse(query);
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

/// The list options that matter for authorization.
#[derive(Debug, Default, PartialEq, Eq)]
struct ListQuery {
    watch: bool,
    /// From `fieldSelector=metadata.name=<name>`, when a valid path segment.
    name: Option<String>,
}

impl ListQuery {
    fn parse(query: &str) -> Self {
        let pairs = query_pairs(query);
        let first = |key: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        match first("fieldSelector").map_or(Ok(None), exact_name) {
            Ok(name) => Self {
                // metav1's bool conversion: "0", "f", "false" (any case) are false.
                watch: first("watch").is_some_and(|watch| {
                    !(watch == "0"
                        || watch.eq_ignore_ascii_case("f")
                        || watch.eq_ignore_ascii_case("false"))
                }),
                name: name.filter(|name| valid_path_segment(name)),
            },
            // An undecodable query: requestinfo.go keeps only `watch`, read leniently.
            Err(InvalidSelector) => Self {
                watch: first("watch").is_some_and(|watch| {
                    let watch = watch.to_ascii_lowercase();
                    watch != "false" && watch != "0"
                }),
                name: None,
            },
        }
    }
}

/// Go's `url.ParseQuery`: `&`-separated `key=value` pairs, form-unescaped; pairs holding `;` or
/// a malformed escape are skipped.
fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty() && !pair.contains(';'))
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = unescape(key, true)?;
            let value = unescape(value, true)?;
            Some((
                String::from_utf8_lossy(&key).into_owned(),
                String::from_utf8_lossy(&value).into_owned(),
            ))
        })
        .collect()
}

/// Go's `url.PathUnescape` (`plus_is_space` false) or `url.QueryUnescape` (true): `%XX`
/// decoded; `None` when a `%` is not followed by two hex digits.
pub(crate) fn unescape(text: &str, plus_is_space: bool) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&byte) = bytes.get(i) {
        match byte {
            b'%' => {
                let high = hex(*bytes.get(i + 1)?)?;
                let low = hex(*bytes.get(i + 2)?)?;
                out.push(high << 4 | low);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(byte);
                i += 1;
            }
        }
    }
    Some(out)
}

fn hex(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|value| u8::try_from(value).ok())
}

/// A field selector that does not parse.
#[derive(Debug, PartialEq, Eq)]
struct InvalidSelector;

/// The value a field selector requires `metadata.name` to equal (`fields.ParseSelector`, then
/// `RequiresExactMatch`): terms split on unescaped commas and sorted, the first `=`/`==` term
/// on `metadata.name` wins; any malformed term invalidates the selector.
fn exact_name(selector: &str) -> Result<Option<String>, InvalidSelector> {
    let mut terms = split_terms(selector);
    terms.sort_unstable();
    let mut name = None;
    for term in terms.into_iter().filter(|term| !term.is_empty()) {
        let (field, operator, value) = split_term(term).ok_or(InvalidSelector)?;
        let value = unescape_value(value)?;
        if field == "metadata.name" && operator != "!=" && name.is_none() {
            name = Some(value);
        }
    }
    Ok(name)
}

/// Go's `fields.splitTerms`: splits on commas not escaped by a backslash.
fn split_terms(selector: &str) -> Vec<&str> {
    if selector.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in selector.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            ',' => {
                terms.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    terms
}

/// Go's `fields.splitTerm`: the first operator (`!=`, `==`, `=`, tried in that order at each
/// position) splits the term.
fn split_term(term: &str) -> Option<(&str, &'static str, &str)> {
    (0..term.len()).find_map(|i| {
        let rest = term.get(i..)?;
        ["!=", "==", "="]
            .into_iter()
            .find(|operator| rest.starts_with(operator))
            .map(|operator| (&term[..i], operator, &rest[operator.len()..]))
    })
}

/// Go's `fields.UnescapeValue`: `\\`, `\,` and `\=` are escapes; a lone `,` or `=` or any
/// other escape is an error.
fn unescape_value(value: &str) -> Result<String, InvalidSelector> {
    let mut out = String::with_capacity(value.len());
    let mut escaped = false;
    for c in value.chars() {
        match c {
            '\\' | ',' | '=' if escaped => {
                out.push(c);
                escaped = false;
            }
            _ if escaped => return Err(InvalidSelector),
            '\\' => escaped = true,
            ',' | '=' => return Err(InvalidSelector),
            _ => out.push(c),
        }
    }
    if escaped {
        Err(InvalidSelector)
    } else {
        Ok(out)
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

    fn resource_of(
        method: Method,
        path: &str,
        query: Option<&str>,
    ) -> (String, ResourceAttributes) {
        let attributes = attributes(&method, path, query);
        let verb = attributes.verb().to_owned();
        match attributes.resource {
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
            ("watch=F", "list"),
            ("watch=False", "list"),
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

    #[test]
    fn query_unescaping_follows_go() {
        assert_eq!(unescape("a+b%20c", true).as_deref(), Some(&b"a b c"[..]));
        assert_eq!(unescape("a+b", false).as_deref(), Some(&b"a+b"[..]));
        assert_eq!(unescape("%zz", true), None);
        assert_eq!(unescape("%4", true), None);
        assert_eq!(
            query_pairs("a=1&&b&c=%zz&d;e=2&f=x=y"),
            [
                ("a".to_owned(), "1".to_owned()),
                ("b".to_owned(), String::new()),
                ("f".to_owned(), "x=y".to_owned())
            ]
        );
    }

    proptest! {
        #[test]
        fn never_panics(method in "[A-Z]{1,8}", path in "(/[a-z%2F.]{0,8}){0,8}/?", query in "[a-z=&%+;,.!\\\\]{0,30}") {
            let method = Method::from_bytes(method.as_bytes()).unwrap_or(Method::GET);
            let attributes = attributes(&method, &path, Some(&query));
            if let Some(resource) = attributes.resource() {
                prop_assert!(resource.name.as_deref() != Some(""));
                prop_assert!(resource.namespace.as_deref() != Some(""));
            }
        }

        #[test]
        fn field_selector_values_round_trip(name in "[a-z0-9.,=\\\\-]{1,20}", other in "[a-z]{1,5}") {
            let escaped = name.replace('\\', "\\\\").replace(',', "\\,").replace('=', "\\=");
            let selector = format!("{other}=x,metadata.name={escaped}");
            prop_assert_eq!(exact_name(&selector), Ok(Some(name)));
        }

        #[test]
        fn field_selectors_never_panic(selector in "[a-z.=!,\\\\]{0,30}") {
            let _ = exact_name(&selector);
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
