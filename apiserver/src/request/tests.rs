//! The request model: which target each path is, parameters resolved as kube-apiserver
//! resolves them, and the property that matters most: what authorization reviews is
//! exactly what the answer is about.

use proptest::prelude::*;

use super::*;

const BASE: &str = "/apis/changelog.elemental.cattle.io/v1beta1";

fn parse(uri: &str) -> RequestInfo {
    parse_with(&Method::GET, uri)
}

fn parse_with(method: &Method, uri: &str) -> RequestInfo {
    let uri: Uri = uri.parse().unwrap_or_else(|e| panic!("{uri}: {e}"));
    RequestInfo::parse(method, &uri).unwrap_or_else(|e| panic!("{uri}: {e}"))
}

fn list_params(info: &RequestInfo) -> &ListParams {
    match info.target() {
        Target::Resource(Resource::List { params, .. }) => params,
        other => panic!("not a list: {other:?}"),
    }
}

fn invalid(info: &RequestInfo) -> &StatusError {
    match info.target() {
        Target::Invalid { error, .. } => error,
        other => panic!("not invalid: {other:?}"),
    }
}

#[test]
fn paths_that_are_not_ours_or_not_resources() {
    for path in [
        "/",
        "//apis/x",
        "/api",
        "/api/v1/namespaces",
        "/apis/changelog.elemental.cattle.io/v1",
        "/apis/changelog.elemental.cattle.io/v1beta2/managedosversions",
        "/apis/elemental.cattle.io/v1beta1/namespaces/fleet-default/managedosversions",
        &format!("{BASE}/namespaces"),
        &format!("{BASE}/namespaces/fleet-default"),
        &format!("{BASE}/managedosversionchannels"),
        &format!("{BASE}/managedosversions/v1"),
        &format!("{BASE}/managedosversions/v1/changelog"),
        &format!("{BASE}/namespaces/fleet-default/managedosversions/v1/changelog/extra"),
        &format!("{BASE}/namespaces/fleet-default/managedosversions//changelog"),
        &format!("{BASE}/namespaces//managedosversions"),
        &format!("{BASE}/namespaces/fleet-default/pods/v1"),
        &format!("{BASE}/namespaces/fleet-default/managedosversions/v1/status"),
        "/openapi",
        "/openapi/v3/apis/elemental.cattle.io/v1beta1",
        "/metrics/extra",
        "/livezz",
    ] {
        let info = parse(path);
        assert_eq!(info.target(), &Target::NotFound, "{path}");
        assert_eq!(info.metric(), RequestResource::Other, "{path}");
        assert!(!info.is_public_document());
    }
}

/// A health probe's target.
fn health(probe: Probe, verbose: bool) -> Target {
    Target::Health { probe, verbose }
}

#[test]
fn paths_we_serve() {
    let changelog = Target::Resource(Resource::Changelog {
        namespace: "fleet-default".into(),
        name: "base-v2.2.0-3.12-os".into(),
        params: ChangelogParams::default(),
    });
    let cases = [
        ("/apis", Target::Discovery(Discovery::Apis)),
        ("/apis/", Target::Discovery(Discovery::Apis)),
        (
            "/apis/changelog.elemental.cattle.io/",
            Target::Discovery(Discovery::Group),
        ),
        (BASE, Target::Discovery(Discovery::ResourceList)),
        (
            &format!("{BASE}/managedosversions"),
            Target::Resource(Resource::List {
                namespace: None,
                params: ListParams::default(),
            }),
        ),
        (
            &format!("{BASE}/namespaces/fleet-default/managedosversions/"),
            Target::Resource(Resource::List {
                namespace: Some("fleet-default".into()),
                params: ListParams::default(),
            }),
        ),
        (
            &format!("{BASE}/namespaces/fleet-default/managedosversions/v1"),
            Target::Resource(Resource::Get {
                namespace: "fleet-default".into(),
                name: "v1".into(),
                params: GetParams::default(),
            }),
        ),
        (
            &format!(
                "{BASE}/namespaces/fleet-default/managedosversions/base-v2.2.0-3.12-os/changelog/"
            ),
            changelog.clone(),
        ),
        (
            // Encoded once, decoded once: the same object for authorization and answer.
            &format!(
                "{BASE}/namespaces/fleet-default/managedosversions/base-v2.2.0-3.12-%6Fs/changelog"
            ),
            changelog,
        ),
        ("/openapi/v2", Target::OpenApi(OpenApi::V2)),
        ("/openapi/v3", Target::OpenApi(OpenApi::V3Root)),
        (
            "/openapi/v3/apis/changelog.elemental.cattle.io/v1beta1",
            Target::OpenApi(OpenApi::V3GroupVersion),
        ),
        ("/healthz", health(Probe::Live, false)),
        ("/livez/ping?verbose", health(Probe::Live, true)),
        ("/readyz/informer-sync", health(Probe::Ready, false)),
        ("/metrics", Target::Metrics),
    ];
    for (path, target) in cases {
        assert_eq!(parse(path).target(), &target, "{path}");
    }
    paths_we_serve_are_labelled();
}

