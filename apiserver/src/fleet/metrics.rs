//! What the fleet view counts: its machines by state and pending severity.

use std::collections::BTreeMap;

use prometheus::IntGaugeVec;

use crate::metrics::family;

family! {
    /// The fleet view's metrics.
    pub struct FleetMetrics {
        machines: IntGaugeVec = metric(
            "machines",
            "MachineInventories of the fleet view, by namespace, state (UpToDate, UpdatesAvailable, Unknown) and highest severity of the pending changelog (none without one).",
            &["namespace", "state", "severity"],
        ),
    }
}

impl FleetMetrics {
    /// Sets the machines gauge to `counts` (by namespace, state and severity); series not in
    /// `counts` are dropped.
    pub fn set_machines(&self, counts: &BTreeMap<(String, String, String), i64>) {
        self.machines.reset();
        for ((namespace, state, severity), n) in counts {
            self.machines
                .with_label_values(&[namespace.as_str(), state.as_str(), severity.as_str()])
                .set(*n);
        }
    }
}
