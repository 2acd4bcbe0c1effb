//! What the requests answered natively add to the gateway's `/metrics`: counts since the last
//! scrape, which the Python front adds to its own series (`gateway/metrics.py`,
//! `Metrics.add_native`) so a scraper reads one set of names whichever front answered.

use std::sync::atomic::{AtomicU64, Ordering};

/// Requests answered, their latency by bucket (the Python histogram's bounds, given at start),
/// tokens and inputs; each taken (and zeroed) at a scrape.
pub struct Stats {
    bounds: Vec<f64>,
    buckets: Vec<AtomicU64>, // one per bound, and one over the last: not cumulative
    requests: AtomicU64,
    micros: AtomicU64,
    tokens: AtomicU64,
    inputs: AtomicU64,
}

/// (requests, latency counts per bucket, latency seconds in all, tokens, inputs)
pub type Taken = (u64, Vec<u64>, f64, u64, u64);

impl Stats {
    pub fn new(bounds: Vec<f64>) -> Self {
        let buckets = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Stats {
            bounds,
            buckets,
            requests: AtomicU64::new(0),
            micros: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
            inputs: AtomicU64::new(0),
        }
    }

    pub fn record(&self, seconds: f64, tokens: usize, inputs: usize) {
        let at = self.bounds.iter().position(|&b| seconds <= b);
        let at = at.unwrap_or(self.bounds.len());
        self.buckets[at].fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.micros
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        self.tokens.fetch_add(tokens as u64, Ordering::Relaxed);
        self.inputs.fetch_add(inputs as u64, Ordering::Relaxed);
    }

    /// The counts since the last take.
    pub fn take(&self) -> Taken {
        let take = |a: &AtomicU64| a.swap(0, Ordering::Relaxed);
        (
            take(&self.requests),
            self.buckets.iter().map(take).collect(),
            take(&self.micros) as f64 / 1e6,
            take(&self.tokens),
            take(&self.inputs),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_land_in_their_bucket_and_are_taken_once() {
        let stats = Stats::new(vec![0.001, 0.01]);
        stats.record(0.0005, 3, 1);
        stats.record(0.001, 4, 2);
        stats.record(0.5, 5, 1);
        let (requests, buckets, seconds, tokens, inputs) = stats.take();
        assert_eq!(
            (requests, buckets, tokens, inputs),
            (3, vec![2, 0, 1], 12, 4)
        );
        assert!((seconds - 0.5015).abs() < 1e-6);
        assert_eq!(stats.take().0, 0);
    }
}
