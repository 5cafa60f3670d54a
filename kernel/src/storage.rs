//! The disk's filesystem: open the `disk=` device, format it when asked (`mkfs`), mount
//! it with memory limits derived from the heap, and say on the console what was found.
//!
//! The disk lives for the rest of the appliance's life, so it is leaked to a `&'static`:
//! the filesystem, the counters service and a failed mount (which must not lose the
//! device) all borrow the same one.

use fs::format::BLOCK_SIZE;
use fs::volume::MountOptions;

#[cfg(target_os = "none")]
pub use mount_impl::{mount, CountedDisk, DiskFs, Mounted, StorageError};

/// Share of the heap the btree node cache may use. A checkpoint holds encoded copies of
/// the dirty nodes while it writes them, so the cache can cost twice this at peak; the
/// socket buffers take up to a quarter (`net::limits`), and the rest is for request
/// frames, file data in flight and per-inode state.
pub const CACHE_SHARE: u64 = 5;
/// Bounds of the node cache.
pub const MIN_CACHE: u64 = 4 << 20;
/// See [`MIN_CACHE`].
pub const MAX_CACHE: u64 = 1 << 30;
/// Share of the heap for cached allocation-bitmap groups (4 KiB each, 127 MiB of disk
/// each): 1/64 of a 94 MiB heap keeps the bitmap of a 45 GiB disk in memory.
pub const GROUP_SHARE: u64 = 64;
/// Label given to a disk the appliance formats.
pub const LABEL: &[u8] = b"ninefold";

/// The mount options for a `heap_bytes` heap (pure: host-tested).
pub fn mount_options(heap_bytes: u64) -> MountOptions {
    let cache = (heap_bytes / CACHE_SHARE).clamp(MIN_CACHE, MAX_CACHE);
    let groups = (heap_bytes / GROUP_SHARE / BLOCK_SIZE as u64).max(256);
    MountOptions {
        cache_limit: cache as usize,
        max_groups: groups as usize,
        ..MountOptions::default()
    }
}

#[cfg(target_os = "none")]
mod mount_impl {
    use alloc::boxed::Box;
    use alloc::format;
    use alloc::string::String;
    use core::fmt;

    use block::BlockDevice;
    use fs::format::superblock::MAGIC;
    use fs::format::BLOCK_SIZE;
    use fs::io::Dev;
    use fs::volume::{format as mkfs, FormatError, FormatOptions, MountError, NineFs};
    use log::{info, warn};
    use vfs::FileSystem;

    use super::{mount_options, LABEL};
    use crate::clock::rtc::WallClock;
    use crate::config::{Config, Mkfs};
    use crate::drivers::disk::{self, Disk, DiskOptions, OpenError};
    use block::CountingDisk;

    /// The appliance's block device, with its counters.
    pub type CountedDisk = CountingDisk<Disk>;
    /// The filesystem the appliance serves from its disk.
    pub type DiskFs = NineFs<&'static CountedDisk>;

    /// The mounted filesystem and its device.
    #[derive(Debug)]
    pub struct Mounted {
        /// The filesystem.
        pub fs: DiskFs,
        /// Its device.
        pub disk: &'static CountedDisk,
        /// The device's name in logs and reports: kind and PCI address.
        pub name: String,
        /// The node cache's limit.
        pub cache_limit: usize,
    }

    /// Why there is no filesystem to serve.
    #[derive(Debug)]
    pub enum StorageError {
        /// No disk, or it would not come up.
        Open(OpenError),
        /// Neither superblock copy carries the ninefold magic: an empty or foreign disk.
        Unformatted(String),
        /// The disk holds a ninefold superblock, but no valid one.
        Damaged(String),
        /// `mkfs` failed.
        Format(String, FormatError),
        /// The mount failed.
        Mount(String, MountError),
    }

