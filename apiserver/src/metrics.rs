//! Prometheus metrics: the process's [`Registry`], and how a module declares what it counts.
//!
//! Each module declares its own families next to the code that counts, with `family!`:
//! a struct whose every field is one metric, written once (name, help text, labels, and
//! buckets for a histogram), and its [`Family`] registration. `main` registers each family
//! once and hands it to the code that counts; `/metrics` encodes the registry. Every label
//! value is a bounded enum of the module that counts (or a Kubernetes object key that leaves
//! with its object), never an error string.

use std::sync::Arc;

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, TextEncoder, core::Collector, proto::MetricFamily,
};

/// The prefix of every metric name.
const NAMESPACE: &str = "elemental_changelog";

/// The registry of every metric of the process: what `/metrics` shows.
#[derive(Clone, Default)]
pub struct Registry(prometheus::Registry);

/// Metrics a module declares and registers together, declared with `family!`. A registry
/// holds each family once (registering it again is a bug: the names are taken), so the code
/// that counts shares it (`Arc`).
pub trait Family: Sized {
    /// Creates the family's metrics and registers them in `registry`.
    fn register(registry: &Registry) -> Self;
}

impl Registry {
    /// Registers the family `F`, to be shared by the code that counts it.
    pub fn register<F: Family>(&self) -> Arc<F> {
        Arc::new(F::register(self))
    }

    /// Creates and registers one metric (used by [`family!`]). The definitions are static,
    /// so a failure is a bug of the program (a bad name, a name registered twice), found by
    /// the test that registers every family.
    pub(crate) fn metric<M: Metric>(&self, definition: &Definition) -> M {
        let name = definition.name;
        let metric =
            M::new(definition).unwrap_or_else(|e| unreachable!("metric definition {name}: {e}"));
        self.0
            .register(Box::new(metric.clone()))
            .unwrap_or_else(|e| unreachable!("metric {name} registered twice: {e}"));
        metric
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> Vec<u8> {
        encode(&self.0.gather())
    }
}

/// The text exposition of `families`.
fn encode(families: &[MetricFamily]) -> Vec<u8> {
    let mut out = Vec::new();
    // Encoding into a Vec cannot fail for the text format.
    let _ = TextEncoder::new().encode(families, &mut out);
    out
}

/// The text exposition of one family's metrics, as [`Registry::encode`] shows them (for tests
/// of one family, used by [`family!`]).
#[cfg(test)]
pub(crate) fn encode_alone(collectors: &[&dyn Collector]) -> Vec<u8> {
    let mut families: Vec<MetricFamily> = collectors
        .iter()
        .flat_map(|c| c.collect())
        .filter(|f| !f.get_metric().is_empty())
        .collect();
    families.sort_by(|a, b| a.name().cmp(b.name()));
    encode(&families)
}

/// One metric as [`family!`] declares it.
#[derive(Debug)]
pub(crate) struct Definition {
    /// The name, without the `elemental_changelog_` prefix.
    pub name: &'static str,
    /// The help text.
    pub help: &'static str,
    /// The label names; none for a single series.
    pub labels: &'static [&'static str],
    /// A histogram's bucket bounds.
    pub buckets: &'static [f64],
}

impl Definition {
    fn opts(&self) -> Opts {
        Opts::new(self.name, self.help).namespace(NAMESPACE)
    }

    /// A single series must not be declared with labels.
    fn unlabelled(&self) -> prometheus::Result<Opts> {
        if self.labels.is_empty() {
            Ok(self.opts())
        } else {
            Err(prometheus::Error::Msg(format!(
                "{} is a single series but declares labels {:?}",
                self.name, self.labels
            )))
        }
    }
}

/// A kind of metric a [`family!`] field may be.
pub(crate) trait Metric: Collector + Clone + Sized + 'static {
    /// The metric `definition` declares.
    fn new(definition: &Definition) -> prometheus::Result<Self>;
}

impl Metric for IntCounter {
    fn new(definition: &Definition) -> prometheus::Result<Self> {
        Self::with_opts(definition.unlabelled()?)
    }
}

impl Metric for IntGauge {
    fn new(definition: &Definition) -> prometheus::Result<Self> {
        Self::with_opts(definition.unlabelled()?)
    }
}

impl Metric for IntCounterVec {
    fn new(definition: &Definition) -> prometheus::Result<Self> {
        Self::new(definition.opts(), definition.labels)
    }
}

impl Metric for IntGaugeVec {
    fn new(definition: &Definition) -> prometheus::Result<Self> {
        Self::new(definition.opts(), definition.labels)
    }
}

impl Metric for GaugeVec {
    fn new(definition: &Definition) -> prometheus::Result<Self> {
        Self::new(definition.opts(), definition.labels)
    }
}

impl Metric for HistogramVec {
    fn new(definition: &Definition) -> prometheus::Result<Self> {
        let opts = HistogramOpts::new(definition.name, definition.help)
            .namespace(NAMESPACE)
            .buckets(definition.buckets.to_vec());
        Self::new(opts, definition.labels)
    }
}

/// Declares a family of metrics: a struct with one field per metric and its [`Family`]
/// registration. Each field is written once, as
/// `name: Kind = metric(NAME, HELP, &[LABELS])`, the labels left out for a single series and a
/// histogram's bounds following as `.buckets(&[…])`; the name goes without the
/// `elemental_changelog_` prefix. `Kind` is one of the metric types that implement
/// [`Metric`] (`IntCounter`, `IntCounterVec`, `IntGauge`, `IntGaugeVec`, `GaugeVec`,
/// `HistogramVec`). `integration/tests/docs.rs` reads these declarations to check them
/// against the metrics table of `docs/operations.md`.
macro_rules! family {
    (
        $(#[$attr:meta])*
        $vis:vis struct $family:ident {
            $(
                $field:ident: $kind:ty = metric(
                    $name:literal,
                    $help:literal
                    $(, &[$($label:literal),* $(,)?])?
                    $(,)?
                ) $(.buckets(&[$($bucket:literal),* $(,)?]))?
            ),* $(,)?
        }
    ) => {
        $(#[$attr])*
        $vis struct $family {
            $($field: $kind,)*
        }

        impl $crate::metrics::Family for $family {
            fn register(registry: &$crate::metrics::Registry) -> Self {
                Self {
                    $($field: registry.metric(&$crate::metrics::Definition {
                        name: $name,
                        help: $help,
                        labels: &[$($($label),*)?],
                        buckets: &[$($($bucket),*)?],
                    }),)*
                }
            }
        }

        #[cfg(test)]
        #[allow(dead_code)]
        impl $family {
            /// This family's metrics alone, as `/metrics` shows them.
            pub(crate) fn encode(&self) -> Vec<u8> {
                $crate::metrics::encode_alone(&[$(&self.$field),*])
            }
        }
    };
}
pub(crate) use family;

/// A count as a gauge value (saturating: a count never exceeds `i64::MAX` in practice).
pub fn gauge_value(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
