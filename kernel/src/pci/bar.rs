//! Base address registers: decoding and sizing.

use core::fmt;

use super::config::{regs, ConfigAccess};
use super::PciAddress;

/// A decoded base address register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bar {
    /// A memory BAR: MMIO at `addr..addr + size`.
    Memory {
        /// Physical base address.
        addr: u64,
        /// Size in bytes (a power of two).
        size: u64,
        /// Reads have no side effects (may be mapped write-combining; we map uncached).
        prefetchable: bool,
        /// A 64-bit BAR (it occupies this register and the next).
        is_64bit: bool,
    },
    /// An I/O-port BAR.
    Io {
        /// First port.
        port: u16,
        /// Number of ports.
        size: u16,
    },
}

impl fmt::Display for Bar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Bar::Memory {
                addr,
                size,
                prefetchable,
                is_64bit,
            } => write!(
                f,
                "mem {addr:#x} size {size:#x}{}{}",
                if is_64bit { " 64-bit" } else { "" },
                if prefetchable { " prefetchable" } else { "" }
            ),
            Bar::Io { port, size } => write!(f, "io {port:#x} size {size:#x}"),
        }
    }
}

/// Why a BAR could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarError {
    /// Index beyond BAR5 (or BAR1 of a bridge).
    NoSuchBar,
    /// The register is the upper half of the 64-bit BAR before it.
    UpperHalf,
    /// The device does not implement this BAR (sizes to zero).
    Unimplemented,
    /// A 64-bit BAR in the last register, or a reserved memory type.
    Malformed,
}

/// Size of a 32-bit memory or I/O BAR from what it reads back after writing all ones.
/// `addr_mask` clears the flag bits: `!0xf` for memory, `!0x3` for I/O.
pub fn size_from_readback(readback: u32, addr_mask: u32) -> u64 {
    let bits = readback & addr_mask;
    if bits == 0 {
        return 0;
    }
    u64::from(!bits) + 1
}

/// Size of a 64-bit memory BAR from the two halves read back after writing all ones.
pub fn size_from_readback64(low: u32, high: u32) -> u64 {
    let bits = (u64::from(high) << 32) | u64::from(low & !0xf);
    if bits == 0 {
        return 0;
    }
    (!bits).wrapping_add(1)
}

/// Reads and sizes BAR `index` of `addr`. Sizing writes all ones to the register, so the
/// device's decoding is switched off meanwhile and restored after.
pub fn read_bar(
    access: &impl ConfigAccess,
    addr: PciAddress,
    index: u8,
    bar_count: u8,
) -> Result<Bar, BarError> {
    if index >= bar_count {
        return Err(BarError::NoSuchBar);
    }
    // Walk from BAR0 so we know whether `index` is the upper half of a 64-bit BAR.
    let mut i = 0;
    while i < index {
        let raw = access.read32(addr, regs::BAR0 + 4 * u16::from(i));
        i += if raw & 1 == 0 && (raw >> 1) & 3 == 2 {
            2
        } else {
            1
        };
    }
    if i != index {
        return Err(BarError::UpperHalf);
    }
    let offset = regs::BAR0 + 4 * u16::from(index);
    let raw = access.read32(addr, offset);
    let command = access.read16(addr, regs::COMMAND);
    access.write16(
        addr,
        regs::COMMAND,
        command & !(regs::CMD_IO | regs::CMD_MEMORY),
    );
    let probe = |off: u16| {
        let old = access.read32(addr, off);
        access.write32(addr, off, u32::MAX);
        let back = access.read32(addr, off);
        access.write32(addr, off, old);
        back
    };
    let result = if raw & 1 == 1 {
        let size = size_from_readback(probe(offset) | 0xffff_0000, !0x3);
        Ok(Bar::Io {
            port: (raw & 0xfffc) as u16,
            size: size.min(0x1_0000) as u16,
        })
    } else {
        let prefetchable = raw & 0x8 != 0;
        match (raw >> 1) & 3 {
            0 => Ok(Bar::Memory {
                addr: u64::from(raw & !0xf),
                size: size_from_readback(probe(offset), !0xf),
                prefetchable,
                is_64bit: false,
            }),
            2 if index + 1 < bar_count => {
                let high = access.read32(addr, offset + 4);
                let size = size_from_readback64(probe(offset), probe(offset + 4));
                Ok(Bar::Memory {
                    addr: (u64::from(high) << 32) | u64::from(raw & !0xf),
                    size,
                    prefetchable,
                    is_64bit: true,
                })
            }
            _ => Err(BarError::Malformed),
        }
    };
    access.write16(addr, regs::COMMAND, command);
    match result {
        Ok(Bar::Memory { size: 0, .. }) | Ok(Bar::Io { size: 0, .. }) => {
            Err(BarError::Unimplemented)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::{FakeConfig, FakeFunction};
    use super::*;

    #[test]
    fn sizes_from_readback() {
        assert_eq!(size_from_readback(0xffff_f000, !0xf), 0x1000);
        assert_eq!(size_from_readback(0xfff0_0008, !0xf), 0x10_0000);
        assert_eq!(size_from_readback(0xffff_ffe1, !0x3), 0x20);
        assert_eq!(size_from_readback(0, !0xf), 0);
        assert_eq!(size_from_readback64(0xffff_c00c, 0xffff_ffff), 0x4000);
        assert_eq!(
            size_from_readback64(0x0000_000c, 0xffff_fff0),
            0x10_0000_0000
        );
    }

    #[test]
    fn decodes_32_and_64_bit_and_io_bars() {
        let addr = PciAddress::new(0, 0, 4, 0);
        let mut f = FakeFunction::new(0x1af4, 0x1041, 0x02, 0x00);
        f.set_bar(0, 0xfebd_1000, 0x1000, 0x0); // 32-bit memory
        f.set_bar(1, 0xc040, 0x20, 0x1); // I/O
        f.set_bar64(4, 0x8_0000_0000, 0x4000, 0xc); // 64-bit prefetchable
        f.regs[1] = 0x0000_0007; // command: io | memory | bus master
        let cfg = FakeConfig::with(&[(addr, f)]);
        assert_eq!(
            read_bar(&cfg, addr, 0, 6),
            Ok(Bar::Memory {
                addr: 0xfebd_1000,
                size: 0x1000,
                prefetchable: false,
                is_64bit: false
            })
        );
        assert_eq!(
            read_bar(&cfg, addr, 1, 6),
            Ok(Bar::Io {
                port: 0xc040,
                size: 0x20
            })
        );
        assert_eq!(read_bar(&cfg, addr, 2, 6), Err(BarError::Unimplemented));
        assert_eq!(
            read_bar(&cfg, addr, 4, 6),
            Ok(Bar::Memory {
                addr: 0x8_0000_0000,
                size: 0x4000,
                prefetchable: true,
                is_64bit: true
            })
        );
        assert_eq!(read_bar(&cfg, addr, 5, 6), Err(BarError::UpperHalf));
        assert_eq!(read_bar(&cfg, addr, 6, 6), Err(BarError::NoSuchBar));
        // Sizing restored the registers and the command register.
        assert_eq!(cfg.read32(addr, regs::BAR0), 0xfebd_1000);
        assert_eq!(cfg.read32(addr, regs::BAR0 + 20), 0x8);
        assert_eq!(cfg.read16(addr, regs::COMMAND), 0x7);
    }
}
