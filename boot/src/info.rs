//! The PVH start info and what the kernel keeps of it.
//!
//! A PVH loader passes the physical address of a `hvm_start_info` structure in `%ebx`
//! (Xen's `arch-x86/hvm/start_info.h`, version 1): magic, the command line, the RSDP and
//! an E820-style memory map. The structures live in low memory that the kernel will reuse,
//! so [`BootInfo::from_pvh`] copies what we need into a self-contained value.

use core::fmt;

/// `hvm_start_info.magic`.
pub const PVH_MAGIC: u32 = 0x336e_c578;
/// The most memory-map entries we keep. QEMU passes fewer than ten.
pub const MAX_REGIONS: usize = 128;
/// The longest command line we keep, in bytes.
pub const MAX_CMDLINE: usize = 2048;

/// `struct hvm_start_info` (version 1), as the loader lays it out.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RawStartInfo {
    /// [`PVH_MAGIC`].
    pub magic: u32,
    /// Structure version; the memory map fields exist from version 1.
    pub version: u32,
    /// `SIF_*` flags.
    pub flags: u32,
    /// Number of boot modules.
    pub nr_modules: u32,
    /// Physical address of the module list.
    pub modlist_paddr: u64,
    /// Physical address of the NUL-terminated command line, or 0.
    pub cmdline_paddr: u64,
    /// Physical address of the ACPI RSDP, or 0.
    pub rsdp_paddr: u64,
    /// Physical address of the memory map (version >= 1).
    pub memmap_paddr: u64,
    /// Number of memory-map entries (version >= 1).
    pub memmap_entries: u32,
    /// Must be zero.
    pub reserved: u32,
}

/// `struct hvm_memmap_table_entry`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawMemmapEntry {
    /// Base physical address.
    pub addr: u64,
    /// Length in bytes.
    pub size: u64,
    /// E820 type (1 = RAM, 2 = reserved, 3 = ACPI reclaimable, 4 = ACPI NVS, 5 = bad).
    pub kind: u32,
    /// Must be zero.
    pub reserved: u32,
}

/// What a physical memory region holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    /// Usable RAM.
    Ram,
    /// Reserved by firmware or devices.
    Reserved,
    /// ACPI tables; reclaimable once they have been read.
    AcpiReclaimable,
    /// ACPI non-volatile storage; must be preserved.
    AcpiNvs,
    /// Defective RAM.
    Unusable,
    /// Any other E820 type.
    Other(u32),
}

impl MemoryKind {
    /// Decodes an E820 type.
    pub fn from_e820(kind: u32) -> Self {
        match kind {
            1 => MemoryKind::Ram,
            2 => MemoryKind::Reserved,
            3 => MemoryKind::AcpiReclaimable,
            4 => MemoryKind::AcpiNvs,
            5 => MemoryKind::Unusable,
            other => MemoryKind::Other(other),
        }
    }
}

/// One region of the physical memory map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryRegion {
    /// First byte.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
    /// What the region holds.
    pub kind: MemoryKind,
}

impl MemoryRegion {
    /// One past the last byte (saturating).
    pub fn end(&self) -> u64 {
        self.start.saturating_add(self.len)
    }
}

impl fmt::Display for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:#012x}-{:#012x} {:?}",
            self.start,
            self.end().saturating_sub(1),
            self.kind
        )
    }
}

/// Why the start info was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootError {
    /// `magic` is not [`PVH_MAGIC`]: not booted through PVH.
    BadMagic(u32),
    /// Version 0 has no memory map, and we need one.
    NoMemoryMap,
}

impl fmt::Display for BootError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootError::BadMagic(m) => write!(f, "bad PVH start info magic {m:#x}"),
            BootError::NoMemoryMap => f.write_str("PVH start info has no memory map"),
        }
    }
}

/// What the kernel learns from the loader, owned (copied out of loader memory).
#[derive(Clone, Debug)]
pub struct BootInfo {
    regions: [MemoryRegion; MAX_REGIONS],
    region_count: usize,
    regions_dropped: usize,
    cmdline: [u8; MAX_CMDLINE],
    cmdline_len: usize,
    cmdline_truncated: bool,
    /// Physical address of the ACPI RSDP, if the loader gave one.
    pub rsdp: Option<u64>,
    /// Physical address of the start info itself (for the log).
    pub start_info: u64,
}

