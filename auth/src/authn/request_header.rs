//! Front-proxy authentication: the user named by request headers that a trusted proxy (the
//! kube-apiserver aggregator) set, trusted only when the connection's client certificate
//! verifies against the requestheader CA. Follows k8s.io/apiserver
//! `pkg/authentication/request/headerrequest/requestheader.go` and the CA/CN check of
//! `pkg/authentication/request/x509/x509.go` (`Verifier`).

use std::collections::BTreeMap;

use elemental_changelog_certs::client::CaBundle;
use http::{HeaderMap, HeaderName, HeaderValue};
use rustls_pki_types::{CertificateDer, UnixTime};

use super::{AuthnError, UserInfo};

/// The headers a front proxy uses to pass the user on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HeaderNames {
    /// Headers holding the user name; the first non-empty one wins.
    pub(crate) username: Vec<HeaderName>,
    /// Headers holding the uid; the first non-empty one wins.
    pub(crate) uid: Vec<HeaderName>,
    /// Headers holding groups; every non-empty value of each counts.
    pub(crate) group: Vec<HeaderName>,
    /// Lower-case prefixes of the headers holding extra attributes.
    pub(crate) extra_prefixes: Vec<String>,
}

impl HeaderNames {
    /// k8s.io/apiserver's standard front-proxy headers, which its authentication filter strips
    /// from every authenticated request whatever the configuration says.
    pub(crate) fn standard() -> Self {
        Self {
            username: vec![HeaderName::from_static("x-remote-user")],
            uid: vec![HeaderName::from_static("x-remote-uid")],
            group: vec![HeaderName::from_static("x-remote-group")],
            extra_prefixes: vec!["x-remote-extra-".to_owned()],
        }
    }

    /// The user the headers name, or `None` without a (non-empty) user name.
    pub(crate) fn user(&self, headers: &HeaderMap) -> Option<UserInfo> {
        let name = first_value(headers, &self.username)?;
        let uid = first_value(headers, &self.uid);
        let groups = self
            .group
            .iter()
            .flat_map(|header| headers.get_all(header))
            .filter(|value| !value.is_empty())
            .map(text)
            .collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        // Prefixes first, so that values keep the prefixes' order (as Go's `newExtra`).
        for prefix in &self.extra_prefixes {
            for header in headers.keys() {
                if let Some(key) = header.as_str().strip_prefix(prefix.as_str()) {
                    extra
                        .entry(unescape_extra_key(key))
                        .or_default()
                        .extend(headers.get_all(header).iter().map(text));
                }
            }
        }
        Some(UserInfo {
            name,
            uid,
            groups,
            extra,
        })
    }

    /// Removes every header these names and prefixes cover.
    pub(crate) fn strip(&self, headers: &mut HeaderMap) {
        for header in self.username.iter().chain(&self.uid).chain(&self.group) {
            headers.remove(header);
        }
        let prefixed: Vec<HeaderName> = headers
            .keys()
            .filter(|header| {
                self.extra_prefixes
                    .iter()
                    .any(|prefix| header.as_str().starts_with(prefix.as_str()))
            })
            .cloned()
            .collect();
        for header in prefixed {
            headers.remove(header);
        }
    }
}

/// Go's `headerValue`: the first value of each header in turn, the first non-empty one wins.
fn first_value(headers: &HeaderMap, names: &[HeaderName]) -> Option<String> {
    names
        .iter()
        .filter_map(|name| headers.get(name))
        .find(|value| !value.is_empty())
        .map(text)
}

/// A header value as text. Values are bytes; the rare non-UTF-8 byte becomes U+FFFD.
fn text(value: &HeaderValue) -> String {
    String::from_utf8_lossy(value.as_bytes()).into_owned()
}

