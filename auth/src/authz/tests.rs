//! Authorization scenarios against a scripted kube API (every SubjectAccessReview checked),
//! time paused.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use http::StatusCode;
use serde_json::{Value, json};

use super::*;
use crate::{ResourceAttributes, review::mock};

const REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
const BASE: &str = "/apis/changelog.elemental.cattle.io/v1beta1";

/// The flags' defaults, as an empty command line gives them (the environment unread).
fn defaults() -> AuthzArgs {
    use clap::{Args as _, FromArgMatches as _};
    let command = AuthzArgs::augment_args(clap::Command::new("x")).mut_args(|arg| arg.env(None));
    AuthzArgs::from_arg_matches(&command.get_matches_from(["x"])).unwrap()
}

fn authorizer(args: &AuthzArgs) -> (Authorizer, mock::Handle) {
    let (client, handle) = mock::client();
    (
        Authorizer::new(client, args, Arc::new(crate::NoMetrics)),
        handle,
    )
}

fn alice() -> UserInfo {
    UserInfo {
        name: "alice".to_owned(),
        uid: Some("uid-1".to_owned()),
        groups: vec!["viewers".to_owned(), "system:authenticated".to_owned()],
        extra: BTreeMap::from([("scopes".to_owned(), vec!["a".to_owned(), "b".to_owned()])]),
    }
}

/// A non-resource GET of `path`.
fn non_resource(path: &str) -> Attributes {
    Attributes::non_resource_request(path.to_owned(), "get".into())
}

/// A request on a resource of this API, as the request model builds it.
fn resource(
    verb: &'static str,
    namespace: Option<&str>,
    name: Option<&str>,
    subresource: Option<&str>,
) -> Attributes {
    let mut path = BASE.to_owned();
    for part in [
        namespace.map(|ns| format!("namespaces/{ns}")),
        Some("managedosversions".to_owned()),
        name.map(str::to_owned),
        subresource.map(str::to_owned),
    ]
    .into_iter()
    .flatten()
    {
        path.push('/');
        path.push_str(&part);
    }
    Attributes::resource_request(
        path,
        verb.into(),
        ResourceAttributes {
            group: "changelog.elemental.cattle.io".to_owned(),
            version: "v1beta1".to_owned(),
            resource: "managedosversions".to_owned(),
            subresource: subresource.map(str::to_owned),
            namespace: namespace.map(str::to_owned),
            name: name.map(str::to_owned),
        },
    )
}

fn changelog() -> Attributes {
    resource(
        "get",
        Some("fleet-default"),
        Some("v1.2.3"),
        Some("changelog"),
    )
}

/// The review webhook.go sends for `alice` reading a changelog.
fn changelog_review() -> Value {
    json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "metadata": {},
        "spec": {
            "user": "alice",
            "uid": "uid-1",
            "groups": ["viewers", "system:authenticated"],
            "extra": {"scopes": ["a", "b"]},
            "resourceAttributes": {
                "namespace": "fleet-default",
                "verb": "get",
                "group": "changelog.elemental.cattle.io",
                "version": "v1beta1",
                "resource": "managedosversions",
                "subresource": "changelog",
                "name": "v1.2.3",
            },
        },
    })
}

fn answer(status: Value) -> Value {
    json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "metadata": {},
        "spec": {},
        "status": status,
    })
}

fn allowed() -> Value {
    answer(json!({"allowed": true, "reason": "RBAC: allowed by RoleBinding"}))
}

fn denied() -> Value {
    answer(json!({"allowed": false}))
}

#[tokio::test(start_paused = true)]
async fn resource_requests_are_reviewed_with_every_attribute() {
    let (authorizer, mut handle) = authorizer(&defaults());
    let (user, attributes) = (alice(), changelog());
    let (decision, ()) = tokio::join!(
        authorizer.authorize(&user, &attributes),
        mock::expect_post(
            &mut handle,
            REVIEWS,
            changelog_review(),
            StatusCode::CREATED,
            allowed()
        ),
    );
    assert_eq!(decision.unwrap(), Decision::Allow);
}