impl BootInfo {
    /// Builds the boot info from the raw start info and the memory it points to.
    /// `cmdline` is the command line up to (not including) its NUL, or empty.
    pub fn from_pvh(
        start_info_paddr: u64,
        raw: &RawStartInfo,
        memmap: &[RawMemmapEntry],
        cmdline: &[u8],
    ) -> Result<BootInfo, BootError> {
        if raw.magic != PVH_MAGIC {
            return Err(BootError::BadMagic(raw.magic));
        }
        if raw.version < 1 || memmap.is_empty() {
            return Err(BootError::NoMemoryMap);
        }
        let empty = MemoryRegion {
            start: 0,
            len: 0,
            kind: MemoryKind::Reserved,
        };
        let mut info = BootInfo {
            regions: [empty; MAX_REGIONS],
            region_count: 0,
            regions_dropped: 0,
            cmdline: [0; MAX_CMDLINE],
            cmdline_len: 0,
            cmdline_truncated: cmdline.len() > MAX_CMDLINE,
            rsdp: (raw.rsdp_paddr != 0).then_some(raw.rsdp_paddr),
            start_info: start_info_paddr,
        };
        for entry in memmap.iter().filter(|e| e.size != 0) {
            if info.region_count == MAX_REGIONS {
                info.regions_dropped += 1;
                continue;
            }
            info.regions[info.region_count] = MemoryRegion {
                start: entry.addr,
                len: entry.size,
                kind: MemoryKind::from_e820(entry.kind),
            };
            info.region_count += 1;
        }
        let len = cmdline.len().min(MAX_CMDLINE);
        info.cmdline[..len].copy_from_slice(&cmdline[..len]);
        info.cmdline_len = len;
        Ok(info)
    }

    /// The memory map as the loader gave it (unsorted, possibly overlapping).
    pub fn memory_map(&self) -> &[MemoryRegion] {
        &self.regions[..self.region_count]
    }

    /// Memory-map entries that did not fit in [`MAX_REGIONS`].
    pub fn regions_dropped(&self) -> usize {
        self.regions_dropped
    }

    /// The kernel command line. Bytes after the first invalid UTF-8 sequence are dropped.
    pub fn cmdline(&self) -> &str {
        let bytes = &self.cmdline[..self.cmdline_len];
        match core::str::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => core::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or(""),
        }
    }

    /// The command line was longer than [`MAX_CMDLINE`] and was cut.
    pub fn cmdline_truncated(&self) -> bool {
        self.cmdline_truncated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> RawStartInfo {
        RawStartInfo {
            magic: PVH_MAGIC,
            version: 1,
            rsdp_paddr: 0xf5a40,
            ..RawStartInfo::default()
        }
    }

    fn entry(addr: u64, size: u64, kind: u32) -> RawMemmapEntry {
        RawMemmapEntry {
            addr,
            size,
            kind,
            reserved: 0,
        }
    }

    #[test]
    fn parses_memory_map_and_cmdline() {
        let map = [
            entry(0, 0x9fc00, 1),
            entry(0x9fc00, 0x400, 2),
            entry(0x100000, 0, 1),
            entry(0x100000, 0x7ee0000, 1),
            entry(0xfeffc000, 0x4000, 2),
        ];
        let info = BootInfo::from_pvh(0x6000, &raw(), &map, b"log=debug selftest").unwrap();
        assert_eq!(info.memory_map().len(), 4, "empty entries are dropped");
        assert_eq!(info.memory_map()[2].kind, MemoryKind::Ram);
        assert_eq!(info.memory_map()[3].end(), 0xff000000);
        assert_eq!(info.cmdline(), "log=debug selftest");
        assert_eq!(info.rsdp, Some(0xf5a40));
        assert!(!info.cmdline_truncated());
    }

    #[test]
    fn rejects_bad_start_info() {
        let mut bad = raw();
        bad.magic = 1;
        let map = [entry(0, 4096, 1)];
        assert_eq!(
            BootInfo::from_pvh(0, &bad, &map, b"").unwrap_err(),
            BootError::BadMagic(1)
        );
        let mut v0 = raw();
        v0.version = 0;
        assert_eq!(
            BootInfo::from_pvh(0, &v0, &map, b"").unwrap_err(),
            BootError::NoMemoryMap
        );
    }

    #[test]
    fn long_cmdline_and_map_are_cut_not_rejected() {
        let map: Vec<_> = (0..MAX_REGIONS as u64 + 3)
            .map(|i| entry(i << 20, 4096, 1))
            .collect();
        let cmdline = vec![b'a'; MAX_CMDLINE + 10];
        let info = BootInfo::from_pvh(0, &raw(), &map, &cmdline).unwrap();
        assert_eq!(info.memory_map().len(), MAX_REGIONS);
        assert_eq!(info.regions_dropped(), 3);
        assert_eq!(info.cmdline().len(), MAX_CMDLINE);
        assert!(info.cmdline_truncated());
    }

    #[test]
    fn invalid_utf8_keeps_the_valid_prefix() {
        let info = BootInfo::from_pvh(0, &raw(), &[entry(0, 4096, 1)], b"log=info \xff x").unwrap();
        assert_eq!(info.cmdline(), "log=info ");
    }
}
