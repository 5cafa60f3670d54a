//! ninefold's metrics for monitoring systems: latency histograms with fixed buckets
//! ([`histogram`], also one several CPUs record into), the Prometheus text exposition format ([`text`]), and the walk that
//! turns a counters document — the JSON the appliance's counter sets serialise to —
//! into that format ([`document`], feature `json`, by [`rule`]s each part of a document
//! defines), and the counters endpoint's protocol ([`endpoint`]).
//!
//! `no_std + alloc`, pure and host-tested: the appliance's counters port and the host
//! tools use the same code.

#![no_std]
#![warn(missing_docs)]

extern crate alloc;
#[cfg(feature = "promtool")]
extern crate std;

#[cfg(feature = "json")]
pub mod document;
pub mod endpoint;
pub mod histogram;
pub mod parse;
#[cfg(feature = "promtool")]
pub mod promtool;
pub mod rule;
pub mod text;

pub use histogram::{LatencyHistogram, SharedLatencyHistogram};
