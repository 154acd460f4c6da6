//! The pseudo-random generator of tests and benchmarks: xorshift64 (Marsaglia, 2003). Fast,
//! reproducible from a seed, and not for anything secret (the codec's keys and nonces come
//! from the operating system).

/// A xorshift64 generator. The same seed gives the same sequence.
#[derive(Clone, Debug)]
pub struct XorShift64(u64);

impl XorShift64 {
    /// A generator from `seed` (any value: a zero seed is replaced, as xorshift would stay at 0).
    pub fn new(seed: u64) -> XorShift64 {
        XorShift64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// A generator whose state is `state` as given (nonzero): the sequence a hand-written
    /// xorshift64 started at `state` produces, for code that must keep its sequence.
    pub fn from_state(state: u64) -> XorShift64 {
        assert_ne!(state, 0, "xorshift64 stays at 0 from a zero state");
        XorShift64(state)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in `0..n` (`n` > 0; the slight bias of the modulo is no matter for tests).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let word = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_sequence_and_another_seed_another() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = XorShift64::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let mut r = XorShift64::new(7);
        assert_eq!(a, (0..4).map(|_| r.next_u64()).collect::<Vec<_>>());
        assert_ne!(a[0], XorShift64::new(8).next_u64());
        assert_ne!(XorShift64::new(0).next_u64(), 0);
        // from_state continues a hand-written xorshift64 exactly.
        let mut x = 5u64;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        assert_eq!(XorShift64::from_state(5).next_u64(), x);
    }

    #[test]
    fn fill_covers_every_byte_and_below_stays_below() {
        let mut r = XorShift64::new(1);
        let mut buf = [0u8; 4099];
        r.fill(&mut buf);
        assert!(buf[4090..].iter().any(|&b| b != 0));
        assert!((0..1000).all(|_| r.below(10) < 10));
    }
}
