//! Content negotiation for resource requests: plain JSON or a `meta.k8s.io`
//! `Table` (what `kubectl get` asks for), from the `Accept` header and the
//! `includeObject` query parameter.

use crate::status::StatusError;

/// Media type of plain JSON.
pub const JSON: &str = "application/json";
/// Response `Content-Type` of a `meta.k8s.io/v1` Table.
pub const TABLE_V1: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
/// Response `Content-Type` of a `meta.k8s.io/v1beta1` Table.
pub const TABLE_V1BETA1: &str = "application/json;as=Table;v=v1beta1;g=meta.k8s.io";

/// Media types listed in a 406 answer.
const ACCEPTED: [&str; 3] = [JSON, TABLE_V1, TABLE_V1BETA1];

/// One media range of an `Accept` header, parameters lower-cased by name.
#[derive(Clone, Debug, PartialEq)]
pub struct MediaRange {
    /// Type (`application`, `*`), lower case.
    pub type_: String,
    /// Subtype (`json`, `*`), lower case.
    pub subtype: String,
    /// Parameters other than `q`, in order, names lower case, values unquoted.
    pub params: Vec<(String, String)>,
    /// Quality, 0.0 to 1.0.
    pub q: f32,
}

impl MediaRange {
    /// The value of parameter `name` (lower case), if present.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// True when this range covers `application/json`.
    pub fn covers_json(&self) -> bool {
        (self.type_ == "application" || self.type_ == "*")
            && (self.subtype == "json" || self.subtype == "*")
    }

    fn specificity(&self) -> u8 {
        u8::from(self.type_ != "*") + u8::from(self.subtype != "*")
    }
}

/// Parses an `Accept` header into media ranges, most preferred first: by `q`
/// (ranges with `q=0` dropped), then wildcards last, then in header order, as
/// kube-apiserver's `goautoneg` does (parameters do not make a range more
/// specific).
/// Malformed ranges are skipped; this never fails.
pub fn parse_accept(header: &str) -> Vec<MediaRange> {
    let mut ranges: Vec<MediaRange> = split_unquoted(header, ',')
        .into_iter()
        .filter_map(parse_range)
        .filter(|r| r.q > 0.0)
        .collect();
    // Stable: equal ranges keep the client's order.
    ranges.sort_by(|a, b| {
        b.q.total_cmp(&a.q)
            .then_with(|| b.specificity().cmp(&a.specificity()))
    });
    ranges
}

/// Splits on `sep` outside double-quoted strings.
fn split_unquoted(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if quoted && c == '\\' {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
        } else if c == sep && !quoted {
            parts.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    parts.push(&s[start..]);
    parts
}

fn unquote(v: &str) -> String {
    let v = v.trim();
    match v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(inner) => {
            let mut out = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                if c == '\\' {
                    if let Some(n) = chars.next() {
                        out.push(n);
                    }
                } else {
                    out.push(c);
                }
            }
            out
        }
        None => v.to_owned(),
    }
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn parse_range(raw: &str) -> Option<MediaRange> {
    let mut pieces = split_unquoted(raw, ';').into_iter();
    let media = pieces.next()?.trim();
    let (type_, subtype) = media.split_once('/')?;
    let (type_, subtype) = (type_.trim(), subtype.trim());
    if !is_token(type_) || !is_token(subtype) || (type_ == "*" && subtype != "*") {
        return None;
    }
    let mut range = MediaRange {
        type_: type_.to_ascii_lowercase(),
        subtype: subtype.to_ascii_lowercase(),
        params: Vec::new(),
        q: 1.0,
    };
    for piece in pieces {
        let piece = piece.trim();
        if piece.is_empty() {
            continue;
        }
        let (name, value) = piece.split_once('=')?;
        let name = name.trim().to_ascii_lowercase();
        if !is_token(&name) {
            return None;
        }
        if name == "q" {
            let q: f32 = value.trim().parse().ok()?;
            if !(0.0..=1.0).contains(&q) {
                return None;
            }
            range.q = q;
        } else {
            range.params.push((name, unquote(value)));
        }
    }
    Some(range)
}

/// Version of `meta.k8s.io` a Table is served in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TableVersion {
    /// `meta.k8s.io/v1`.
    V1,
    /// `meta.k8s.io/v1beta1` (same shape; older kubectl).
    V1Beta1,
}

impl TableVersion {
    /// `meta.k8s.io/<version>`.
    pub fn api_version(self) -> &'static str {
        match self {
            Self::V1 => "meta.k8s.io/v1",
            Self::V1Beta1 => "meta.k8s.io/v1beta1",
        }
    }

    /// Response `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::V1 => TABLE_V1,
            Self::V1Beta1 => TABLE_V1BETA1,
        }
    }
}

