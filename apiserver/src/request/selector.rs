//! Label and field selectors, with the syntax and meaning of
//! k8s.io/apimachinery `pkg/labels` and `pkg/fields`.

use std::collections::BTreeMap;

use elemental_changelog_apiservice::status::StatusError;

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Requirement {
    /// `key`.
    Exists(String),
    /// `!key`.
    DoesNotExist(String),
    /// `key=v`, `key==v`, `key in (a,b)`.
    In(String, Vec<String>),
    /// `key!=v`, `key notin (a,b)`: true also when the key is absent.
    NotIn(String, Vec<String>),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LabelSelector(Vec<Requirement>);

impl LabelSelector {
    /// Parses `labelSelector`. Errors are 400s worded like kube-apiserver's.
    pub fn parse(input: &str) -> Result<Self, StatusError> {
        let mut requirements = Vec::new();
        for part in split_top_level(input) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            requirements.push(parse_requirement(part).map_err(|why| {
                StatusError::bad_request(format!("unable to parse requirement: {why}: {part:?}"))
            })?);
        }
        Ok(Self(requirements))
    }

    /// Whether it selects everything (no requirement).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bytes it holds on the heap (about).
    pub fn heap_bytes(&self) -> usize {
        self.0
            .iter()
            .map(|r| match r {
                Requirement::Exists(k) | Requirement::DoesNotExist(k) => k.len(),
                Requirement::In(k, values) | Requirement::NotIn(k, values) => {
                    k.len() + values.iter().map(|v| v.len() + 24).sum::<usize>()
                }
            })
            .sum::<usize>()
            + self.0.len() * std::mem::size_of::<Requirement>()
    }

    /// Whether `labels` meet every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
            Requirement::In(k, values) => labels.get(k).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(k, values) => labels.get(k).is_none_or(|v| !values.contains(v)),
        })
    }
}

/// Splits on commas that are not inside `( )`.
fn split_top_level(input: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in input.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&input[start..]);
    parts
}

fn parse_requirement(part: &str) -> Result<Requirement, &'static str> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key_of(key.trim())?));
    }
    if let Some((key, value)) = part.split_once("!=") {
        return Ok(Requirement::NotIn(
            key_of(key.trim())?,
            vec![value_of(value.trim())?],
        ));
    }
    if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
        return Ok(Requirement::In(
            key_of(key.trim())?,
            vec![value_of(value.trim())?],
        ));
    }
    if let Some((key, rest)) = split_keyword(part, "notin") {
        return Ok(Requirement::NotIn(key_of(key)?, set_of(rest)?));
    }
    if let Some((key, rest)) = split_keyword(part, "in") {
        return Ok(Requirement::In(key_of(key)?, set_of(rest)?));
    }
    Ok(Requirement::Exists(key_of(part)?))
}

/// `key <keyword> (...)` → (`key`, `(...)`).
fn split_keyword<'a>(part: &'a str, keyword: &str) -> Option<(&'a str, &'a str)> {
    let mut words = part.splitn(2, char::is_whitespace);
    let key = words.next()?.trim();
    let rest = words.next()?.trim_start();
    let rest = rest.strip_prefix(keyword)?.trim_start();
    rest.starts_with('(').then_some((key, rest))
}

fn set_of(rest: &str) -> Result<Vec<String>, &'static str> {
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or("expected a set of values in parentheses")?;
    let values: Vec<String> = inner
        .split(',')
        .map(|v| value_of(v.trim()))
        .collect::<Result<_, _>>()?;
    if values.iter().all(String::is_empty) {
        return Err("a set needs at least one value");
    }
    Ok(values)
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of up
/// to 63 characters of alphanumerics, `-`, `_`, `.`.
fn key_of(key: &str) -> Result<String, &'static str> {
    let name = match key.rsplit_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty()
                || prefix.len() > 253
                || !prefix
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
            {
                return Err("invalid label key prefix");
            }
            name
        }
        None => key,
    };
    if name.is_empty() || name.len() > 63 || !is_label_chars(name) {
        return Err("invalid label key");
    }
    Ok(key.to_owned())
}

