//! Authentication scenarios: certificates made with rcgen, the kube API scripted with
//! tower-test (every TokenReview checked), time paused.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header::AUTHORIZATION};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::CertificateDer;
use serde_json::{Value, json};

use super::*;
use crate::review::mock;

const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";

/// A certificate authority.
struct Authority(CertifiedIssuer<'static, KeyPair>);

impl Authority {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Self(CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap())
    }

    fn pem(&self) -> String {
        self.0.pem()
    }

    /// A client certificate chain (leaf only) for `cn` in `org`, with extended key usage `eku`.
    fn issue(
        &self,
        cn: &str,
        org: Option<&str>,
        eku: ExtendedKeyUsagePurpose,
    ) -> Vec<CertificateDer<'static>> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = DistinguishedName::new();
        if !cn.is_empty() {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        if let Some(org) = org {
            params
                .distinguished_name
                .push(DnType::OrganizationName, org);
        }
        params.extended_key_usages = vec![eku];
        let key = KeyPair::generate().unwrap();
        vec![params.signed_by(&key, &self.0).unwrap().der().clone()]
    }

    fn client(&self, cn: &str) -> Vec<CertificateDer<'static>> {
        self.issue(cn, None, ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// The ConfigMap kube-apiserver writes, with `front_proxy` as requestheader CA and `clients`
/// as client CA.
fn config_map(front_proxy: &Authority, clients: Option<&Authority>) -> BTreeMap<String, String> {
    let mut data: BTreeMap<String, String> = [
        (REQUESTHEADER_CLIENT_CA_FILE, front_proxy.pem()),
        (
            REQUESTHEADER_ALLOWED_NAMES,
            r#"["front-proxy-client"]"#.to_owned(),
        ),
        (
            REQUESTHEADER_USERNAME_HEADERS,
            r#"["X-Remote-User"]"#.to_owned(),
        ),
        (REQUESTHEADER_UID_HEADERS, r#"["X-Remote-Uid"]"#.to_owned()),
        (
            REQUESTHEADER_GROUP_HEADERS,
            r#"["X-Remote-Group"]"#.to_owned(),
        ),
        (
            REQUESTHEADER_EXTRA_HEADERS_PREFIX,
            r#"["X-Remote-Extra-"]"#.to_owned(),
        ),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value))
    .collect();
    if let Some(clients) = clients {
        data.insert(CLIENT_CA_FILE.to_owned(), clients.pem());
    }
    data
}

fn authenticator(client: Client, ttl: Duration) -> Authenticator {
    let args = AuthnArgs {
        token_cache_ttl: ttl,
    };
    Authenticator::new(client, &args, Arc::new(crate::NoMetrics))
}

/// An authenticator whose kube API must never be called.
fn offline(data: &BTreeMap<String, String>) -> (Authenticator, mock::Handle) {
    let (client, handle) = mock::client();
    let authenticator = authenticator(client, Duration::from_secs(10));
    authenticator.load_config_map(data);
    (authenticator, handle)
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    map
}

fn proxied() -> HeaderMap {
    headers(&[
        ("X-Remote-User", "alice"),
        ("X-Remote-Uid", "uid-1"),
        ("X-Remote-Group", "viewers"),
        ("X-Remote-Group", "fleet"),
        ("X-Remote-Extra-Scopes", "read"),
        (
            "X-Remote-Extra-Authentication.kubernetes.io%2fcredential-Id",
            "X509SHA256=ab",
        ),
        ("Accept", "application/json"),
    ])
}

/// Names of the headers left, sorted.
fn left(headers: &HeaderMap) -> Vec<String> {
    let mut names: Vec<String> = headers
        .keys()
        .map(|name| name.as_str().to_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn front_proxy_headers_authenticate_and_are_removed() {
    let front_proxy = Authority::new("front-proxy-ca");
    let (authenticator, mut handle) = offline(&config_map(&front_proxy, None));
    let chain = front_proxy.client("front-proxy-client");
    let mut request = proxied();
    let user = authenticator
        .authenticate(&mut request, Some(&chain))
        .await
        .unwrap();
    assert_eq!(
        user,
        UserInfo {
            name: "alice".to_owned(),
            uid: Some("uid-1".to_owned()),
            groups: vec![
                "viewers".to_owned(),
                "fleet".to_owned(),
                AUTHENTICATED_GROUP.to_owned()
            ],
            extra: BTreeMap::from([
                (
                    "authentication.kubernetes.io/credential-id".to_owned(),
                    vec!["X509SHA256=ab".to_owned()]
                ),
                ("scopes".to_owned(), vec!["read".to_owned()]),
            ]),
        }
    );
    assert_eq!(left(&request), ["accept"]);
    assert!(mock::idle(&mut handle));
}

#[tokio::test]
async fn configured_header_names_are_used_and_standard_ones_stripped_too() {
    let front_proxy = Authority::new("front-proxy-ca");
    let mut data = config_map(&front_proxy, None);
    data.insert(
        REQUESTHEADER_USERNAME_HEADERS.to_owned(),
        r#"[" X-Proxy-User ", "X-Remote-User"]"#.to_owned(),
    );
    data.insert(
        REQUESTHEADER_GROUP_HEADERS.to_owned(),
        r#"["X-Proxy-Group"]"#.to_owned(),
    );
    data.insert(REQUESTHEADER_ALLOWED_NAMES.to_owned(), "[]".to_owned());
    let (authenticator, _handle) = offline(&data);
    let chain = front_proxy.client("any-name-is-allowed");
    let mut request = headers(&[
        ("X-Proxy-User", "bob"),
        ("X-Proxy-Group", "g"),
        ("X-Remote-User", "ignored"),
        ("X-Remote-Group", "ignored"),
    ]);
    let user = authenticator
        .authenticate(&mut request, Some(&chain))
        .await
        .unwrap();
    assert_eq!(
        (user.name.as_str(), user.groups.as_slice()),
        ("bob", &["g".to_owned(), AUTHENTICATED_GROUP.to_owned()][..])
    );
    assert!(request.is_empty(), "{request:?}");
}

#[tokio::test]
async fn a_front_proxy_cn_not_allowed_is_refused_and_headers_stripped() {
    let front_proxy = Authority::new("front-proxy-ca");
    let (authenticator, _handle) = offline(&config_map(&front_proxy, None));
    let chain = front_proxy.client("someone-else");
    let mut request = proxied();
    let error = authenticator
        .authenticate(&mut request, Some(&chain))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, AuthnError::FrontProxyNotAllowed { common_name } if common_name == "someone-else"),
        "{error:?}"
    );
    assert_eq!(left(&request), ["accept"]);
}

#[tokio::test]
async fn headers_without_a_front_proxy_certificate_are_not_trusted() {
    let front_proxy = Authority::new("front-proxy-ca");
    let (authenticator, _handle) = offline(&config_map(&front_proxy, None));

    // No certificate: the headers are ignored, stripped, and the request is anonymous.
    let mut request = proxied();
    let user = authenticator
        .authenticate(&mut request, None)
        .await
        .unwrap();
    assert_eq!(user, UserInfo::anonymous());
    assert_eq!(left(&request), ["accept"]);

    // A certificate from another CA: refused (never anonymous), headers stripped.
    let mut request = proxied();
    let chain = Authority::new("mallory-ca").client("front-proxy-client");
    let error = authenticator
        .authenticate(&mut request, Some(&chain))
        .await
        .unwrap_err();
    assert!(
        matches!(error, AuthnError::FrontProxyCertificate(_)),
        "{error:?}"
    );
    assert_eq!(left(&request), ["accept"]);

    // The right CA but a server-only certificate: the clientAuth usage is required.
    let mut request = proxied();
    let chain = front_proxy.issue(
        "front-proxy-client",
        None,
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let error = authenticator
        .authenticate(&mut request, Some(&chain))
        .await
        .unwrap_err();
    assert!(
        matches!(error, AuthnError::FrontProxyCertificate(_)),
        "{error:?}"
    );
    assert_eq!(left(&request), ["accept"]);
}

#[tokio::test]
async fn a_front_proxy_certificate_without_user_header_falls_through() {
    let front_proxy = Authority::new("front-proxy-ca");
    let (authenticator, _handle) = offline(&config_map(&front_proxy, None));
    let chain = front_proxy.client("front-proxy-client");
    // No X-Remote-User, no client CA, no token: nobody recognised it, nobody failed.
    let mut request = headers(&[("X-Remote-Group", "system:masters")]);
    let user = authenticator
        .authenticate(&mut request, Some(&chain))
        .await
        .unwrap();
    assert_eq!(user, UserInfo::anonymous());
    assert!(request.is_empty());
}

#[tokio::test]
async fn client_certificates_authenticate_with_cn_and_organization() {
    let front_proxy = Authority::new("front-proxy-ca");
    let clients = Authority::new("client-ca");
    let (authenticator, _handle) = offline(&config_map(&front_proxy, Some(&clients)));
    // The front-proxy authenticator fails on this chain, the x509 one accepts it.
    let chain = clients.issue("carol", Some("admins"), ExtendedKeyUsagePurpose::ClientAuth);
    let mut request = proxied();
    let user = authenticator
        .authenticate(&mut request, Some(&chain))
        .await
        .unwrap();
    assert_eq!(
        user,
        UserInfo {
            name: "carol".to_owned(),
            groups: vec!["admins".to_owned(), AUTHENTICATED_GROUP.to_owned()],
            ..UserInfo::default()
        }
    );
    assert_eq!(
        left(&request),
        ["accept"],
        "front-proxy headers are never passed on"
    );

    // A certificate without CN identifies no one; the front-proxy authenticator's failure
    // on it is then the answer.
    let nameless = clients.issue("", Some("admins"), ExtendedKeyUsagePurpose::ClientAuth);
    let user = send(&authenticator, HeaderMap::new(), Some(&nameless)).await;
    assert!(
        matches!(user, Err(AuthnError::FrontProxyCertificate(_))),
        "{user:?}"
    );

    // Without front-proxy configuration, nobody failed: anonymous, as kube-apiserver.
    let data = BTreeMap::from([(CLIENT_CA_FILE.to_owned(), clients.pem())]);
    let (authenticator, _handle) = offline(&data);
    let user = send(&authenticator, HeaderMap::new(), Some(&nameless)).await;
    assert_eq!(user.unwrap(), UserInfo::anonymous());
}

#[tokio::test]
async fn a_rotated_ca_takes_effect_and_the_old_one_stops_working() {
    let old = Authority::new("client-ca-1");
    let new = Authority::new("client-ca-2");
    let front_proxy = Authority::new("front-proxy-ca");
    let (authenticator, _handle) = offline(&config_map(&front_proxy, Some(&old)));
    let old_chain = old.client("dave");
    let new_chain = new.client("erin");
    assert_eq!(
        send(&authenticator, HeaderMap::new(), Some(&old_chain))
            .await
            .unwrap()
            .name,
        "dave"
    );
    assert!(
        send(&authenticator, HeaderMap::new(), Some(&new_chain))
            .await
            .is_err()
    );

    authenticator.load_config_map(&config_map(&front_proxy, Some(&new)));
    let refused = send(&authenticator, HeaderMap::new(), Some(&old_chain)).await;
    assert!(
        matches!(refused, Err(AuthnError::FrontProxyCertificate(_))),
        "{refused:?}"
    );
    assert_eq!(
        send(&authenticator, HeaderMap::new(), Some(&new_chain))
            .await
            .unwrap()
            .name,
        "erin"
    );
}

#[test]
fn unusable_keys_disable_only_their_authenticator() {
    let front_proxy = Authority::new("front-proxy-ca");
    let clients = Authority::new("client-ca");

    let mut data = config_map(&front_proxy, Some(&clients));
    data.insert(
        REQUESTHEADER_ALLOWED_NAMES.to_owned(),
        "front-proxy-client".to_owned(),
    );
    let (config, errors) = AuthConfig::from_data(&data);
    assert!(!config.request_header_enabled());
    assert!(config.client_ca_enabled());
    assert_eq!(
        errors.iter().map(ConfigError::key).collect::<Vec<_>>(),
        [REQUESTHEADER_ALLOWED_NAMES]
    );

    let mut data = config_map(&front_proxy, Some(&clients));
    data.insert(
        REQUESTHEADER_GROUP_HEADERS.to_owned(),
        r#"["X-Remote-Group", "  "]"#.to_owned(),
    );
    let (config, errors) = AuthConfig::from_data(&data);
    assert!(!config.request_header_enabled());
    assert!(matches!(
        errors.as_slice(),
        [ConfigError::EmptyHeaderName {
            key: REQUESTHEADER_GROUP_HEADERS
        }]
    ));

    let mut data = config_map(&front_proxy, Some(&clients));
    data.insert(
        REQUESTHEADER_USERNAME_HEADERS.to_owned(),
        r#"["X Remote User"]"#.to_owned(),
    );
    let (config, errors) = AuthConfig::from_data(&data);
    assert!(!config.request_header_enabled());
    assert!(matches!(
        errors.as_slice(),
        [ConfigError::HeaderName { .. }]
    ));

    let mut data = config_map(&front_proxy, Some(&clients));
    data.insert(
        CLIENT_CA_FILE.to_owned(),
        "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n".to_owned(),
    );
    let (config, errors) = AuthConfig::from_data(&data);
    assert!(config.request_header_enabled());
    assert!(!config.client_ca_enabled());
    assert_eq!(
        errors.iter().map(ConfigError::key).collect::<Vec<_>>(),
        [CLIENT_CA_FILE]
    );

    let (config, errors) = AuthConfig::from_data(&BTreeMap::new());
    assert!(!config.request_header_enabled() && !config.client_ca_enabled() && errors.is_empty());
}

#[tokio::test]
async fn headers_named_by_a_broken_config_are_still_stripped() {
    let front_proxy = Authority::new("front-proxy-ca");
    let mut data = config_map(&front_proxy, None);
    data.insert(
        REQUESTHEADER_USERNAME_HEADERS.to_owned(),
        r#"["X-Proxy-User"]"#.to_owned(),
    );
    data.insert(
        REQUESTHEADER_CLIENT_CA_FILE.to_owned(),
        "garbage".to_owned(),
    );
    let (authenticator, _handle) = offline(&data);
    let chain = front_proxy.client("front-proxy-client");
    let mut request = headers(&[("X-Proxy-User", "root"), ("X-Remote-User", "root")]);
    let user = authenticator
        .authenticate(&mut request, Some(&chain))
        .await
        .unwrap();
    assert_eq!(user, UserInfo::anonymous());
    assert!(request.is_empty());
}

fn token_review(token: &str) -> Value {
    json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "metadata": {},
        "spec": { "token": token },
    })
}

fn reviewed(status: Value) -> Value {
    json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "metadata": {},
        "spec": {},
        "status": status,
    })
}

