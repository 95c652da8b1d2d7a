//! A stream's inter-token latency, timed from its response chunks.

/// Chunks of one streamed response: how many, and when the first and last arrived (µs).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ItlTimer {
    chunks: u32,
    first_us: u64,
    last_us: u64,
}

impl ItlTimer {
    /// A non-empty chunk arrived at `now_us`.
    pub fn on_chunk(&mut self, now_us: u64) {
        if self.chunks == 0 {
            self.first_us = now_us;
        }
        self.last_us = now_us;
        self.chunks = self.chunks.saturating_add(1);
    }

    /// From the first chunk to the last, once at least three arrived (`None` before): how long
    /// the stream decoded, most of the time its request held one of the pod's seats.
    pub fn span_ms(&self) -> Option<f64> {
        (self.chunks >= 3).then(|| self.last_us.saturating_sub(self.first_us) as f64 / 1e3)
    }

    /// The mean time between chunks, once at least three arrived (`None` before).
    pub fn itl_ms(&self) -> Option<f64> {
        (self.chunks >= 3).then(|| {
            let span_us = self.last_us.saturating_sub(self.first_us);
            span_us as f64 / 1e3 / f64::from(self.chunks - 1)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_chunks_are_timed_and_two_are_not() {
        let mut t = ItlTimer::default();
        t.on_chunk(1_000);
        t.on_chunk(21_000);
        assert_eq!(t.itl_ms(), None);
        t.on_chunk(41_000);
        assert_eq!(t.itl_ms(), Some(20.0));
        assert_eq!(t.span_ms(), Some(40.0));
    }
}
