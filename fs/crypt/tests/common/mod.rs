//! What the crate's tests share.

use crypt::{Entropy, NoEntropy};

/// A deterministic byte stream standing in for the appliance's entropy.
pub struct TestEntropy(pub u64);

impl Entropy for TestEntropy {
    fn fill(&mut self, dest: &mut [u8]) -> Result<(), NoEntropy> {
        for b in dest {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *b = (self.0 >> 56) as u8;
        }
        Ok(())
    }
}
