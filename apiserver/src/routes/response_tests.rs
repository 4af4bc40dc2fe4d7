//! Paths and the response helpers: `Status` errors, discovery documents
//! with `ETag`/304, health.

use futures::executor::block_on;
use http_body_util::BodyExt;
use serde_json::Value;

use super::*;
use elemental_changelog_apiservice::RESOURCE;

const BASE: &str = "/apis/changelog.elemental.cattle.io/v1beta1";

fn parts(headers: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.insert(
            header::HeaderName::from_bytes(name.as_bytes()).unwrap_or_else(|e| panic!("{e}")),
            HeaderValue::from_str(value).unwrap_or_else(|e| panic!("{e}")),
        );
    }
    map
}

fn request(method: &http::Method, uri: &str) -> RequestInfo {
    RequestInfo::parse(method, &uri.parse().unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn body(response: HttpResponse) -> Vec<u8> {
    block_on(response.into_body().collect())
        .map(|c| c.to_bytes().to_vec())
        .unwrap_or_default()
}

fn header(response: &HttpResponse, name: header::HeaderName) -> Option<&str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

#[test]
fn status_responses_carry_code_reason_and_retry_after() {
    let unavailable = StatusError::service_unavailable("not fetched yet", Some(5));
    let response = status(&unavailable);
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&response, header::RETRY_AFTER), Some("5"));
    assert_eq!(
        header(&response, header::CONTENT_TYPE),
        Some("application/json")
    );
    let json: Value = serde_json::from_slice(&body(response)).unwrap_or_default();
    assert_eq!(
        (
            json["kind"].as_str(),
            json["status"].as_str(),
            json["code"].as_u64()
        ),
        (Some("Status"), Some("Failure"), Some(503))
    );
    assert_eq!(json["reason"], "ServiceUnavailable");
    assert_eq!(json["details"]["retryAfterSeconds"], 5);

    let response = status(&StatusError::not_found(RESOURCE, "v1"));
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(header(&response, header::RETRY_AFTER), None);
}

#[test]
fn unknown_paths_are_a_404_naming_the_path() {
    let e = not_found_path("/apis/nope");
    assert_eq!(e.code(), 404);
    assert!(e.message.contains("/apis/nope"));
    assert!(e.details.is_none());
    assert_eq!(status(&e).status(), StatusCode::NOT_FOUND);
}

#[test]
fn discovery_documents_have_an_etag_and_answer_304_to_it() {
    let document = discovery::api_resource_list();
    let response = document_response(&parts(&[]), document);
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        header(&response, header::ETAG),
        Some(document.etag.as_str())
    );
    assert_eq!(
        header(&response, header::CONTENT_TYPE),
        Some(document.content_type)
    );
    assert_eq!(
        header(&response, header::VARY),
        Some("Accept, Accept-Encoding")
    );
    assert_eq!(body(response), document.body);

    let weak = format!("W/{}", document.etag);
    let listed = format!("\"other\", {}", document.etag);
    for if_none_match in [document.etag.as_str(), weak.as_str(), listed.as_str(), "*"] {
        let response = document_response(&parts(&[("if-none-match", if_none_match)]), document);
        assert_eq!(
            response.status(),
            StatusCode::NOT_MODIFIED,
            "{if_none_match}"
        );
        assert_eq!(
            header(&response, header::ETAG),
            Some(document.etag.as_str())
        );
        assert_eq!(
            header(&response, header::CONTENT_TYPE),
            Some(document.content_type)
        );
        assert!(body(response).is_empty());
    }
    let stale = document_response(&parts(&[("if-none-match", "\"stale\"")]), document);
    assert_eq!(stale.status(), StatusCode::OK);

    // Each representation of /apis has its own ETag: a 304 for one is never
    // sent for the other.
    let v2 = discovery::negotiate_apis(Some(
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
    ))
    .document();
    let list = discovery::negotiate_apis(None).document();
    assert_ne!(v2.etag, list.etag);
    let response = document_response(&parts(&[("if-none-match", &list.etag)]), v2);
    assert_eq!(response.status(), StatusCode::OK);
}

#[test]
fn health_answers_500_while_failing() {
    let health = Health::default();
    let synced = health.ready_flag("informer-sync");
    let response = health_response(&health.ready(), "readyz", false);
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        header(&response, header::CONTENT_TYPE),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(
        response
            .headers()
            .get("x-content-type-options")
            .and_then(|v| v.to_str().ok()),
        Some("nosniff")
    );
    let text = String::from_utf8(body(response)).unwrap_or_default();
    assert!(
        text.contains("[-]informer-sync failed") && text.ends_with("readyz check failed\n"),
        "{text}"
    );

    synced.set();
    let response = health_response(&health.ready(), "readyz", false);
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body(response), b"ok");
    let verbose = String::from_utf8(body(health_response(&health.ready(), "readyz", true)))
        .unwrap_or_default();
    assert_eq!(verbose, "[+]informer-sync ok\nreadyz check passed\n");

    let _beat = health.heartbeat("channel-controller");
    assert_eq!(
        health_response(&health.live(), "livez", false).status(),
        StatusCode::OK
    );
}

#[test]
fn forbidden_names_the_resource_or_the_path() {
    let user = UserInfo {
        name: "jane".to_owned(),
        ..UserInfo::default()
    };
    let info = request(
        &http::Method::GET,
        &format!("{BASE}/namespaces/fleet-default/managedosversions/v1/changelog"),
    );
    let e = forbidden(&user, info.attributes(), "");
    assert_eq!(e.code(), 403);
    assert!(
        e.message.contains(r#"User "jane" cannot get resource "managedosversions/changelog" in API group "changelog.elemental.cattle.io" in the namespace "fleet-default""#),
        "{}",
        e.message
    );
    let info = request(&http::Method::GET, "/metrics");
    let e = forbidden(&user, info.attributes(), "");
    assert!(
        e.message.contains(r#"cannot get path "/metrics""#),
        "{}",
        e.message
    );
}

#[test]
fn a_head_answer_has_the_get_head_and_no_body() {
    let ready = Ready::answer(vec![b'x'; 4096], "application/json");
    let get = ready.respond(&HeaderMap::new());
    let head = without_body(ready.respond(&HeaderMap::new()));
    assert_eq!(head.status(), get.status());
    assert_eq!(head.headers()[header::CONTENT_LENGTH], "4096");
    assert_eq!(head.headers()[header::ETAG], get.headers()[header::ETAG]);
    // Nothing for hyper to send as HTTP/2 DATA frames.
    assert!(hyper::body::Body::is_end_stream(head.body()));
    assert!(
        matches!(head.body(), Either::Left(_)),
        "a HEAD answer is whole"
    );
    assert!(body(head).is_empty());
}
