//! Liveness and readiness.
//!
//! Liveness means the process's loops are ticking: every supervised loop
//! beats regularly, and a loop that stops beating (stuck or dead) fails
//! `/livez`. It never depends on the Kubernetes API, so an API outage does not
//! get every replica restarted. Readiness means the caches are worth serving:
//! both reflectors synced and every channel seen at start had its first fetch
//! attempted (successful or not); once reached it stays, so a registry outage
//! later does not take the API away (the last good data keeps being served).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// A loop that must keep beating for the process to be alive.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    name: &'static str,
    last: Arc<AtomicU64>,
}

impl Heartbeat {
    /// Records that the loop is alive now.
    pub fn beat(&self) {
        self.last.store(now_secs(), Ordering::Relaxed);
    }
}

/// What `/livez` and `/readyz` report.
#[derive(Debug, Default)]
pub struct Health {
    beats: std::sync::Mutex<Vec<Heartbeat>>,
    checks: std::sync::Mutex<Vec<(&'static str, Arc<AtomicBool>)>>,
    latched: AtomicBool,
    shutting_down: AtomicBool,
}

/// A readiness check that some task turns on.
#[derive(Clone, Debug)]
pub struct ReadyFlag(Arc<AtomicBool>);

impl ReadyFlag {
    /// Marks this check as passed.
    pub fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The result of one check, for the verbose output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Name of the check.
    pub name: &'static str,
    /// Whether it passed.
    pub ok: bool,
}

/// How long a loop may go without beating before the process counts as dead.
pub const LIVENESS_TIMEOUT: Duration = Duration::from_secs(120);

impl Health {
    /// Registers a loop; it must call [`Heartbeat::beat`] at least every
    /// [`LIVENESS_TIMEOUT`].
    pub fn heartbeat(&self, name: &'static str) -> Heartbeat {
        let beat = Heartbeat {
            name,
            last: Arc::new(AtomicU64::new(now_secs())),
        };
        lock(&self.beats).push(beat.clone());
        beat
    }

    /// Registers a readiness check, initially failing.
    pub fn ready_flag(&self, name: &'static str) -> ReadyFlag {
        let flag = Arc::new(AtomicBool::new(false));
        lock(&self.checks).push((name, flag.clone()));
        ReadyFlag(flag)
    }

    /// The liveness checks.
    pub fn live(&self) -> Vec<Check> {
        let now = now_secs();
        lock(&self.beats)
            .iter()
            .map(|b| Check {
                name: b.name,
                ok: now.saturating_sub(b.last.load(Ordering::Relaxed))
                    <= LIVENESS_TIMEOUT.as_secs(),
            })
            .collect()
    }

    /// Fails readiness from now on (check `shutdown`, as kube-apiserver names it), so
    /// that endpoints drop this replica while it still serves.
    pub fn shut_down(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    /// The readiness checks. Once all passed together, they keep passing, until
    /// [`Health::shut_down`].
    pub fn ready(&self) -> Vec<Check> {
        let latched = self.latched.load(Ordering::Acquire);
        let checks: Vec<Check> = lock(&self.checks)
            .iter()
            .map(|(name, flag)| Check {
                name,
                ok: latched || flag.load(Ordering::Acquire),
            })
            .collect();
        if !latched && checks.iter().all(|c| c.ok) {
            self.latched.store(true, Ordering::Release);
        }
        let mut checks = checks;
        if self.shutting_down.load(Ordering::Acquire) {
            checks.push(Check {
                name: "shutdown",
                ok: false,
            });
        }
        checks
    }
}

/// Renders checks like k8s.io/apiserver's healthz: `ok` or, verbose or
/// failing, one `[+]name ok` / `[-]name failed` line per check.
pub fn render(kind: &str, checks: &[Check], verbose: bool) -> (bool, String) {
    let ok = checks.iter().all(|c| c.ok);
    if ok && !verbose {
        return (true, "ok".to_owned());
    }
    let mut out = String::new();
    for c in checks {
        if c.ok {
            out.push_str(&format!("[+]{} ok\n", c.name));
        } else {
            out.push_str(&format!("[-]{} failed: reason withheld\n", c.name));
        }
    }
    if ok {
        out.push_str(&format!("{kind} check passed\n"));
    } else {
        out.push_str(&format!("{kind} check failed\n"));
    }
    (ok, out)
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_latches_once_all_pass() {
        let h = Health::default();
        let a = h.ready_flag("a");
        let b = h.ready_flag("b");
        assert!(!render("readyz", &h.ready(), false).0);
        a.set();
        let (ok, text) = render("readyz", &h.ready(), false);
        assert!(!ok);
        assert!(text.contains("[+]a ok") && text.contains("[-]b failed"));
        b.set();
        assert_eq!(render("readyz", &h.ready(), false), (true, "ok".to_owned()));
        b.0.store(false, Ordering::Release);
        assert!(
            render("readyz", &h.ready(), false).0,
            "readiness stays once reached"
        );
    }

    #[test]
    fn a_stale_heartbeat_fails_liveness() {
        let h = Health::default();
        let beat = h.heartbeat("controller");
        assert!(render("livez", &h.live(), false).0);
        beat.last.store(
            now_secs() - LIVENESS_TIMEOUT.as_secs() - 1,
            Ordering::Relaxed,
        );
        assert!(!render("livez", &h.live(), false).0);
        beat.beat();
        assert!(render("livez", &h.live(), false).0);
    }
}
