#![allow(clippy::unwrap_used)]

use super::*;

fn hops(allowed: &[&str], insecure: &[&str]) -> Hops {
    Hops::new(&FetchConfig {
        allowed_registries: allowed.iter().map(|r| (*r).to_owned()).collect(),
        insecure_registries: insecure.iter().map(|r| (*r).to_owned()).collect(),
        ..FetchConfig::default()
    })
}

fn url(text: &str) -> Url {
    Url::parse(text).unwrap()
}

fn refusal(hops: &Hops, from: &str, to: &str) -> Option<Refusal> {
    hops.check(Hop::Redirect, from, &url(to))
        .err()
        .map(|refused| refused.refusal)
}

#[test]
fn only_allowed_hosts_are_reached() {
    let allowed = hops(
        &["registry.example:5000", "storage.example", "docker.io"],
        &[],
    );
    assert_eq!(
        refusal(&allowed, "https", "https://registry.example:5000/v2/x"),
        None
    );
    assert_eq!(
        refusal(&allowed, "https", "https://STORAGE.example/blob?sig=1"),
        None
    );
    // Docker Hub's names are one registry.
    assert_eq!(
        refusal(&allowed, "https", "https://registry-1.docker.io/v2/"),
        None
    );
    for elsewhere in [
        "https://registry.example/v2/x",
        "https://registry.example:5001/v2/x",
        "https://10.0.0.1:6443/api",
        "https://storage.example.evil/x",
    ] {
        assert_eq!(
            refusal(&allowed, "https", elsewhere),
            Some(Refusal::NotAllowed),
            "{elsewhere}"
        );
    }
    // No allow-list: any host.
    assert_eq!(
        refusal(&hops(&[], &[]), "https", "https://10.0.0.1:6443/"),
        None
    );
}

#[test]
fn https_never_becomes_plain_http_but_for_insecure_registries() {
    let any = hops(&[], &["mirror.local:5000"]);
    assert_eq!(
        refusal(&any, "https", "http://storage.example/blob"),
        Some(Refusal::Downgrade)
    );
    assert_eq!(refusal(&any, "https", "http://MIRROR.local:5000/v2/"), None);
    // Plain HTTP already: no downgrade (the allow-list still applies).
    assert_eq!(refusal(&any, "http", "http://storage.example/blob"), None);
    assert_eq!(refusal(&any, "https", "https://storage.example/blob"), None);
    let listed = hops(&["storage.example"], &[]);
    assert_eq!(
        refusal(&listed, "https", "http://storage.example/blob"),
        Some(Refusal::Downgrade)
    );
}

#[test]
fn refusals_say_what_and_where_without_the_query() {
    let refused = hops(&["registry.example"], &[])
        .check(
            Hop::TokenRealm,
            "https",
            &url("https://user:pw@auth.example:8443/token?scope=secret#f"),
        )
        .unwrap_err();
    let message = refused.to_string();
    assert_eq!(
        message,
        "token realm to https://auth.example:8443/token refused: its host is not an allowed \
         registry (--allowed-registry)"
    );
}