/// Authenticates a request made of `headers` and `chain`, throwing the headers away.
async fn send(
    authenticator: &Authenticator,
    mut headers: HeaderMap,
    chain: Option<&[CertificateDer<'static>]>,
) -> Result<UserInfo, AuthnError> {
    authenticator.authenticate(&mut headers, chain).await
}

fn bearer(token: &str) -> HeaderMap {
    headers(&[
        ("Authorization", &format!("Bearer {token}")),
        ("Accept", "*/*"),
    ])
}

#[tokio::test(start_paused = true)]
async fn tokens_are_reviewed_and_answers_cached_for_the_ttl() {
    let (client, mut handle) = mock::client();
    let authenticator = authenticator(client, Duration::from_secs(10));
    let frank = json!({
        "authenticated": true,
        "user": {
            "username": "system:serviceaccount:ns:frank",
            "uid": "u-1",
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "extra": { "authentication.kubernetes.io/pod-name": ["p"] },
        },
    });
    let expected = UserInfo {
        name: "system:serviceaccount:ns:frank".to_owned(),
        uid: Some("u-1".to_owned()),
        groups: vec![
            "system:serviceaccounts".to_owned(),
            AUTHENTICATED_GROUP.to_owned(),
        ],
        extra: BTreeMap::from([(
            "authentication.kubernetes.io/pod-name".to_owned(),
            vec!["p".to_owned()],
        )]),
    };

    let mut request = bearer("t1");
    let (user, ()) = tokio::join!(
        authenticator.authenticate(&mut request, None),
        mock::expect_post(
            &mut handle,
            TOKEN_REVIEWS,
            token_review("t1"),
            StatusCode::CREATED,
            reviewed(frank.clone())
        ),
    );
    assert_eq!(user.unwrap(), expected);
    assert_eq!(
        left(&request),
        ["accept"],
        "the Authorization header is consumed"
    );

    // Within the TTL: no review.
    tokio::time::advance(Duration::from_millis(9_999)).await;
    assert_eq!(
        send(&authenticator, bearer("t1"), None).await.unwrap(),
        expected
    );
    assert!(mock::idle(&mut handle));

    // After it: reviewed again.
    tokio::time::advance(Duration::from_millis(1)).await;
    let (user, ()) = tokio::join!(
        send(&authenticator, bearer("t1"), None),
        mock::expect_post(
            &mut handle,
            TOKEN_REVIEWS,
            token_review("t1"),
            StatusCode::CREATED,
            reviewed(frank)
        ),
    );
    assert_eq!(user.unwrap(), expected);
}

#[tokio::test(start_paused = true)]
async fn invalid_tokens_are_refused_and_cached_but_review_errors_are_not() {
    let (client, mut handle) = mock::client();
    let authenticator = authenticator(client, Duration::from_secs(10));

    // Not authenticated: 401, and remembered.
    let mut request = bearer("bad");
    let (result, ()) = tokio::join!(
        authenticator.authenticate(&mut request, None),
        mock::expect_post(
            &mut handle,
            TOKEN_REVIEWS,
            token_review("bad"),
            StatusCode::CREATED,
            reviewed(json!({"authenticated": false}))
        ),
    );
    assert!(
        matches!(result, Err(AuthnError::InvalidToken)),
        "{result:?}"
    );
    assert!(
        request.contains_key(AUTHORIZATION),
        "kept when not authenticated"
    );
    assert!(matches!(
        send(&authenticator, bearer("bad"), None).await,
        Err(AuthnError::InvalidToken)
    ));
    assert!(mock::idle(&mut handle));

    // Not authenticated with an error: 401 with the reason, not remembered.
    let rejected = reviewed(json!({"authenticated": false, "error": "token expired"}));
    for _ in 0..2 {
        let (result, ()) = tokio::join!(
            send(&authenticator, bearer("old"), None),
            mock::expect_post(
                &mut handle,
                TOKEN_REVIEWS,
                token_review("old"),
                StatusCode::CREATED,
                rejected.clone()
            ),
        );
        assert!(
            matches!(&result, Err(AuthnError::TokenRejected { message }) if message == "token expired"),
            "{result:?}"
        );
    }

    // The review itself fails (403: no system:auth-delegator): 401, not remembered.
    for _ in 0..2 {
        let (result, ()) = tokio::join!(
            send(&authenticator, bearer("t"), None),
            mock::expect_post(
                &mut handle,
                TOKEN_REVIEWS,
                token_review("t"),
                StatusCode::FORBIDDEN,
                mock::status(403, "Forbidden")
            ),
        );
        assert!(
            matches!(result, Err(AuthnError::TokenReview(_))),
            "{result:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn transient_review_failures_are_retried() {
    let (client, mut handle) = mock::client();
    let authenticator = authenticator(client, Duration::from_secs(10));
    let answer = reviewed(json!({"authenticated": true, "user": {"username": "gina"}}));
    let (user, ()) = tokio::join!(send(&authenticator, bearer("t"), None), async {
        mock::fail_next(&mut handle).await;
        let busy = mock::status(429, "TooManyRequests");
        mock::expect_post(
            &mut handle,
            TOKEN_REVIEWS,
            token_review("t"),
            StatusCode::TOO_MANY_REQUESTS,
            busy,
        )
        .await;
        mock::expect_post(
            &mut handle,
            TOKEN_REVIEWS,
            token_review("t"),
            StatusCode::CREATED,
            answer.clone(),
        )
        .await;
    });
    assert_eq!(user.unwrap().name, "gina");
}

#[tokio::test(start_paused = true)]
async fn concurrent_identical_reviews_are_coalesced() {
    let (client, mut handle) = mock::client();
    let authenticator = authenticator(client, Duration::from_secs(10));
    let answer = reviewed(json!({"authenticated": true, "user": {"username": "hank"}}));
    let (first, second, ()) = tokio::join!(
        send(&authenticator, bearer("same"), None),
        send(&authenticator, bearer("same"), None),
        mock::expect_post(
            &mut handle,
            TOKEN_REVIEWS,
            token_review("same"),
            StatusCode::CREATED,
            answer.clone()
        ),
    );
    assert_eq!(first.unwrap().name, "hank");
    assert_eq!(second.unwrap().name, "hank");
    assert!(mock::idle(&mut handle));
}

#[tokio::test(start_paused = true)]
async fn health_paths_review_no_token() {
    let (client, mut handle) = mock::client();
    let authenticator = authenticator(client, Duration::from_secs(10));
    for n in 0..20 {
        let mut request = bearer(&format!("random-{n}"));
        let user = authenticator
            .authenticate_without_review(&mut request, None)
            .await
            .unwrap();
        assert_eq!(user, UserInfo::anonymous());
    }
    assert!(mock::idle(&mut handle), "a TokenReview was sent");
}

#[tokio::test(start_paused = true)]
async fn a_zero_ttl_disables_the_token_cache() {
    let (client, mut handle) = mock::client();
    let authenticator = authenticator(client, Duration::ZERO);
    let answer = reviewed(json!({"authenticated": true, "user": {"username": "ivy"}}));
    for _ in 0..2 {
        let (user, ()) = tokio::join!(
            send(&authenticator, bearer("t"), None),
            mock::expect_post(
                &mut handle,
                TOKEN_REVIEWS,
                token_review("t"),
                StatusCode::CREATED,
                answer.clone()
            ),
        );
        assert_eq!(user.unwrap().name, "ivy");
    }
}

#[tokio::test]
async fn no_credentials_means_anonymous() {
    let (authenticator, mut handle) = offline(&BTreeMap::new());
    for value in ["Basic YWxpY2U6c2VjcmV0", "Bearer", "Bearer  spaced"] {
        let mut request = headers(&[("Authorization", value)]);
        assert_eq!(
            authenticator
                .authenticate(&mut request, None)
                .await
                .unwrap(),
            UserInfo::anonymous()
        );
        assert!(
            request.is_empty(),
            "{value}: Authorization removed once authenticated"
        );
    }
    assert!(mock::idle(&mut handle));
}

#[tokio::test]
async fn certificate_errors_win_over_anonymous_but_not_over_a_valid_token() {
    let front_proxy = Authority::new("front-proxy-ca");
    let clients = Authority::new("client-ca");
    let (client, mut handle) = mock::client();
    let authenticator = authenticator(client, Duration::from_secs(10));
    authenticator.load_config_map(&config_map(&front_proxy, Some(&clients)));
    let stranger = Authority::new("other-ca").client("joe");

    let error = send(&authenticator, HeaderMap::new(), Some(&stranger))
        .await
        .unwrap_err();
    assert!(
        matches!(error, AuthnError::FrontProxyCertificate(_)),
        "first error reported: {error:?}"
    );

    let answer = reviewed(json!({"authenticated": true, "user": {"username": "joe"}}));
    let (user, ()) = tokio::join!(
        send(&authenticator, bearer("t"), Some(&stranger)),
        mock::expect_post(
            &mut handle,
            TOKEN_REVIEWS,
            token_review("t"),
            StatusCode::CREATED,
            answer.clone()
        ),
    );
    assert_eq!(user.unwrap().name, "joe");
}

#[test]
fn authenticated_group_is_added_once() {
    let user = |name: &str, groups: &[&str]| UserInfo {
        name: name.to_owned(),
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        ..UserInfo::default()
    };
    assert_eq!(user("a", &[]).authenticated().groups, [AUTHENTICATED_GROUP]);
    assert_eq!(
        user("a", &[AUTHENTICATED_GROUP]).authenticated().groups,
        [AUTHENTICATED_GROUP]
    );
    assert_eq!(
        user("a", &[UNAUTHENTICATED_GROUP]).authenticated().groups,
        [UNAUTHENTICATED_GROUP]
    );
    assert_eq!(
        user(ANONYMOUS_USER, &[]).authenticated().groups,
        Vec::<String>::new()
    );
}

#[test]
fn the_cache_ttl_flag_parses_like_kubernetes_durations() {
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        authn: AuthnArgs,
    }
    assert_eq!(
        Cli::parse_from(["x"]).authn.token_cache_ttl,
        Duration::from_secs(10)
    );
    let cli = Cli::parse_from(["x", "--authentication-token-webhook-cache-ttl", "1m30s"]);
    assert_eq!(cli.authn.token_cache_ttl, Duration::from_secs(90));
}

fn config_map_object(data: &BTreeMap<String, String>, resource_version: u32) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": CONFIG_MAP_NAME,
            "namespace": CONFIG_MAP_NAMESPACE,
            "resourceVersion": resource_version.to_string(),
        },
        "data": data,
    })
}