/// A label value: empty, or up to 63 characters like a key name.
fn value_of(value: &str) -> Result<String, &'static str> {
    if value.len() > 63 || (!value.is_empty() && !is_label_chars(value)) {
        return Err("invalid label value");
    }
    Ok(value.to_owned())
}

fn is_label_chars(s: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    alnum(s.chars().next())
        && alnum(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A field selector, with the grammar of k8s.io/apimachinery `fields.ParseSelector`: terms
/// split on unescaped commas (and sorted, as Go sorts them), each `field=value`,
/// `field==value` or `field!=value` with `\\`, `\,` and `\=` escapes in the value. The same
/// parse serves authorization (which object a list names) and the answer (which objects it
/// holds), so the two cannot disagree.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FieldSelector(Vec<FieldTerm>);

/// One term of a [`FieldSelector`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct FieldTerm {
    field: String,
    equal: bool,
    value: String,
}

/// The fields this API can select on.
const SUPPORTED_FIELDS: [&str; 2] = ["metadata.name", "metadata.namespace"];

impl FieldSelector {
    /// Bytes it holds on the heap (about).
    pub fn heap_bytes(&self) -> usize {
        self.0
            .iter()
            .map(|t| t.field.len() + t.value.len() + std::mem::size_of::<FieldTerm>())
            .sum()
    }

    /// Parses `fieldSelector` (syntax only; see [`FieldSelector::check_supported`]). Errors
    /// are 400s worded like kube-apiserver's.
    pub fn parse(input: &str) -> Result<Self, StatusError> {
        let mut parts = split_terms(input);
        parts.sort_unstable();
        let mut terms = Vec::with_capacity(parts.len());
        for part in parts.into_iter().filter(|part| !part.is_empty()) {
            let (field, operator, value) = split_term(part).ok_or_else(|| {
                StatusError::bad_request(format!(
                    "invalid selector: '{input}'; can't understand '{part}'"
                ))
            })?;
            let value = unescape_value(value).map_err(|why| {
                StatusError::bad_request(format!("invalid field selector value {value:?}: {why}"))
            })?;
            terms.push(FieldTerm {
                field: field.to_owned(),
                equal: operator != "!=",
                value,
            });
        }
        Ok(Self(terms))
    }

    /// Refuses fields this API cannot select on (kube-apiserver checks this after
    /// authorization, with the same wording).
    pub fn check_supported(&self) -> Result<(), StatusError> {
        match self
            .0
            .iter()
            .find(|term| !SUPPORTED_FIELDS.contains(&term.field.as_str()))
        {
            Some(term) => Err(StatusError::bad_request(format!(
                "field label not supported: {} (supported: {})",
                term.field,
                SUPPORTED_FIELDS.join(", ")
            ))),
            None => Ok(()),
        }
    }

    /// The value `metadata.name` must equal, as Go's `RequiresExactMatch`: the first `=` or
    /// `==` term on it in sorted order.
    pub fn exact_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|term| term.equal && term.field == "metadata.name")
            .map(|term| term.value.as_str())
    }

    /// Whether an object with this name and namespace is selected (every term holds).
    pub fn matches(&self, name: &str, namespace: &str) -> bool {
        self.0.iter().all(|term| {
            let actual = match term.field.as_str() {
                "metadata.name" => name,
                "metadata.namespace" => namespace,
                _ => return false,
            };
            (actual == term.value) == term.equal
        })
    }
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
fn unescape_value(value: &str) -> Result<String, &'static str> {
    let mut out = String::with_capacity(value.len());
    let mut escaped = false;
    for c in value.chars() {
        match c {
            '\\' | ',' | '=' if escaped => {
                out.push(c);
                escaped = false;
            }
            _ if escaped => return Err("invalid escape sequence"),
            '\\' => escaped = true,
            ',' | '=' => return Err("unescaped reserved character"),
            _ => out.push(c),
        }
    }
    if escaped {
        Err("trailing backslash")
    } else {
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn label_selectors_match_like_kubernetes() {
        let l = labels(&[
            ("elemental.cattle.io/channel", "sl-micro"),
            ("tier", "prod"),
        ]);
        assert!(sel("").matches(&l));
        assert!(sel("elemental.cattle.io/channel=sl-micro").matches(&l));
        assert!(sel("elemental.cattle.io/channel==sl-micro,tier").matches(&l));
        assert!(!sel("elemental.cattle.io/channel!=sl-micro").matches(&l));
        assert!(
            sel("missing!=x").matches(&l),
            "!= matches when the key is absent"
        );
        assert!(sel("tier in (dev, prod)").matches(&l));
        assert!(!sel("tier notin (dev,prod)").matches(&l));
        assert!(sel("!missing").matches(&l));
        assert!(!sel("!tier").matches(&l));
        assert!(!sel("tier=dev").matches(&l));
    }

    #[test]
    fn bad_label_selectors_are_400() {
        for bad in [
            "tier in dev",
            "=x",
            "tier=(x",
            "tier in ()",
            "-bad=1",
            "a/b/c=d",
        ] {
            let e = LabelSelector::parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad} parsed"));
            assert_eq!(e.code(), 400, "{bad}");
        }
    }

    #[test]
    fn field_selectors() {
        let f = FieldSelector::parse("metadata.name=v1,metadata.namespace!=kube-system")
            .unwrap_or_default();
        assert!(f.matches("v1", "fleet-default"));
        assert!(!f.matches("v2", "fleet-default"));
        assert!(!f.matches("v1", "kube-system"));
        assert_eq!(f.exact_name(), Some("v1"));
        let unsupported = FieldSelector::parse("spec.version=1").unwrap_or_default();
        assert_eq!(
            unsupported.check_supported().err().map(|e| e.code()),
            Some(400)
        );
        for bad in ["nonsense", "metadata.name=a=b", "metadata.name=x\\"] {
            assert_eq!(
                FieldSelector::parse(bad).err().map(|e| e.code()),
                Some(400),
                "{bad}"
            );
        }
    }

    #[test]
    fn field_selector_names_follow_go() {
        let name = |s: &str| {
            FieldSelector::parse(s)
                .ok()
                .and_then(|f| f.exact_name().map(str::to_owned))
        };
        assert_eq!(name("metadata.name==v1").as_deref(), Some("v1"));
        assert_eq!(name("metadata.name!=v1"), None);
        assert_eq!(name("a=b,metadata.name=v2").as_deref(), Some("v2"));
        assert_eq!(name("metadata.name=x\\,y").as_deref(), Some("x,y"));
        // Sorted first: "metadata.name=a" < "metadata.name=b".
        assert_eq!(
            name("metadata.name=b,metadata.name=a").as_deref(),
            Some("a")
        );
        assert_eq!(name("metadata.name=x,bad"), None);
    }

    proptest! {
        #[test]
        fn parsing_never_panics(s in ".{0,64}") {
            let _ = LabelSelector::parse(&s);
            let _ = FieldSelector::parse(&s);
        }

        #[test]
        fn field_selector_values_round_trip(name in "[a-z0-9.,=\\\\-]{1,20}", other in "[a-z]{1,5}") {
            let escaped = name.replace('\\', "\\\\").replace(',', "\\,").replace('=', "\\=");
            let selector = FieldSelector::parse(&format!("{other}=x,metadata.name={escaped}")).ok();
            prop_assert_eq!(selector.as_ref().and_then(FieldSelector::exact_name), Some(name.as_str()));
        }
    }
}
