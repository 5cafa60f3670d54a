//! PCI function addresses.

use core::fmt;
use core::str::FromStr;

/// The address of one PCI function: segment, bus, device (0-31), function (0-7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    /// PCI segment group (always 0 with port I/O configuration access).
    pub segment: u16,
    /// Bus number.
    pub bus: u8,
    /// Device number, 0..32.
    pub device: u8,
    /// Function number, 0..8.
    pub function: u8,
}

impl PciAddress {
    /// # Panics
    /// If `device` >= 32 or `function` >= 8.
    pub const fn new(segment: u16, bus: u8, device: u8, function: u8) -> PciAddress {
        assert!(
            device < 32 && function < 8,
            "PCI device or function out of range"
        );
        PciAddress {
            segment,
            bus,
            device,
            function,
        }
    }
}

/// `BB:DD.F`, with a `SSSS:` prefix when the segment is not 0 (lspci's format).
impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.segment != 0 {
            write!(f, "{:04x}:", self.segment)?;
        }
        write!(
            f,
            "{:02x}:{:02x}.{:x}",
            self.bus, self.device, self.function
        )
    }
}

/// Why a PCI address did not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadPciAddress;

/// Parses `[SSSS:]BB:DD.F` (hexadecimal).
impl FromStr for PciAddress {
    type Err = BadPciAddress;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (rest, function) = s.rsplit_once('.').ok_or(BadPciAddress)?;
        let mut parts = rest.rsplitn(3, ':');
        let device = parts.next().ok_or(BadPciAddress)?;
        let bus = parts.next().ok_or(BadPciAddress)?;
        let segment = parts.next().unwrap_or("0");
        let hex = |s: &str, max: u32| {
            u32::from_str_radix(s, 16)
                .ok()
                .filter(|v| *v <= max && !s.is_empty() && s.len() <= 4)
                .ok_or(BadPciAddress)
        };
        Ok(PciAddress {
            segment: hex(segment, 0xffff)? as u16,
            bus: hex(bus, 0xff)? as u8,
            device: hex(device, 31)? as u8,
            function: hex(function, 7)? as u8,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    #[test]
    fn display_and_parse_round_trip() {
        for (text, addr) in [
            ("00:04.0", PciAddress::new(0, 0, 4, 0)),
            ("ff:1f.7", PciAddress::new(0, 0xff, 0x1f, 7)),
            ("0001:02:03.1", PciAddress::new(1, 2, 3, 1)),
        ] {
            assert_eq!(text.parse::<PciAddress>(), Ok(addr));
            assert_eq!(addr.to_string(), text);
        }
        for bad in [
            "", "00:04", "04.0", "00:20.0", "00:04.8", "100:04.0", "x:04.0", ":04.0",
        ] {
            assert_eq!(bad.parse::<PciAddress>(), Err(BadPciAddress), "{bad}");
        }
    }
}
