//! Exponential backoff with jitter for API retries.

use std::time::Duration;

/// Exponential backoff: `initial · 2ⁿ` capped at `max`, each delay drawn uniformly from the
/// upper half of that value so that many publishers recovering from one outage spread out.
#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
    rng: fastrand::Rng,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial: initial.max(Duration::from_millis(1)),
            max: max.max(initial),
            attempt: 0,
            rng: fastrand::Rng::new(),
        }
    }

    /// The delay before the next retry.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(31)).unwrap_or(u32::MAX);
        let ceiling = self.initial.saturating_mul(factor).min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        let half = ceiling / 2;
        let jitter_nanos = self
            .rng
            .u64(0..=u64::try_from(half.as_nanos()).unwrap_or(u64::MAX));
        half + Duration::from_nanos(jitter_nanos)
    }

    /// Starts over after a success.
    pub(crate) fn reset(&mut self) {
        self.attempt = 0;
    }
}

impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.next_delay())
    }
}

impl kube::runtime::utils::Backoff for Backoff {
    fn reset(&mut self) {
        Backoff::reset(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_caps_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let delays: Vec<Duration> = (0..6).map(|_| backoff.next_delay()).collect();
        let ceilings = [100, 200, 400, 800, 1000, 1000];
        for (delay, ceiling) in delays.iter().zip(ceilings) {
            let ceiling = Duration::from_millis(ceiling);
            assert!(
                *delay <= ceiling && *delay >= ceiling / 2,
                "{delay:?} vs {ceiling:?}"
            );
        }
        backoff.reset();
        assert!(backoff.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn never_overflows() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
        for _ in 0..100 {
            assert!(backoff.next_delay() <= Duration::from_secs(300));
        }
    }
}
