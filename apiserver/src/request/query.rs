//! The query string, read as Go's `url.ParseQuery` reads it: `&`-separated `key=value`
//! pairs, form-unescaped (`+` is a space); pairs holding `;` or a malformed escape are
//! skipped. A repeated key counts with its first value, as `url.Values.Get` returns it.

/// The decoded pairs of a query string, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueryValues(Vec<(String, String)>);

impl QueryValues {
    /// Parses a raw query string (without the `?`).
    pub fn parse(query: &str) -> Self {
        Self(
            query
                .split('&')
                .filter(|pair| !pair.is_empty() && !pair.contains(';'))
                .filter_map(|pair| {
                    let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                    let key = unescape(key, true)?;
                    let value = unescape(value, true)?;
                    Some((
                        String::from_utf8_lossy(&key).into_owned(),
                        String::from_utf8_lossy(&value).into_owned(),
                    ))
                })
                .collect(),
        )
    }

    /// The first value of `key`, as Go's `url.Values.Get` (`None` when absent; an empty
    /// value is `Some("")`).
    pub fn first(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether `key` is present, with any value.
    pub fn has(&self, key: &str) -> bool {
        self.0.iter().any(|(k, _)| k == key)
    }

    /// Every pair, in order.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.0
    }
}

/// Go's `url.PathUnescape` (`plus_is_space` false) or `url.QueryUnescape` (true): `%XX`
/// decoded; `None` when a `%` is not followed by two hex digits.
pub(crate) fn unescape(text: &str, plus_is_space: bool) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&byte) = bytes.get(i) {
        match byte {
            b'%' => {
                let high = hex(*bytes.get(i + 1)?)?;
                let low = hex(*bytes.get(i + 2)?)?;
                out.push(high << 4 | low);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(byte);
                i += 1;
            }
        }
    }
    Some(out)
}

fn hex(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|value| u8::try_from(value).ok())
}