/// `includeObject`: what each Table row carries in `object`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IncludeObject {
    /// No object.
    None,
    /// A `PartialObjectMetadata` (the default).
    #[default]
    Metadata,
    /// The full object.
    Object,
}

impl IncludeObject {
    /// Parses the `includeObject` query value (`None`, `Metadata`, `Object`;
    /// empty means the default).
    pub fn parse(value: &str) -> Result<Self, StatusError> {
        match value {
            "" | "Metadata" => Ok(Self::Metadata),
            "None" => Ok(Self::None),
            "Object" => Ok(Self::Object),
            other => Err(StatusError::bad_request(format!(
                "includeObject: Unsupported value: \"{}\": supported values: \"None\", \"Metadata\", \"Object\"",
                other.escape_default()
            ))),
        }
    }
}

/// How to represent the answer to a resource request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Representation {
    /// The object (or list) as JSON.
    Json,
    /// A `Table` of it.
    Table {
        /// `meta.k8s.io` version of the Table.
        version: TableVersion,
        /// What rows carry.
        include_object: IncludeObject,
    },
}

impl Representation {
    /// Response `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Json => JSON,
            Self::Table { version, .. } => version.content_type(),
        }
    }
}

/// What one media range asks for, if we can serve it.
fn representation_of(range: &MediaRange, include_object: IncludeObject) -> Option<Representation> {
    if !range.covers_json() {
        return None;
    }
    match range.param("as") {
        None => Some(Representation::Json),
        Some("Table") => {
            if range.param("g") != Some("meta.k8s.io") {
                return None;
            }
            let version = match range.param("v") {
                Some("v1") => TableVersion::V1,
                Some("v1beta1") => TableVersion::V1Beta1,
                _ => return None,
            };
            Some(Representation::Table {
                version,
                include_object,
            })
        }
        Some(_) => None,
    }
}