/// Of [`paths_we_serve`]: the resource label of the request metric.
fn paths_we_serve_are_labelled() {
    assert_eq!(
        parse(&format!("{BASE}/managedosversions")).metric(),
        RequestResource::Summaries
    );
    assert_eq!(
        parse(&format!(
            "{BASE}/namespaces/a/managedosversions/b/changelog"
        ))
        .metric(),
        RequestResource::Changelog
    );
    assert_eq!(parse(BASE).metric(), RequestResource::Discovery);
    assert!(parse(BASE).is_public_document());
    assert_eq!(parse("/openapi/v2").metric(), RequestResource::OpenApi);
    assert_eq!(parse("/readyz").metric(), RequestResource::Health);
}

#[test]
fn parameters_are_typed() {
    let info = parse(&format!(
        "{BASE}/namespaces/ns/managedosversions/v2/changelog?from=v1&arch=arm64&format=md"
    ));
    assert_eq!(
        info.target(),
        &Target::Resource(Resource::Changelog {
            namespace: "ns".into(),
            name: "v2".into(),
            params: ChangelogParams {
                from: Some("v1".into()),
                arch: Some(Arch::aarch64()),
                format: Format::Markdown,
            },
        })
    );
    let info = parse(&format!(
        "{BASE}/managedosversions?cve=cve-2024-0001&labelSelector=a%3Db&includeObject=None&limit=500"
    ));
    let params = list_params(&info);
    assert_eq!(params.cve.as_deref(), Some("CVE-2024-0001"));
    assert_eq!(params.labels, LabelSelector::parse("a=b").unwrap());
    assert_eq!(params.include_object, IncludeObject::None);
    // Empty values mean "not set".
    let info = parse(&format!(
        "{BASE}/namespaces/ns/managedosversions/v2/changelog?from=&arch=&format="
    ));
    assert_eq!(
        info.target(),
        &Target::Resource(Resource::Changelog {
            namespace: "ns".into(),
            name: "v2".into(),
            params: ChangelogParams::default(),
        })
    );
}

#[test]
fn repeated_parameters_count_with_their_first_value() {
    let info = parse(&format!(
        "{BASE}/namespaces/ns/managedosversions/v2/changelog?from=v1&from=v0&format=text&format=yaml"
    ));
    match info.target() {
        Target::Resource(Resource::Changelog { params, .. }) => {
            assert_eq!(params.from.as_deref(), Some("v1"));
            assert_eq!(params.format, Format::Text);
        }
        other => panic!("{other:?}"),
    }
    // The hole this model closes: authorization and answer read the same selector.
    for (query, name) in [
        ("fieldSelector=metadata.name%3Da&fieldSelector=", Some("a")),
        (
            "fieldSelector=metadata.name%3Da&fieldSelector=metadata.name%3Db",
            Some("a"),
        ),
        ("fieldSelector=&fieldSelector=metadata.name%3Da", None),
    ] {
        let info = parse(&format!("{BASE}/namespaces/ns/managedosversions?{query}"));
        let authorized = info.attributes().resource().and_then(|r| r.name.clone());
        assert_eq!(authorized.as_deref(), name, "{query}");
        let fields = &list_params(&info).fields;
        assert_eq!(fields.exact_name(), name, "{query}");
        if let Some(name) = name {
            assert!(fields.matches(name, "ns"));
            assert!(!fields.matches("b", "ns"), "{query}");
        }
    }
}