/// Go's `url.PathUnescape` of an extra key (already lower-cased): `%XX` sequences decoded;
/// a malformed sequence (or a result that is not UTF-8) leaves the key as it is.
pub(crate) fn unescape_extra_key(key: &str) -> String {
    let bytes = key.as_bytes();
    let well_formed = bytes.iter().enumerate().all(|(i, &byte)| {
        byte != b'%'
            || (bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return key.to_owned();
    }
    percent_encoding::percent_decode_str(key)
        .decode_utf8()
        .map_or_else(|_| key.to_owned(), |decoded| decoded.into_owned())
}

/// The front-proxy authenticator: a requestheader CA, the common names it may issue to the
/// proxy, and the headers to read.
#[derive(Clone, Debug)]
pub(crate) struct RequestHeaderAuthenticator {
    pub(crate) ca: CaBundle,
    /// Allowed common names; any when empty.
    pub(crate) allowed_names: Vec<String>,
    pub(crate) names: HeaderNames,
}

impl RequestHeaderAuthenticator {
    /// The user the headers name when `chain` is a front-proxy certificate; `Ok(None)` when it
    /// is but the headers name no one; an error when `chain` does not verify against the
    /// requestheader CA (clientAuth usage required) or its CN is not allowed.
    pub(crate) fn authenticate(
        &self,
        headers: &HeaderMap,
        chain: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<Option<UserInfo>, AuthnError> {
        let client = self
            .ca
            .verify_client_chain(chain, now)
            .map_err(AuthnError::FrontProxyCertificate)?;
        if !self.allowed_names.is_empty() && !self.allowed_names.contains(&client.common_name) {
            return Err(AuthnError::FrontProxyNotAllowed {
                common_name: client.common_name,
            });
        }
        Ok(self.names.user(headers))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn names() -> HeaderNames {
        HeaderNames {
            username: vec![
                HeaderName::from_static("x-remote-user"),
                HeaderName::from_static("x-other-user"),
            ],
            uid: vec![HeaderName::from_static("x-remote-uid")],
            group: vec![
                HeaderName::from_static("x-remote-group"),
                HeaderName::from_static("x-other-group"),
            ],
            extra_prefixes: vec!["x-remote-extra-".to_owned(), "x-other-extra-".to_owned()],
        }
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

    #[test]
    fn no_user_name_means_no_user() {
        assert_eq!(names().user(&headers(&[("x-remote-group", "g")])), None);
        assert_eq!(names().user(&headers(&[("x-remote-user", "")])), None);
    }

    #[test]
    fn the_first_non_empty_user_header_wins() {
        let user = names()
            .user(&headers(&[
                ("X-Other-User", "other"),
                ("X-Remote-User", "alice"),
            ]))
            .unwrap();
        assert_eq!(user.name, "alice");
        let user = names()
            .user(&headers(&[("x-remote-user", ""), ("x-other-user", "bob")]))
            .unwrap();
        assert_eq!(user.name, "bob");
    }

    #[test]
    fn only_the_first_value_of_a_user_header_counts() {
        // Go's Header.Get returns the first value, even when empty; the next *header* is tried.
        let user = names().user(&headers(&[
            ("x-remote-user", ""),
            ("x-remote-user", "alice"),
            ("x-other-user", "bob"),
        ]));
        assert_eq!(user.unwrap().name, "bob");
        let user = names().user(&headers(&[
            ("x-remote-user", "alice"),
            ("x-remote-user", "mallory"),
        ]));
        assert_eq!(user.unwrap().name, "alice");
    }

    #[test]
    fn groups_are_every_non_empty_value_unsplit() {
        let user = names()
            .user(&headers(&[
                ("x-remote-user", "alice"),
                ("x-remote-group", "a"),
                ("x-remote-group", ""),
                ("x-remote-group", "b,c"),
                ("x-other-group", "d"),
            ]))
            .unwrap();
        assert_eq!(user.groups, ["a", "b,c", "d"]);
        assert_eq!(user.uid, None);
    }

    #[test]
    fn uid_is_the_first_non_empty_uid_header() {
        let user = names()
            .user(&headers(&[
                ("x-remote-user", "alice"),
                ("x-remote-uid", "42"),
            ]))
            .unwrap();
        assert_eq!(user.uid.as_deref(), Some("42"));
    }

    #[test]
    fn extras_are_lower_cased_percent_decoded_and_ordered_by_prefix() {
        let user = names()
            .user(&headers(&[
                ("x-remote-user", "alice"),
                ("x-other-extra-scopes", "from-other"),
                (
                    "X-Remote-Extra-Authentication.kubernetes.io%2fcredential-Id",
                    "X509SHA256=ab",
                ),
                ("x-remote-extra-scopes", "one"),
                ("x-remote-extra-scopes", ""),
                ("x-remote-extra-scopes", "two"),
                ("x-remote-extra-bad%zz", "kept"),
            ]))
            .unwrap();
        let extra: Vec<(&str, Vec<&str>)> = user
            .extra
            .iter()
            .map(|(k, v)| (k.as_str(), v.iter().map(String::as_str).collect()))
            .collect();
        assert_eq!(
            extra,
            [
                (
                    "authentication.kubernetes.io/credential-id",
                    vec!["X509SHA256=ab"]
                ),
                ("bad%zz", vec!["kept"]),
                ("scopes", vec!["one", "", "two", "from-other"]),
            ]
        );
    }

    #[test]
    fn unescaping_follows_go_path_unescape() {
        assert_eq!(unescape_extra_key("a%2fb"), "a/b");
        assert_eq!(unescape_extra_key("a%2Fb%20c"), "a/b c");
        assert_eq!(unescape_extra_key("a+b"), "a+b");
        assert_eq!(unescape_extra_key("trailing%2"), "trailing%2");
        assert_eq!(unescape_extra_key("trailing%"), "trailing%");
        assert_eq!(unescape_extra_key("%e2%82%ac"), "€");
        assert_eq!(unescape_extra_key("%ff"), "%ff");
    }

    #[test]
    fn strip_removes_every_covered_header() {
        let mut map = headers(&[
            ("x-remote-user", "alice"),
            ("x-other-user", "bob"),
            ("x-remote-uid", "1"),
            ("x-remote-group", "g"),
            ("x-other-group", "g"),
            ("x-remote-extra-a", "1"),
            ("x-other-extra-b", "2"),
            ("x-remote-extra-c", "3"),
            ("accept", "application/json"),
            ("x-remote-userx", "kept: not a configured name"),
        ]);
        names().strip(&mut map);
        let mut left: Vec<&str> = map.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["accept", "x-remote-userx"]);
    }

    proptest! {
        #[test]
        fn unescape_never_panics_and_is_identity_without_percent(key in "[ -~]{0,40}") {
            let decoded = unescape_extra_key(&key);
            if !key.contains('%') {
                prop_assert_eq!(decoded, key);
            }
        }

        #[test]
        fn header_values_round_trip(user in "[!-~]{1,20}", groups in proptest::collection::vec("[!-~]{1,10}", 0..5)) {
            let mut map = HeaderMap::new();
            map.append("x-remote-user", HeaderValue::from_str(&user).unwrap());
            for group in &groups {
                map.append("x-remote-group", HeaderValue::from_str(group).unwrap());
            }
            let parsed = HeaderNames::standard().user(&map).unwrap();
            prop_assert_eq!(parsed.name, user);
            prop_assert_eq!(parsed.groups, groups);
            HeaderNames::standard().strip(&mut map);
            prop_assert!(map.is_empty());
        }
    }
}
