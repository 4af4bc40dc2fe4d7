use super::*;

#[test]
fn refusals_are_recorded_by_default_and_the_rest_with_all() {
    assert_eq!(AccessLog::default(), AccessLog::Refusals);
    for code in [401, 403, 429] {
        assert!(AccessLog::Refusals.records(code), "{code}");
        assert!(AccessLog::All.records(code), "{code}");
        assert!(!AccessLog::Off.records(code), "{code}");
    }
    for code in [200, 304, 400, 404, 405, 500, 503, 504] {
        assert!(!AccessLog::Refusals.records(code), "{code}");
        assert!(AccessLog::All.records(code), "{code}");
        assert!(!AccessLog::Off.records(code), "{code}");
    }
}

#[test]
fn the_front_proxy_is_told_apart() {
    let user = UserInfo {
        name: "alice".to_owned(),
        groups: vec!["a".to_owned(), "system:authenticated".to_owned()],
        ..UserInfo::default()
    };
    let proxied = Requester::new(&user, Authentication::RequestHeader);
    assert!(proxied.proxied && proxied.groups == 2 && proxied.user == "alice");
    for direct in [Authentication::Token, Authentication::X509] {
        assert!(!Requester::new(&user, direct).proxied);
    }
}

fn entry<'a>(requester: &'a Requester, path: &'a str, code: u16, port: u16) -> Entry<'a> {
    Entry {
        requester,
        verb: "get",
        path,
        code,
        bytes: Some(0),
        latency: Duration::from_millis(1),
        addr: Some(std::net::SocketAddr::from(([10, 0, 0, 1], port))),
    }
}

/// A flood of refusals from one address (whatever its ports) writes a burst of lines, the
/// rest counted for the summary; answers that are not refusals are not limited.
#[test]
fn refusals_are_limited_per_source() {
    let log = AccessLogger::new(AccessLog::All);
    let anonymous = Requester::default();
    let path = "/apis/x".repeat(10_000);
    let written = (0..10_000u16)
        .filter(|port| log.record(&entry(&anonymous, &path, 401, *port)))
        .count();
    assert_eq!(written, limiter::BURST as usize);
    assert!((0..100).all(|_| log.record(&entry(&anonymous, "/livez", 200, 1))));
    let left_out = log.left_out();
    assert_eq!(left_out.len(), 1);
    assert_eq!(left_out[0].1, 10_000 - u64::from(limiter::BURST));
    assert_eq!(left_out[0].0.to_string(), "10.0.0.1");
    assert!(log.left_out().is_empty(), "told twice");
    assert!(!AccessLogger::new(AccessLog::Off).record(&entry(&anonymous, "/", 401, 1)));
}
