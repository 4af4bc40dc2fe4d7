//! Why reading a channel image failed, as the server tells it: the registry's
//! own kind of failure ([`FetchErrorKind`]), or what is wrong with the
//! image's channel data. The cache and the metrics name failures by this
//! kind only.

use std::fmt;

use elemental_changelog_registry::FetchErrorKind;

/// Why reading a channel's image failed, reduced to a bounded set: the metric
/// label ([`ReadErrorKind::as_str`]) and the message callers see
/// ([`ReadErrorKind::public_message`]) both come from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadErrorKind {
    /// Pulling the image failed.
    Fetch(FetchErrorKind),
    /// The image has no `/channel.json`.
    MissingChannelJson,
    /// The image's `/channel.json` does not parse.
    InvalidChannelJson,
    /// The image's parsed data would take the data kept for all channels
    /// past `--max-kept-total`: checked once an image is parsed, before its
    /// data is served.
    OverKeptTotal,
    /// A parser panicked, or a pull answered with nothing.
    Internal,
}

impl From<FetchErrorKind> for ReadErrorKind {
    fn from(kind: FetchErrorKind) -> Self {
        Self::Fetch(kind)
    }
}

impl ReadErrorKind {
    /// The image has no image for the architecture asked for.
    pub const NO_MATCHING_PLATFORM: Self = Self::Fetch(FetchErrorKind::NoMatchingPlatform);

    /// A short stable name, usable as a metric label (every limit, the kept
    /// total's too, shares `limit_exceeded`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fetch(kind) => kind.as_str(),
            Self::MissingChannelJson => "missing_channel_json",
            Self::InvalidChannelJson => "invalid_channel_json",
            Self::OverKeptTotal => "limit_exceeded",
            Self::Internal => "internal",
        }
    }

    /// What callers are told, e.g. `pulling the channel image failed:
    /// registry unreachable`. It says which kind of failure it was and
    /// nothing else: no registry answer, URL, token realm or digest, which
    /// stay in the logs (and the kind in the metric label).
    pub fn public_message(self) -> String {
        let what = match self {
            Self::Fetch(kind) => kind.describe(),
            Self::MissingChannelJson => "the image has no /channel.json".to_owned(),
            Self::InvalidChannelJson => "the image's /channel.json is invalid".to_owned(),
            Self::OverKeptTotal => {
                return "the channel image's data would take the server past its limit on the \
                        data kept for all channels together (--max-kept-total)"
                    .to_owned();
            }
            Self::Internal => "internal error".to_owned(),
        };
        format!("pulling the channel image failed: {what}")
    }
}

impl fmt::Display for ReadErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use elemental_changelog_registry::Limit;

    use super::*;

    const ALL: [ReadErrorKind; 18] = [
        ReadErrorKind::Fetch(FetchErrorKind::InvalidReference),
        ReadErrorKind::Fetch(FetchErrorKind::Auth),
        ReadErrorKind::Fetch(FetchErrorKind::RegistryNotAllowed),
        ReadErrorKind::Fetch(FetchErrorKind::NotFound),
        ReadErrorKind::Fetch(FetchErrorKind::Registry),
        ReadErrorKind::Fetch(FetchErrorKind::Timeout),
        ReadErrorKind::Fetch(FetchErrorKind::NoMatchingPlatform),
        ReadErrorKind::Fetch(FetchErrorKind::Manifest),
        ReadErrorKind::Fetch(FetchErrorKind::DigestMismatch),
        ReadErrorKind::Fetch(FetchErrorKind::LimitExceeded(Limit::KeptBytes)),
        ReadErrorKind::Fetch(FetchErrorKind::LimitExceeded(Limit::MemoryBudget)),
        ReadErrorKind::Fetch(FetchErrorKind::Layer),
        ReadErrorKind::Fetch(FetchErrorKind::Internal),
        ReadErrorKind::MissingChannelJson,
        ReadErrorKind::InvalidChannelJson,
        ReadErrorKind::OverKeptTotal,
        ReadErrorKind::Internal,
        ReadErrorKind::NO_MATCHING_PLATFORM,
    ];

    /// The metric labels docs/operations.md names, unchanged since the kinds
    /// lived in one enum.
    #[test]
    fn labels() {
        let labels: std::collections::BTreeSet<&str> =
            ALL.iter().map(|kind| kind.as_str()).collect();
        assert_eq!(
            labels.into_iter().collect::<Vec<_>>(),
            [
                "auth",
                "digest_mismatch",
                "internal",
                "invalid_channel_json",
                "invalid_reference",
                "layer",
                "limit_exceeded",
                "manifest",
                "missing_channel_json",
                "no_matching_platform",
                "not_found",
                "registry",
                "registry_not_allowed",
                "timeout",
            ]
        );
        assert_eq!(ReadErrorKind::OverKeptTotal.to_string(), "limit_exceeded");
    }

    /// What callers see names the kind of failure and nothing the registry
    /// sent, each kind its own message.
    #[test]
    fn public_messages() {
        assert_eq!(
            ReadErrorKind::Fetch(FetchErrorKind::Registry).public_message(),
            "pulling the channel image failed: registry unreachable"
        );
        assert_eq!(
            ReadErrorKind::Fetch(FetchErrorKind::LimitExceeded(Limit::MemoryBudget))
                .public_message(),
            "pulling the channel image failed: the image exceeds the server's limit on memory budget (--memory-budget)"
        );
        assert_eq!(
            ReadErrorKind::OverKeptTotal.public_message(),
            "the channel image's data would take the server past its limit on the data kept for all channels together (--max-kept-total)"
        );
        let distinct: std::collections::BTreeSet<String> =
            ALL.iter().map(|kind| kind.public_message()).collect();
        // NO_MATCHING_PLATFORM is listed twice; the registry's internal errors
        // and the server's read as one, as they did when they were one kind.
        assert_eq!(distinct.len(), ALL.len() - 2);
        assert_eq!(
            ReadErrorKind::Fetch(FetchErrorKind::Internal).public_message(),
            ReadErrorKind::Internal.public_message()
        );
        for kind in ALL {
            let message = kind.public_message();
            assert!(
                message.starts_with("pulling the channel image failed: ")
                    || kind == ReadErrorKind::OverKeptTotal,
                "{message}"
            );
            for leak in ["registry.example.com", "secret", "http", "sha256", "5000"] {
                assert!(!message.contains(leak), "{message}");
            }
        }
    }
}