#[tokio::test(start_paused = true)]
async fn lists_are_reviewed_cluster_wide_without_name() {
    let (authorizer, mut handle) = authorizer(&defaults());
    let user = UserInfo {
        name: "bob".to_owned(),
        ..UserInfo::default()
    };
    let attributes = resource("list", None, None, None);
    let review = json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "metadata": {},
        "spec": {
            "user": "bob",
            "resourceAttributes": {
                "verb": "list",
                "group": "changelog.elemental.cattle.io",
                "version": "v1beta1",
                "resource": "managedosversions",
            },
        },
    });
    let (decision, ()) = tokio::join!(
        authorizer.authorize(&user, &attributes),
        mock::expect_post(&mut handle, REVIEWS, review, StatusCode::CREATED, denied()),
    );
    assert_eq!(
        decision.unwrap(),
        Decision::Deny {
            reason: String::new()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn other_paths_are_reviewed_as_non_resource_requests() {
    let (authorizer, mut handle) = authorizer(&defaults());
    let user = alice();
    let attributes = non_resource("/metrics");
    let mut review = changelog_review();
    review["spec"]
        .as_object_mut()
        .map(|spec| spec.remove("resourceAttributes"));
    review["spec"]["nonResourceAttributes"] = json!({"path": "/metrics", "verb": "get"});
    let (decision, ()) = tokio::join!(
        authorizer.authorize(&user, &attributes),
        mock::expect_post(&mut handle, REVIEWS, review, StatusCode::CREATED, denied()),
    );
    assert!(matches!(decision.unwrap(), Decision::Deny { .. }));
}

#[tokio::test]
async fn masters_and_always_allowed_paths_skip_the_review() {
    let args = AuthzArgs {
        always_allow_paths: "/healthz,/readyz,/livez,/debug/*".parse().unwrap(),
        ..defaults()
    };
    let (authorizer, mut handle) = authorizer(&args);
    let masters = UserInfo {
        name: "system:kube-aggregator".to_owned(),
        groups: vec!["system:masters".to_owned()],
        ..UserInfo::default()
    };
    assert_eq!(
        authorizer.authorize(&masters, &changelog()).await.unwrap(),
        Decision::Allow
    );
    let anonymous = UserInfo::anonymous();
    for path in [
        "/healthz",
        "/readyz",
        "/livez",
        "/debug/pprof/heap",
        "/debug/",
    ] {
        let attributes = non_resource(path);
        assert_eq!(
            authorizer.authorize(&anonymous, &attributes).await.unwrap(),
            Decision::Allow,
            "{path}"
        );
    }
    assert!(mock::idle(&mut handle));
}

#[tokio::test(start_paused = true)]
async fn paths_close_to_always_allowed_ones_are_reviewed() {
    let (authorizer, mut handle) = authorizer(&defaults());
    let anonymous = UserInfo::anonymous();
    for path in ["/healthz/etcd", "/livezz", "/apis/x/v1/healthz"] {
        let attributes = non_resource(path);
        let (decision, ()) = tokio::join!(authorizer.authorize(&anonymous, &attributes), async {
            let (_, respond) = handle.next_request().await.expect("a review");
            respond.send_response(http::Response::new(kube::client::Body::from(
                serde_json::to_vec(&denied()).unwrap(),
            )));
        });
        assert!(matches!(decision.unwrap(), Decision::Deny { .. }), "{path}");
    }
}

#[tokio::test(start_paused = true)]
async fn answers_are_cached_for_their_ttl() {
    let args = AuthzArgs {
        authorized_ttl: Duration::from_secs(5),
        unauthorized_ttl: Duration::from_secs(30),
        ..defaults()
    };
    let (authorizer, mut handle) = authorizer(&args);
    let (user, attributes) = (alice(), changelog());
    let review = || {
        let user = user.clone();
        let attributes = attributes.clone();
        let authorizer = &authorizer;
        async move { authorizer.authorize(&user, &attributes).await.unwrap() }
    };

    let (decision, ()) = tokio::join!(
        review(),
        mock::expect_post(
            &mut handle,
            REVIEWS,
            changelog_review(),
            StatusCode::CREATED,
            allowed()
        ),
    );
    assert_eq!(decision, Decision::Allow);
    tokio::time::advance(Duration::from_millis(4_999)).await;
    assert_eq!(review().await, Decision::Allow);
    assert!(mock::idle(&mut handle));

    // Allowed answers expire after 5 s; this one is a denial, kept 30 s.
    tokio::time::advance(Duration::from_millis(1)).await;
    let deny = answer(json!({"allowed": false, "reason": "no RoleBinding"}));
    let (decision, ()) = tokio::join!(
        review(),
        mock::expect_post(
            &mut handle,
            REVIEWS,
            changelog_review(),
            StatusCode::CREATED,
            deny.clone()
        ),
    );
    let expected = Decision::Deny {
        reason: "no RoleBinding".to_owned(),
    };
    assert_eq!(decision, expected);
    tokio::time::advance(Duration::from_millis(29_999)).await;
    assert_eq!(review().await, expected);
    assert!(mock::idle(&mut handle));
    tokio::time::advance(Duration::from_millis(1)).await;
    let (decision, ()) = tokio::join!(
        review(),
        mock::expect_post(
            &mut handle,
            REVIEWS,
            changelog_review(),
            StatusCode::CREATED,
            allowed()
        ),
    );
    assert_eq!(decision, Decision::Allow);
}

#[tokio::test(start_paused = true)]
async fn different_users_and_requests_are_reviewed_separately() {
    let (authorizer, mut handle) = authorizer(&defaults());
    let (user, attributes) = (alice(), changelog());
    let (decision, ()) = tokio::join!(
        authorizer.authorize(&user, &attributes),
        mock::expect_post(
            &mut handle,
            REVIEWS,
            changelog_review(),
            StatusCode::CREATED,
            allowed()
        ),
    );
    assert_eq!(decision.unwrap(), Decision::Allow);

    let mut other = alice();
    other.groups.pop();
    let mut review = changelog_review();
    review["spec"]["groups"] = json!(["viewers"]);
    let (decision, ()) = tokio::join!(
        authorizer.authorize(&other, &attributes),
        mock::expect_post(&mut handle, REVIEWS, review, StatusCode::CREATED, denied()),
    );
    assert!(matches!(decision.unwrap(), Decision::Deny { .. }));
}

#[tokio::test(start_paused = true)]
async fn concurrent_identical_reviews_are_coalesced() {
    let (authorizer, mut handle) = authorizer(&defaults());
    let (user, attributes) = (alice(), changelog());
    let (first, second, ()) = tokio::join!(
        authorizer.authorize(&user, &attributes),
        authorizer.authorize(&user, &attributes),
        mock::expect_post(
            &mut handle,
            REVIEWS,
            changelog_review(),
            StatusCode::CREATED,
            allowed()
        ),
    );
    assert_eq!(
        (first.unwrap(), second.unwrap()),
        (Decision::Allow, Decision::Allow)
    );
    assert!(mock::idle(&mut handle));
}

#[tokio::test(start_paused = true)]
async fn failed_reviews_are_errors_retried_with_backoff_and_never_cached() {
    let (authorizer, mut handle) = authorizer(&defaults());
    let (user, attributes) = (alice(), changelog());
    let start = tokio::time::Instant::now();
    let (decision, ()) = tokio::join!(authorizer.authorize(&user, &attributes), async {
        for _ in 0..5 {
            let status = mock::status(500, "InternalError");
            mock::expect_post(
                &mut handle,
                REVIEWS,
                changelog_review(),
                StatusCode::INTERNAL_SERVER_ERROR,
                status,
            )
            .await;
        }
    });
    assert!(
        matches!(decision, Err(AuthzError::Review(_))),
        "{decision:?}"
    );
    assert!(
        start.elapsed() >= Duration::from_millis(4_062),
        "backoff between attempts"
    );

    // The next request reviews again, and a broken connection is retried.
    let (decision, ()) = tokio::join!(authorizer.authorize(&user, &attributes), async {
        mock::fail_next(&mut handle).await;
        mock::expect_post(
            &mut handle,
            REVIEWS,
            changelog_review(),
            StatusCode::CREATED,
            allowed(),
        )
        .await;
    });
    assert_eq!(decision.unwrap(), Decision::Allow);
}

#[tokio::test(start_paused = true)]
async fn a_review_both_allowing_and_denying_is_an_error() {
    let (authorizer, mut handle) = authorizer(&defaults());
    let (user, attributes) = (alice(), changelog());
    let both = answer(json!({"allowed": true, "denied": true}));
    let (decision, ()) = tokio::join!(
        authorizer.authorize(&user, &attributes),
        mock::expect_post(
            &mut handle,
            REVIEWS,
            changelog_review(),
            StatusCode::CREATED,
            both
        ),
    );
    assert!(
        matches!(decision, Err(AuthzError::AllowedAndDenied)),
        "{decision:?}"
    );
}

#[test]
fn always_allow_paths_parse_like_kubernetes() {
    let paths: AlwaysAllowPaths = "/healthz,/debug/*,/".parse().unwrap();
    assert!(paths.matches("/healthz"));
    assert!(paths.matches("healthz"));
    assert!(!paths.matches("/healthz/"));
    assert!(paths.matches("/debug/"));
    assert!(paths.matches("/debug/x/y"));
    assert!(!paths.matches("/debug"));
    assert!(paths.matches("/"));
    assert_eq!(paths.to_string(), "/healthz,/debug/*,/");

    let none: AlwaysAllowPaths = "".parse().unwrap();
    assert!(!none.matches("/healthz") && !none.matches("/"));
    assert!("/a*b".parse::<AlwaysAllowPaths>().is_err());
    assert!("/ok,/**".parse::<AlwaysAllowPaths>().is_err());
    assert!(
        "*".parse::<AlwaysAllowPaths>()
            .unwrap()
            .matches("/anything")
    );
}

proptest::proptest! {
    #[test]
    fn always_allow_paths_never_panic(list in "[/a-z*,\u{e9}]{0,20}") {
        if let Ok(paths) = list.parse::<AlwaysAllowPaths>() {
            let reparsed: AlwaysAllowPaths = paths.to_string().parse().unwrap();
            proptest::prop_assert_eq!(reparsed.to_string(), paths.to_string());
        }
    }
}

#[test]
fn flags_have_kubernetes_names_and_defaults() {
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        authz: AuthzArgs,
    }
    let defaults = Cli::parse_from(["x"]).authz;
    assert_eq!(
        defaults.always_allow_paths,
        "/healthz,/readyz,/livez".parse().unwrap()
    );
    assert_eq!(defaults.authorized_ttl, Duration::from_secs(10));
    assert_eq!(defaults.unauthorized_ttl, Duration::from_secs(10));
    let set = Cli::parse_from([
        "x",
        "--authorization-always-allow-paths=/metrics",
        "--authorization-webhook-cache-authorized-ttl=5m",
        "--authorization-webhook-cache-unauthorized-ttl=500ms",
    ])
    .authz;
    assert!(
        set.always_allow_paths.matches("/metrics") && !set.always_allow_paths.matches("/healthz")
    );
    assert_eq!(set.authorized_ttl, Duration::from_secs(300));
    assert_eq!(set.unauthorized_ttl, Duration::from_millis(500));
    assert!(Cli::try_parse_from(["x", "--authorization-always-allow-paths=/a*b"]).is_err());
}
