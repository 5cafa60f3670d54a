//! Making a filesystem: superblocks, both slots of every bitmap group, and the initial
//! trees (the fs tree holding the root directory; empty extent and checksum trees).

use alloc::vec::Vec;

use crate::btree::write::FlushResult;
use crate::btree::{Trees, WriteCause};
use crate::format::items::InodeItem;
use crate::format::layout::{Layout, MIN_BLOCKS, SUPERBLOCK_BLOCKS};
use crate::format::superblock::{leg, state, Root, Superblock, LABEL_LEN, MAX_LEGS};
use crate::format::{
    features, TreeId, BLOCK_SIZE, DEFAULT_NODE_SIZE, FORMAT_VERSION, MAX_NODE_SIZE, MIN_NODE_SIZE,
};
use crate::io::{Dev, DevError};
use crate::space::initial_group;
use block::{BlockDevice, IoError, WriteFlags};
use vfs::{mode, Timespec, ROOT_INO};

use crate::core::txn::inode_key;

/// What to make.
#[derive(Clone, Debug)]
pub struct FormatOptions {
    /// Label (at most 64 bytes).
    pub label: Vec<u8>,
    /// Btree node size: a power of two from 16 KiB to 256 KiB.
    pub node_size: u32,
    /// Filesystem identity; should be random.
    pub uuid: [u8; 16],
    /// Secret for name hashes and node nonces; should be random.
    pub secret: u64,
    /// Creation time (the root directory's timestamps).
    pub now: Timespec,
    /// Use only this many 4 KiB blocks of the device (default: all).
    pub blocks: Option<u64>,
}

impl Default for FormatOptions {
    fn default() -> FormatOptions {
        FormatOptions {
            label: Vec::new(),
            node_size: DEFAULT_NODE_SIZE,
            uuid: [0; 16],
            secret: 0,
            now: Timespec::default(),
            blocks: None,
        }
    }
}

/// Why formatting failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FormatError {
    /// The device cannot hold a filesystem.
    Device(DevError),
    /// Too small (the minimum is given in blocks).
    TooSmall(u64),
    /// The node size is not a power of two in range.
    NodeSize(u32),
    /// The label is longer than 64 bytes.
    Label,
    /// Writing failed.
    Io(IoError),
    /// A mirror of more legs than the superblock's table holds.
    TooManyLegs(usize),
}

impl core::fmt::Display for FormatError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FormatError::Device(e) => write!(f, "unusable device: {e:?}"),
            FormatError::TooSmall(min) => write!(f, "too small: at least {} KiB needed", min * 4),
            FormatError::NodeSize(n) => write!(
                f,
                "node size {n} is not a power of two from {MIN_NODE_SIZE} to {MAX_NODE_SIZE}"
            ),
            FormatError::Label => write!(f, "label longer than {LABEL_LEN} bytes"),
            FormatError::Io(e) => write!(f, "write failed: {e}"),
            FormatError::TooManyLegs(n) => write!(f, "{n} devices: at most {MAX_LEGS}"),
        }
    }
}

/// Makes a filesystem on `dev`.
pub async fn format<D: BlockDevice>(dev: &D, opts: &FormatOptions) -> Result<(), FormatError> {
    let dev = Dev::new(dev).map_err(FormatError::Device)?;
    if dev.copies() > MAX_LEGS {
        return Err(FormatError::TooManyLegs(dev.copies()));
    }
    let layout = checked_layout(dev.blocks(), opts)?;
    // The initial trees, built in memory and written like a checkpoint (sequence 1).
    let seq = 1;
    let (roots, trees) = initial_trees(opts, &layout, seq);
    let node_blocks = u64::from(opts.node_size) / BLOCK_SIZE as u64;
    let used: Vec<_> = trees.placed.iter().map(|&a| a..a + node_blocks).collect();
    write(&dev, 0, &[0; BLOCK_SIZE]).await?;
    for w in trees.writes {
        write(&dev, w.block, &w.bset.seal()).await?;
    }
    let mut free = 0;
    for g in 0..layout.groups {
        let mut grp = initial_group(&layout, g, &used);
        grp.seq = seq;
        free += u64::from(grp.free);
        let data = grp.encode();
        write(&dev, layout.bitmap_block(g, 0), &data).await?;
        write(&dev, layout.bitmap_block(g, 1), &data).await?;
    }
    let mut sb = initial_superblock(opts, layout, roots, free, seq);
    let copies = dev.copies();
    if copies > 1 {
        // A mirror: every leg in service (each device's own place is in its label).
        sb.legs[..copies].fill(leg::ACTIVE);
        sb.incompat |= features::INCOMPAT_MIRROR;
    }
    // Copy B (generation 0) and copy A (generation 1): both valid, A current.
    write(&dev, SUPERBLOCK_BLOCKS[0], &sb.encode()).await?;
    sb.generation = 1;
    write(&dev, SUPERBLOCK_BLOCKS[1], &sb.encode()).await?;
    dev.flush().await.map_err(FormatError::Io)
}

