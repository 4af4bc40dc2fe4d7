//! Per-phase timing of an end-to-end test: how long the control plane, the
//! server and each group of checks took, printed as `phase: duration` lines
//! (visible with `--nocapture`, and in a failed test's output).

use std::time::{Duration, Instant};

/// Times the phases of a run, one after the other.
#[derive(Debug)]
pub struct Phases {
    started: Instant,
    phase: Instant,
}

impl Default for Phases {
    fn default() -> Self {
        Self::start()
    }
}

impl Phases {
    /// Starts the clock of the whole run and of its first phase.
    pub fn start() -> Self {
        let now = Instant::now();
        Self {
            started: now,
            phase: now,
        }
    }

    /// Ends the current phase: prints `  <what>: <duration>` and starts the
    /// next one; returns the phase's duration.
    pub fn done(&mut self, what: &str) -> Duration {
        let took = self.phase.elapsed();
        eprintln!("  {what}: {took:?}");
        self.phase = Instant::now();
        took
    }

    /// Prints `<what> after <time since start>`; the current phase goes on.
    pub fn mark(&self, what: &str) -> Duration {
        let total = self.total();
        eprintln!("{what} after {total:?}");
        total
    }

    /// Time since [`Phases::start`].
    pub fn total(&self) -> Duration {
        self.started.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_follow_each_other() {
        let mut phases = Phases::start();
        let first = phases.done("first");
        let second = phases.done("second");
        assert!(phases.total() >= first + second);
    }
}