#[test]
fn invalid_input_is_a_400_at_parse_time() {
    for (query, field) in [
        ("format=yaml", "format"),
        ("arch=x86%2F64", "arch"),
        ("from=Not_A_Name", "from"),
        ("from=a%2Fb", "from"),
    ] {
        let info = parse(&format!(
            "{BASE}/namespaces/ns/managedosversions/v2/changelog?{query}"
        ));
        let error = invalid(&info);
        assert_eq!(error.code(), 400, "{query}");
        assert!(
            error.message.starts_with(field),
            "{query}: {}",
            error.message
        );
        assert_eq!(info.metric(), RequestResource::Changelog);
    }
    for query in [
        "cve=GHSA-1",
        "labelSelector=a+in+b",
        "fieldSelector=nonsense",
        "includeObject=All",
        "limit=ten",
        &format!("labelSelector={}", "a".repeat(MAX_SELECTOR_BYTES + 1)),
    ] {
        let info = parse(&format!("{BASE}/managedosversions?{query}"));
        assert_eq!(invalid(&info).code(), 400, "{query}");
        assert_eq!(info.metric(), RequestResource::Summaries);
    }
    for path in [
        "namespaces/Fleet/managedosversions",
        "namespaces/ns/managedosversions/UPPER",
        "namespaces/ns/managedosversions/a%20b/changelog",
        &format!("namespaces/ns/managedosversions/{}", "a".repeat(254)),
    ] {
        assert_eq!(
            invalid(&parse(&format!("{BASE}/{path}"))).code(),
            400,
            "{path}"
        );
    }
    // Refused before anything else, as Go's HTTP server refuses them.
    let uri: Uri = format!(
        "{BASE}/managedosversions?{}",
        "a=b&".repeat(MAX_QUERY_BYTES)
    )
    .parse()
    .unwrap();
    assert_eq!(
        RequestInfo::parse(&Method::GET, &uri).unwrap_err().code(),
        400
    );
    let uri: Uri = format!("{BASE}/namespaces/ns/managedosversions/%ff")
        .parse()
        .unwrap();
    assert_eq!(
        RequestInfo::parse(&Method::GET, &uri).unwrap_err().code(),
        400
    );
}

#[test]
fn a_second_version_read_is_authorized_as_its_changelog() {
    let ns = format!("{BASE}/namespaces/fleet-default");
    let changelog_of = |name: &str| {
        parse(&format!("{ns}/managedosversions/{name}/changelog"))
            .attributes()
            .clone()
    };
    let from = parse(&format!("{ns}/managedosversions/v2/changelog?from=v1"));
    assert_eq!(from.also_reads(), Some(changelog_of("v1")));
    let to = parse(&format!(
        "{ns}/machineinventories/m1/changelog?to=v3&format=text"
    ));
    assert_eq!(to.also_reads(), Some(changelog_of("v3")));
    // The machine's own target is the operator's choice, not a parameter: nothing more.
    for one in [
        format!("{ns}/machineinventories/m1/changelog"),
        format!("{ns}/managedosversions/v2/changelog"),
        format!("{ns}/machineinventories/m1?to=v3"),
        format!("{ns}/managedosimages/plan/changelog?to=v3"),
    ] {
        assert_eq!(parse(&one).also_reads(), None, "{one}");
    }
}

#[test]
fn dns_names() {
    assert!(is_dns1123_subdomain("base-v2.2.0-3.12-os"));
    assert!(is_dns1123_label("fleet-default"));
    for bad in ["", "-a", "a-", "A", "a_b", "a..b", ".a"] {
        assert!(!is_dns1123_subdomain(bad), "{bad}");
    }
    assert!(!is_dns1123_label("a.b"));
    assert!(!is_dns1123_label(&"a".repeat(64)));
}

/// Pieces of query strings: repeated, empty and encoded parameters of every kind a client
/// might send.
fn query_piece() -> impl Strategy<Value = String> {
    let name = "[a-c]{1,2}";
    prop_oneof![
        name.prop_map(|n| format!("fieldSelector=metadata.name%3D{n}")),
        name.prop_map(|n| format!("fieldSelector=metadata.name%3D%3D{n}")),
        name.prop_map(|n| format!("fieldSelector=metadata.name!%3D{n}")),
        name.prop_map(|n| format!("fieldSelector=metadata.namespace%3Dns,metadata.name%3D{n}")),
        Just("fieldSelector=".to_owned()),
        Just("fieldSelector=nonsense".to_owned()),
        Just("labelSelector=a%3Db".to_owned()),
        Just("labelSelector=a+in+b".to_owned()),
        Just("watch=true".to_owned()),
        Just("watch=false".to_owned()),
        Just("limit=5".to_owned()),
        Just("limit=x".to_owned()),
        name.prop_map(|n| format!("from={n}")),
        Just("from=".to_owned()),
        Just("arch=arm64".to_owned()),
        Just("format=text".to_owned()),
        Just("cve=CVE-2024-1".to_owned()),
        Just("x;y=1".to_owned()),
        Just("%zz=1".to_owned()),
    ]
}