/// The layout of a filesystem of `opts` on a device of `dev_blocks` blocks, if the
/// options are valid and it fits.
fn checked_layout(dev_blocks: u64, opts: &FormatOptions) -> Result<Layout, FormatError> {
    let total = opts.blocks.unwrap_or(dev_blocks).min(dev_blocks);
    if total < MIN_BLOCKS {
        return Err(FormatError::TooSmall(MIN_BLOCKS));
    }
    let ns = opts.node_size;
    if !ns.is_power_of_two() || !(MIN_NODE_SIZE..=MAX_NODE_SIZE).contains(&ns) {
        return Err(FormatError::NodeSize(ns));
    }
    if opts.label.len() > LABEL_LEN {
        return Err(FormatError::Label);
    }
    let layout = Layout::for_size(total);
    let node_blocks = u64::from(ns) / BLOCK_SIZE as u64;
    if layout.data_blocks() < 16 * node_blocks {
        return Err(FormatError::TooSmall(
            layout.data_start() + 16 * node_blocks,
        ));
    }
    Ok(layout)
}

/// The fs tree holding the root directory and empty extent and checksum trees, placed
/// at the start of the data region: their roots and the node writes.
fn initial_trees(
    opts: &FormatOptions,
    layout: &Layout,
    seq: u64,
) -> ([Root; TreeId::COUNT], FlushResult) {
    let mut trees = Trees::new(
        [Root::default(); TreeId::COUNT],
        opts.node_size,
        opts.secret,
        seq,
    );
    for tree in [TreeId::Fs, TreeId::Extent, TreeId::Csum] {
        trees.create_tree(tree);
    }
    let root = InodeItem {
        mode: mode::S_IFDIR | 0o755,
        nlink: 2,
        atime: opts.now,
        mtime: opts.now,
        ctime: opts.now,
        btime: opts.now,
        generation: seq,
        next_seq: 2,
        transid: seq,
        ..Default::default()
    };
    trees
        .insert(TreeId::Fs, inode_key(ROOT_INO), root.encode())
        .expect("fresh trees are cached");
    let node_blocks = u64::from(opts.node_size) / BLOCK_SIZE as u64;
    let mut pool: Vec<u64> = (0..8)
        .map(|i| layout.data_start() + i * node_blocks)
        .rev()
        .collect();
    let flushed = trees.flush(seq, WriteCause::Initial, &mut pool);
    (trees.roots, flushed)
}

/// The superblock of the new filesystem (generation 0).
fn initial_superblock(
    opts: &FormatOptions,
    layout: Layout,
    roots: [Root; TreeId::COUNT],
    free_blocks: u64,
    seq: u64,
) -> Superblock {
    let mut label = [0u8; LABEL_LEN];
    label[..opts.label.len()].copy_from_slice(&opts.label);
    Superblock {
        version: FORMAT_VERSION,
        compat: features::COMPAT_SUPPORTED,
        ro_compat: 0,
        incompat: features::INCOMPAT_LOG,
        uuid: opts.uuid,
        secret: opts.secret,
        label,
        node_size: opts.node_size,
        layout,
        generation: 0,
        checkpoint_seq: seq,
        state: state::CLEAN,
        roots,
        next_ino: ROOT_INO + 1,
        free_blocks,
        inode_count: 1,
        created: opts.now,
        mount_count: 0,
        log_tail: 0,
        log_epoch: 0,
        legs: [0; MAX_LEGS],
        rebuild_cursor: 0,
    }
}

/// Writes one block (or a node's blocks) at `block`.
async fn write<D: BlockDevice>(dev: &Dev<D>, block: u64, data: &[u8]) -> Result<(), FormatError> {
    dev.write(block, data, WriteFlags::NONE)
        .await
        .map_err(FormatError::Io)
}
