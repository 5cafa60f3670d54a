//! Benchmarks the appliance runs instead of serving (`bench=...` on the command line).
//! Results go to the serial console as `bench-result: {json}` lines.

mod device;

pub use device::run as device;