/// Picks the representation for a resource request. No `Accept`, an empty
/// one, `*/*` and `application/*` mean JSON. A header naming only types we
/// cannot produce (protobuf, YAML, other `as=` conversions) is a 406.
pub fn negotiate(
    accept: Option<&str>,
    include_object: IncludeObject,
) -> Result<Representation, StatusError> {
    let Some(header) = accept.filter(|h| !h.trim().is_empty()) else {
        return Ok(Representation::Json);
    };
    parse_accept(header)
        .iter()
        .find_map(|r| representation_of(r, include_object))
        .ok_or_else(|| StatusError::not_acceptable(&ACCEPTED))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const KUBECTL: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

    fn table(version: TableVersion) -> Representation {
        Representation::Table {
            version,
            include_object: IncludeObject::Metadata,
        }
    }

    #[test]
    fn kubectl_get_gets_a_v1_table() {
        assert_eq!(
            negotiate(Some(KUBECTL), IncludeObject::Metadata),
            Ok(table(TableVersion::V1))
        );
        assert_eq!(table(TableVersion::V1).content_type(), TABLE_V1);
    }

    #[test]
    fn old_kubectl_gets_a_v1beta1_table() {
        let accept = "application/json;as=Table;v=v1beta1;g=meta.k8s.io, application/json";
        assert_eq!(
            negotiate(Some(accept), IncludeObject::Metadata),
            Ok(table(TableVersion::V1Beta1))
        );
    }

    #[test]
    fn defaults_are_json() {
        for accept in [
            None,
            Some(""),
            Some("  "),
            Some("*/*"),
            Some("application/*"),
            Some("application/json"),
        ] {
            assert_eq!(
                negotiate(accept, IncludeObject::Metadata),
                Ok(Representation::Json),
                "{accept:?}"
            );
        }
    }

    #[test]
    fn protobuf_only_is_406() {
        let err = negotiate(
            Some("application/vnd.kubernetes.protobuf"),
            IncludeObject::Metadata,
        )
        .unwrap_err();
        assert_eq!(err.code(), 406);
        let err = negotiate(
            Some("application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io"),
            IncludeObject::Metadata,
        )
        .unwrap_err();
        assert_eq!(err.code(), 406);
        assert_eq!(
            negotiate(Some("application/yaml"), IncludeObject::Metadata)
                .unwrap_err()
                .code(),
            406
        );
    }

    #[test]
    fn protobuf_first_falls_back_to_json() {
        let accept = "application/vnd.kubernetes.protobuf,application/json";
        assert_eq!(
            negotiate(Some(accept), IncludeObject::Metadata),
            Ok(Representation::Json)
        );
    }

    #[test]
    fn unsupported_conversions_are_skipped() {
        let accept =
            "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json";
        assert_eq!(
            negotiate(Some(accept), IncludeObject::Metadata),
            Ok(Representation::Json)
        );
        let accept = "application/json;as=Table;v=v2;g=meta.k8s.io";
        assert_eq!(
            negotiate(Some(accept), IncludeObject::Metadata)
                .unwrap_err()
                .code(),
            406
        );
        let accept = "application/json;as=Table;v=v1;g=example.com";
        assert_eq!(
            negotiate(Some(accept), IncludeObject::Metadata)
                .unwrap_err()
                .code(),
            406
        );
    }

    #[test]
    fn q_values_order_and_exclude() {
        let accept = "application/json;q=0.5, application/json;as=Table;v=v1;g=meta.k8s.io";
        assert_eq!(
            negotiate(Some(accept), IncludeObject::Metadata),
            Ok(table(TableVersion::V1))
        );
        let accept = "application/json;as=Table;v=v1;g=meta.k8s.io;q=0.2, application/json;q=0.9";
        assert_eq!(
            negotiate(Some(accept), IncludeObject::Metadata),
            Ok(Representation::Json)
        );
        let accept = "application/json;q=0";
        assert_eq!(
            negotiate(Some(accept), IncludeObject::Metadata)
                .unwrap_err()
                .code(),
            406
        );
        // Invalid q: that range is ignored.
        let accept = "application/json;as=Table;v=v1;g=meta.k8s.io;q=abc,application/json";
        assert_eq!(
            negotiate(Some(accept), IncludeObject::Metadata),
            Ok(Representation::Json)
        );
    }

    #[test]
    fn parameters_are_case_insensitive_by_name_and_may_be_quoted() {
        let accept = "Application/JSON; AS=Table; V=\"v1\"; G=meta.k8s.io";
        assert_eq!(
            negotiate(Some(accept), IncludeObject::Metadata),
            Ok(table(TableVersion::V1))
        );
    }

    #[test]
    fn include_object() {
        let r = negotiate(Some(KUBECTL), IncludeObject::Object).unwrap();
        assert_eq!(
            r,
            Representation::Table {
                version: TableVersion::V1,
                include_object: IncludeObject::Object
            }
        );
        assert_eq!(IncludeObject::parse("None"), Ok(IncludeObject::None));
        assert_eq!(IncludeObject::parse(""), Ok(IncludeObject::Metadata));
        assert_eq!(IncludeObject::parse("All").unwrap_err().code(), 400);
        assert_eq!(
            negotiate(None, IncludeObject::Object),
            Ok(Representation::Json)
        );
    }

    #[test]
    fn parse_accept_orders_by_q_then_specificity() {
        let ranges =
            parse_accept("*/*;q=0.8, text/*, text/plain, text/plain;format=flowed, bad, x/y;q=2");
        let names: Vec<String> = ranges
            .iter()
            .map(|r| format!("{}/{}:{}", r.type_, r.subtype, r.params.len()))
            .collect();
        assert_eq!(names, ["text/plain:0", "text/plain:1", "text/*:0", "*/*:0"]);
    }

    #[test]
    fn quoted_commas_do_not_split() {
        let ranges = parse_accept("application/json;x=\"a,b\";as=Table;v=v1;g=meta.k8s.io");
        assert_eq!(ranges.len(), 1);
        assert_eq!(ranges[0].param("x"), Some("a,b"));
    }

    proptest! {
        #[test]
        fn negotiate_never_panics(accept in ".{0,200}", include in proptest::option::of(".{0,20}")) {
            let include = IncludeObject::parse(include.as_deref().unwrap_or_default()).unwrap_or_default();
            let _ = negotiate(Some(&accept), include);
        }

        #[test]
        fn negotiate_never_panics_on_structured_headers(
            parts in proptest::collection::vec(
                ("(application|text|\\*)", "(json|\\*|yaml|vnd.kubernetes.protobuf)",
                 proptest::collection::vec(("(as|v|g|q|x)", "(Table|v1|v1beta1|meta.k8s.io|0|0.5|1|\"a,b\"|)"), 0..4)),
                0..5)
        ) {
            let header = parts
                .iter()
                .map(|(t, s, ps)| {
                    let mut r = format!("{t}/{s}");
                    for (k, v) in ps {
                        r.push_str(&format!(";{k}={v}"));
                    }
                    r
                })
                .collect::<Vec<_>>()
                .join(",");
            if let Ok(r) = negotiate(Some(&header), IncludeObject::Metadata) {
                prop_assert!(!r.content_type().is_empty());
            }
        }
    }
}