fn path_shape() -> impl Strategy<Value = (String, Option<String>, Option<String>)> {
    let ns = prop_oneof![Just("ns"), Just("n%73"), Just("other")];
    let name = prop_oneof![Just("a"), Just("b"), Just("%61"), Just("v%31")];
    (ns, name, 0..4_u8).prop_map(|(ns, name, shape)| {
        let decoded = |s: &str| String::from_utf8(query::unescape(s, false).unwrap()).unwrap();
        match shape {
            0 => (format!("{BASE}/managedosversions"), None, None),
            1 => (
                format!("{BASE}/namespaces/{ns}/managedosversions"),
                Some(decoded(ns)),
                None,
            ),
            2 => (
                format!("{BASE}/namespaces/{ns}/managedosversions/{name}"),
                Some(decoded(ns)),
                Some(decoded(name)),
            ),
            _ => (
                format!("{BASE}/namespaces/{ns}/managedosversions/{name}/changelog/"),
                Some(decoded(ns)),
                Some(decoded(name)),
            ),
        }
    })
}

proptest! {
    /// Whatever the parameters, the answer is about what was authorized: the namespace and
    /// name of a get or changelog are those reviewed, and a list reviewed for one name can
    /// only select that name.
    #[test]
    fn what_is_authorized_is_what_is_answered(
        (path, namespace, name) in path_shape(),
        pieces in proptest::collection::vec(query_piece(), 0..6),
        candidates in proptest::collection::vec("[a-c]{1,2}", 1..6),
    ) {
        let info = parse(&format!("{path}?{}", pieces.join("&")));
        let reviewed = info.attributes().resource().cloned().unwrap();
        prop_assert_eq!(&reviewed.namespace, &namespace);
        match info.target() {
            Target::Resource(Resource::Get { namespace: ns, name: n, .. })
            | Target::Resource(Resource::Changelog { namespace: ns, name: n, .. }) => {
                prop_assert_eq!(Some(ns), reviewed.namespace.as_ref());
                prop_assert_eq!(Some(n), reviewed.name.as_ref());
                prop_assert_eq!(Some(n), name.as_ref());
            }
            Target::Resource(Resource::List { namespace: ns, params }) => {
                prop_assert_eq!(ns, &reviewed.namespace);
                prop_assert!(name.is_none());
                if let Some(allowed) = &reviewed.name {
                    for candidate in &candidates {
                        if params.fields.matches(candidate, ns.as_deref().unwrap_or("ns")) {
                            prop_assert_eq!(candidate, allowed);
                        }
                    }
                }
            }
            Target::Invalid { error, .. } => prop_assert_eq!(error.code(), 400),
            other => prop_assert!(false, "unexpected target {:?}", other),
        }
    }

    #[test]
    fn parsing_never_panics(path in "(/[a-zA-Z0-9%.]{0,12}){0,8}/?", query in "[a-zA-Z=&%+;,.!\\\\0-9]{0,60}") {
        if let Ok(uri) = format!("{path}?{query}").parse::<Uri>() {
            let _ = RequestInfo::parse(&Method::GET, &uri);
        }
    }
}

/// `timeoutSeconds` of a watch is any 64-bit integer, as kube-apiserver decodes it
/// (`strconv.ParseInt`): negative and huge values are options, not errors (what they do is
/// `routes::watch`'s); what is no such integer is a 400 naming the parameter.
#[test]
fn watch_timeout_seconds_is_any_64_bit_integer() {
    let timeout = |value: &str| {
        let info = parse(&format!(
            "{BASE}/managedosversions?watch=true&timeoutSeconds={value}"
        ));
        list_params(&info)
            .watch
            .as_ref()
            .unwrap_or_else(|| panic!("{value}: not a watch"))
            .timeout_seconds
    };
    for (value, seconds) in [
        ("1", Some(1)),
        ("0", Some(0)),
        ("-1", Some(-1)),
        ("9223372036854775807", Some(i64::MAX)),
        ("-9223372036854775808", Some(i64::MIN)),
        ("", None),
    ] {
        assert_eq!(timeout(value), seconds, "{value}");
    }
    for value in ["9223372036854775808", "1.5", "1e3", "x", "%2B"] {
        let info = parse(&format!(
            "{BASE}/managedosversions?watch=true&timeoutSeconds={value}"
        ));
        let error = invalid(&info);
        assert_eq!(error.code(), 400, "{value}");
        assert!(
            error.message.starts_with("timeoutSeconds: Invalid value: ")
                && error.message.ends_with("must be an integer"),
            "{value}: {}",
            error.message
        );
    }
}