    impl fmt::Display for StorageError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                StorageError::Open(e) => write!(f, "no disk: {e}"),
                StorageError::Unformatted(d) => write!(
                    f,
                    "{d} holds no ninefold filesystem; format it with `ninefold mkfs` on the host, or boot with `mkfs` to format it here (erases the disk)"
                ),
                StorageError::Damaged(d) => write!(
                    f,
                    "{d}: both superblocks are damaged; check the image with `ninefold fsck`, or boot with `mkfs=force` to erase and format it"
                ),
                StorageError::Format(d, e) => write!(f, "{d}: mkfs failed: {e}"),
                StorageError::Mount(d, e) => write!(f, "{d}: mount failed: {e}"),
            }
        }
    }

    /// Opens the disk, formats it if `config.mkfs` says so, and mounts it.
    pub async fn mount(config: &Config, heap_bytes: u64) -> Result<Mounted, StorageError> {
        let opened = disk::open(config.disk, DiskOptions::for_config(config))
            .await
            .map_err(StorageError::Open)?;
        let name = format!("{}@{}", opened.kind(), opened.pci().address());
        let disk: &'static CountedDisk =
            Box::leak(Box::new(CountingDisk::with_clock(opened, || {
                crate::clock::now().as_nanos()
            })));
        let g = disk.geometry();
        info!(
            "fs: disk {name}: {} MiB, {}-byte blocks, {} write cache, {} FUA",
            g.capacity_bytes() >> 20,
            g.block_size,
            if g.volatile_cache { "volatile" } else { "no" },
            if g.native_fua { "native" } else { "emulated" }
        );

        let blank = !has_magic(disk).await;
        match (config.mkfs, blank) {
            (Mkfs::Force, _) | (Mkfs::IfBlank, true) => format_disk(disk, &name).await?,
            (Mkfs::IfBlank, false) => {
                info!("fs: mkfs: {name} already holds a ninefold filesystem; mounting it as it is")
            }
            (Mkfs::Off, true) => return Err(StorageError::Unformatted(name)),
            (Mkfs::Off, false) => {}
        }

        let dev =
            Dev::new(disk).map_err(|e| StorageError::Mount(name.clone(), MountError::Device(e)))?;
        let (sb, copies) = match fs::volume::read_superblock(&dev).await {
            Ok(found) => found,
            Err(MountError::NoSuperblock) => return Err(StorageError::Damaged(name)),
            Err(e) => return Err(StorageError::Mount(name, e)),
        };
        if copies != [true, true] {
            warn!("fs: {name}: one superblock copy is invalid (a torn last write, or damage): {copies:?}");
        }
        let clean = sb.state & fs::format::superblock::state::CLEAN != 0;
        let opts = mount_options(heap_bytes);
        let cache_limit = opts.cache_limit;
        let started = crate::clock::now();
        let fs = NineFs::mount(disk, opts, Box::new(WallClock::new()))
            .await
            .map_err(|e| StorageError::Mount(name.clone(), e))?;
        let took = crate::clock::now() - started;
        let statfs = fs.statfs().await.ok();
        let sb = fs.superblock();
        info!(
            "fs: mounted {name}: label \"{}\", {} MiB, {} MiB free, {} (mount #{}, checkpoint {}), node cache {} MiB; mount took {} ms",
            label(&sb.label),
            (sb.layout.total_blocks * BLOCK_SIZE as u64) >> 20,
            statfs.map_or(0, |s| (s.blocks_free * u64::from(s.block_size)) >> 20),
            if clean {
                "cleanly unmounted"
            } else {
                "NOT cleanly unmounted: recovered to its last checkpoint"
            },
            sb.mount_count,
            sb.checkpoint_seq,
            cache_limit >> 20,
            took.as_millis()
        );
        Ok(Mounted {
            fs,
            disk,
            name,
            cache_limit,
        })
    }

    /// Whether either superblock slot starts with the ninefold magic (the disk was formatted
    /// once, whatever state it is in now).
    async fn has_magic(disk: &CountedDisk) -> bool {
        let Ok(dev) = Dev::new(disk) else {
            return false;
        };
        let mut buf = alloc::vec![0u8; BLOCK_SIZE];
        for b in fs::format::layout::SUPERBLOCK_BLOCKS {
            if dev.read(b, &mut buf).await.is_ok() && buf[..MAGIC.len()] == MAGIC {
                return true;
            }
        }
        false
    }

    async fn format_disk(disk: &CountedDisk, name: &str) -> Result<(), StorageError> {
        let seed = entropy();
        let mut uuid = [0u8; 16];
        uuid[..8].copy_from_slice(&seed[0].to_le_bytes());
        uuid[8..].copy_from_slice(&seed[1].to_le_bytes());
        let now = WallClock::new();
        let opts = FormatOptions {
            label: LABEL.into(),
            uuid,
            secret: seed[2],
            now: vfs::Clock::now(&now),
            ..FormatOptions::default()
        };
        info!("fs: mkfs: formatting {name} (label \"ninefold\")");
        mkfs(&disk, &opts)
            .await
            .map_err(|e| StorageError::Format(name.into(), e))?;
        info!("fs: mkfs: done");
        Ok(())
    }

    /// Three random words for the filesystem's identity and hash secret: RDRAND where the
    /// CPU has it, else the TSC and the RTC stirred (unpredictable enough across boots for
    /// a uuid and a hash key; not key material).
    fn entropy() -> [u64; 3] {
        let rdrand = x86_64::instructions::random::RdRand::new();
        let mut state = crate::hal::cpu::rdtsc()
            ^ (crate::clock::rtc::read_epoch_seconds() as u64).rotate_left(32);
        core::array::from_fn(|_| {
            if let Some(v) = rdrand.and_then(|r| r.get_u64()) {
                return v;
            }
            state ^= crate::hal::cpu::rdtsc();
            splitmix64(&mut state)
        })
    }

    fn splitmix64(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn label(raw: &[u8]) -> String {
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        String::from_utf8_lossy(&raw[..end]).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn cache_scales_with_the_heap() {
        // 128 MiB of RAM: a 94 MiB heap.
        let small = mount_options(94 * MIB);
        assert_eq!(small.cache_limit as u64, 94 * MIB / CACHE_SHARE);
        assert_eq!(small.max_groups, 376);
        // make run's 512 MiB: about 375 MiB of heap.
        assert_eq!(mount_options(375 * MIB).cache_limit as u64, 75 * MIB);
        assert_eq!(mount_options(MIB).cache_limit as u64, MIN_CACHE);
        assert_eq!(mount_options(64 << 30).cache_limit as u64, MAX_CACHE);
        assert_eq!(mount_options(MIB).max_groups, 256);
    }
}
