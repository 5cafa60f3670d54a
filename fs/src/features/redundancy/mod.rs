//! Redundancy: the legs of a mirrored volume, the rebuild of a replaced leg, scrub.

pub(crate) mod legs;
pub mod rebuild;
pub mod scrub;