fn respond(
    send: tower_test::mock::SendResponse<http::Response<kube::client::Body>>,
    status: StatusCode,
    body: Vec<u8>,
) {
    send.send_response(
        http::Response::builder()
            .status(status)
            .body(kube::client::Body::from(body))
            .unwrap(),
    );
}

/// Receives the next request of the watcher and checks it is a list or a watch (`watching`) of
/// the authentication ConfigMap only.
async fn expect_config_request(
    handle: &mut mock::Handle,
    watching: bool,
) -> tower_test::mock::SendResponse<http::Response<kube::client::Body>> {
    let (request, send) = handle.next_request().await.expect("a request");
    assert_eq!(request.method(), http::Method::GET);
    assert_eq!(
        request.uri().path(),
        "/api/v1/namespaces/kube-system/configmaps"
    );
    let query = request.uri().query().unwrap_or_default();
    assert!(
        query.contains("fieldSelector=metadata.name%3Dextension-apiserver-authentication"),
        "{query}"
    );
    assert_eq!(query.contains("watch=true"), watching, "{query}");
    send
}

#[tokio::test(start_paused = true)]
async fn the_config_map_is_watched_and_every_change_applied() {
    let front_proxy = Authority::new("front-proxy-ca");
    let (old, new) = (Authority::new("client-ca-1"), Authority::new("client-ca-2"));
    let (old_chain, new_chain) = (old.client("kim"), new.client("lee"));
    let (client, mut handle) = mock::client();
    let authenticator = Arc::new(authenticator(client.clone(), Duration::from_secs(10)));
    let watch = tokio::spawn(watch_config(client, Arc::clone(&authenticator)));

    // The first list fails (no RoleBinding yet): logged, counted, retried; not ready meanwhile.
    let send = expect_config_request(&mut handle, false).await;
    respond(
        send,
        StatusCode::FORBIDDEN,
        serde_json::to_vec(&mock::status(403, "Forbidden")).unwrap(),
    );
    let send = expect_config_request(&mut handle, false).await;
    assert!(!authenticator.is_ready());
    let list = json!({
        "apiVersion": "v1",
        "kind": "ConfigMapList",
        "metadata": {"resourceVersion": "1"},
        "items": [config_map_object(&config_map(&front_proxy, Some(&old)), 1)],
    });
    respond(send, StatusCode::OK, serde_json::to_vec(&list).unwrap());
    authenticator.wait_until_ready().await;
    assert_eq!(
        send_chain(&authenticator, &old_chain).await.unwrap().name,
        "kim"
    );

    // The CA is rotated: the new one is accepted, the old one refused.
    let send = expect_config_request(&mut handle, true).await;
    let event = json!({"type": "MODIFIED", "object": config_map_object(&config_map(&front_proxy, Some(&new)), 2)});
    respond(send, StatusCode::OK, format!("{event}\n").into_bytes());
    // The watch body ended after the event: the next request means the event was applied.
    let send = expect_config_request(&mut handle, true).await;
    assert_eq!(
        send_chain(&authenticator, &new_chain).await.unwrap().name,
        "lee"
    );
    assert!(send_chain(&authenticator, &old_chain).await.is_err());

    // The ConfigMap is deleted: no certificate authenticates any more.
    let event = json!({"type": "DELETED", "object": config_map_object(&config_map(&front_proxy, Some(&new)), 3)});
    respond(send, StatusCode::OK, format!("{event}\n").into_bytes());
    let _send = expect_config_request(&mut handle, true).await;
    assert_eq!(
        send_chain(&authenticator, &new_chain).await.unwrap(),
        UserInfo::anonymous()
    );
    assert!(authenticator.is_ready());
    watch.abort();
}

async fn send_chain(
    authenticator: &Authenticator,
    chain: &[CertificateDer<'static>],
) -> Result<UserInfo, AuthnError> {
    send(authenticator, HeaderMap::new(), Some(chain)).await
}
