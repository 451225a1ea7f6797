//! What the benches of every crate share: criterion reports the mean of a batch of iterations;
//! a latency budget is stated in percentiles, which these helpers measure next to it.
//!
//! ```
//! use std::time::Duration;
//! use dra_sdk_testing::bench::Latencies;
//!
//! let latencies = Latencies::new((1..=100).map(Duration::from_millis).collect());
//! assert_eq!(latencies.at(0.5), Duration::from_millis(50));
//! assert_eq!(latencies.at(0.99), Duration::from_millis(99));
//! assert_eq!(latencies.to_string(), "p50 50ms, p99 99ms (100 rounds)");
//! ```

use std::fmt;
use std::time::Duration;

use tokio::sync::Mutex;

/// Latency samples, sorted.
#[derive(Clone, Debug)]
pub struct Latencies {
    sorted: Vec<Duration>,
}

impl Latencies {
    /// The samples, in any order.
    pub fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort();
        Self { sorted: samples }
    }

    /// The `p` quantile (`0.5` for p50), nearest rank below; zero without samples.
    pub fn at(&self, p: f64) -> Duration {
        let Some(last) = self.sorted.len().checked_sub(1) else {
            return Duration::ZERO;
        };
        // The rank is at most `last`: a float in 0..=1 times it, truncated.
        let rank = (last as f64 * p.clamp(0.0, 1.0)) as usize;
        self.sorted[rank.min(last)]
    }

    /// How many samples there are.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }
}

/// `p50 <d>, p99 <d> (<n> rounds)`.
impl fmt::Display for Latencies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "p50 {:?}, p99 {:?} ({} rounds)",
            self.at(0.5),
            self.at(0.99),
            self.len()
        )
    }
}

/// Runs `step` on the bench `iterations` times, one after the other, and adds up the durations
/// it measured: the body of a criterion `iter_custom` whose step times itself (so that set-up
/// inside the step is left out).
pub async fn total_time<B>(
    bench: &Mutex<B>,
    iterations: u64,
    mut step: impl AsyncFnMut(&mut B) -> Duration,
) -> Duration {
    let mut bench = bench.lock().await;
    let mut total = Duration::ZERO;
    for _ in 0..iterations {
        total += step(&mut bench).await;
    }
    total
}

/// Runs `step` on the bench `rounds` times, one after the other, and keeps each duration it
/// measured: the percentiles criterion does not print.
pub async fn sample<B>(
    bench: &Mutex<B>,
    rounds: usize,
    mut step: impl AsyncFnMut(&mut B) -> Duration,
) -> Latencies {
    let mut bench = bench.lock().await;
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        samples.push(step(&mut bench).await);
    }
    Latencies::new(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_take_the_nearest_rank_below() {
        let latencies = Latencies::new(vec![
            Duration::from_millis(30),
            Duration::from_millis(10),
            Duration::from_millis(20),
        ]);
        assert_eq!(latencies.at(0.0), Duration::from_millis(10));
        assert_eq!(latencies.at(0.5), Duration::from_millis(20));
        assert_eq!(latencies.at(0.9), Duration::from_millis(20));
        assert_eq!(latencies.at(1.0), Duration::from_millis(30));
        assert_eq!(Latencies::new(Vec::new()).at(0.5), Duration::ZERO);
    }

    #[tokio::test]
    async fn the_steps_run_on_the_bench_in_turn() {
        let bench = Mutex::new(0u64);
        let step = async |count: &mut u64| {
            *count += 1;
            Duration::from_millis(*count)
        };
        assert_eq!(total_time(&bench, 3, step).await, Duration::from_millis(6));
        let latencies = sample(&bench, 2, step).await;
        assert_eq!(latencies.len(), 2);
        assert_eq!(latencies.at(1.0), Duration::from_millis(5));
    }
}
