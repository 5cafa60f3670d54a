//! PCI: addresses, configuration space, enumeration, BARs, MSI and MSI-X.
//!
//! The pure parts (decoding, enumeration, capability walking) are written against
//! [`ConfigAccess`] and tested on the host with an in-memory configuration space. On the
//! appliance, [`port_io`] implements it with ports 0xCF8/0xCFC, and [`device`] adds what
//! drivers use: a [`device::PciDevice`] handle with BAR mapping (uncached MMIO), bus
//! mastering, and MSI/MSI-X setup bound to interrupt handlers.

mod addr;
pub mod bar;
pub mod caps;
pub mod config;
mod enumerate;
pub mod ids;

#[cfg(target_os = "none")]
pub mod device;
#[cfg(target_os = "none")]
pub mod port_io;

#[cfg(test)]
mod fake;

pub use addr::{BadPciAddress, PciAddress};
pub use bar::{Bar, BarError};
pub use caps::{MsiMessage, MsixLayout};
pub use config::ConfigAccess;
pub use enumerate::{enumerate, PciFunction};
