use super::*;
use elemental_changelog_apiservice::status::CauseReason;

fn parsed(raw: &str) -> Result<Option<PackageQuery>, StatusError> {
    parse(&QueryValues::parse(raw)).map(|q| q.map(|q| *q))
}

#[test]
fn name_and_bounds() {
    assert_eq!(parsed("").unwrap(), None);
    assert_eq!(parsed("package=").unwrap(), None);
    let q = parsed("package=xz&packageAtLeast=5.6.0&packageBelow=5.6.2")
        .unwrap()
        .unwrap();
    assert_eq!(
        q,
        PackageQuery::new("xz", Some("5.6.0"), Some("5.6.2")).unwrap()
    );
    // The first value counts, as for every parameter.
    let q = parsed("package=xz&package=bash&packageBelow=1:2")
        .unwrap()
        .unwrap();
    assert_eq!((q.name(), q.below().unwrap().epoch), ("xz", 1));
    // Encoded as a client encodes it.
    let q = parsed("package=libstdc%2B%2B6").unwrap().unwrap();
    assert_eq!(q.name(), "libstdc++6");
}

#[test]
fn refusals_name_the_parameter_and_the_rule() {
    for (raw, field, rule) in [
        ("package=x%20y", NAME, "a package name is"),
        ("package=xz&packageAtLeast=5.6.0-", AT_LEAST, "an EVR is"),
        ("package=xz&packageBelow=a:1", BELOW, "an EVR is"),
        ("packageBelow=5.6.2", BELOW, "needs package"),
        ("packageAtLeast=5.6.2", AT_LEAST, "needs package"),
        (
            "package=xz&packageAtLeast=5.6.2&packageBelow=5.6.0",
            AT_LEAST,
            "must be lower than packageBelow",
        ),
    ] {
        let error = parsed(raw).unwrap_err();
        assert_eq!(error.code(), 400, "{raw}");
        assert!(
            error
                .message
                .starts_with(&format!("{field}: Invalid value: ")),
            "{raw}: {}",
            error.message
        );
        assert!(error.message.contains(rule), "{raw}: {}", error.message);
        let cause = &error.details.as_ref().unwrap().causes[0];
        assert_eq!(
            (cause.field.as_str(), &cause.reason),
            (field, &CauseReason::FieldValueInvalid)
        );
    }
}
