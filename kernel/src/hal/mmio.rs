//! Memory-mapped device registers.

use core::fmt;

/// A range of device registers mapped uncached (made by `paging::map_mmio`). Accesses are
/// volatile, naturally aligned and bounds-checked: a driver bug panics with the offset
/// instead of touching some other device or RAM. Cloning shares the mapping (mappings are
/// never torn down).
#[derive(Clone)]
pub struct MmioRegion {
    base: u64,
    len: usize,
}

impl fmt::Debug for MmioRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MmioRegion({:#x}+{:#x})", self.base, self.len)
    }
}

macro_rules! accessors {
    ($($read:ident $write:ident $t:ty),*) => {$(
        /// Reads the register at `offset`.
        pub fn $read(&self, offset: usize) -> $t {
            let p = self.check::<$t>(offset) as *const $t;
            // SAFETY: `check` proved the access is aligned and inside the region, which
            // `paging::map_mmio` mapped uncached for as long as the kernel runs.
            unsafe { p.read_volatile() }
        }

        /// Writes the register at `offset`.
        pub fn $write(&self, offset: usize, value: $t) {
            let p = self.check::<$t>(offset) as *mut $t;
            // SAFETY: as for reads.
            unsafe { p.write_volatile(value) }
        }
    )*};
}

impl MmioRegion {
    /// Wraps an already-mapped range. Only `paging` creates regions.
    pub(super) fn new(base: u64, len: usize) -> MmioRegion {
        MmioRegion { base, len }
    }

    /// Physical (= virtual) address of the first register.
    pub fn phys_addr(&self) -> u64 {
        self.base
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The part `offset..offset + len` of this region.
    ///
    /// # Panics
    /// If it does not lie inside the region.
    pub fn subregion(&self, offset: usize, len: usize) -> MmioRegion {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "MMIO subregion {offset:#x}+{len:#x} outside {self:?}"
        );
        MmioRegion::new(self.base + offset as u64, len)
    }

    /// A raw pointer to the first register, for crates that access MMIO themselves
    /// (e.g. `virtio-drivers`); they must stay inside [`MmioRegion::len`].
    pub fn as_ptr(&self) -> *mut u8 {
        self.base as *mut u8
    }

    fn check<T>(&self, offset: usize) -> u64 {
        let size = core::mem::size_of::<T>();
        assert!(
            offset.is_multiple_of(size) && offset + size <= self.len,
            "bad MMIO access: {size} bytes at {offset:#x} in {self:?}"
        );
        self.base + offset as u64
    }

    accessors!(read8 write8 u8, read16 write16 u16, read32 write32 u32, read64 write64 u64);
}
