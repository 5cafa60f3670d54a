//! The filesystem's part of a counters document (`fs` in the appliance's and in
//! `ninefold serve`'s): its state beside its counters ([`FsStats`]), and how they become
//! metrics ([`METRIC_RULES`], applied by `metrics::document`).

use alloc::string::{String, ToString};
use alloc::vec::Vec;

use block::BlockDevice;
use metrics::rule::Rule;
use vfs::FileSystem;

use crate::cache::{DataCacheReport, ReadaheadCounters};
use crate::core::counters::FsStats;
use crate::volume::NineFs;

/// A mounted filesystem's state and counters (the `fs` object of a counters document:
/// the counters flattened beside the state).
#[derive(Clone, Debug, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FsReport {
    /// Label.
    pub label: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Free bytes (as `statfs` reports them).
    pub free_bytes: u64,
    /// Memory used by cached nodes.
    pub cache_bytes: u64,
    /// Cached nodes.
    pub cache_nodes: u64,
    /// The node cache's limit.
    pub cache_limit: u64,
    /// Every quota root's limits and usage, in project order.
    pub quotas: Vec<QuotaReport>,
    /// The stream jobs of the administration tree (`ctl send`, `ctl receive`).
    pub streams: crate::features::streams::jobs::StreamCounters,
    /// The data cache: its size, hits, misses and evictions, in all and per tenant.
    pub data_cache: DataCacheReport,
    /// Readahead.
    pub readahead: ReadaheadCounters,
    /// The counters.
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub stats: FsStats,
}

/// One project's limits and usage (an element of [`FsReport::quotas`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct QuotaReport {
    /// The project's name, which labels the element's metrics: the export whose
    /// directory it is when a server names it ([`FsReport::name_projects`]), else its
    /// root directory's inode number.
    pub name: String,
    /// The project: its root directory's inode number.
    pub root: u64,
    /// Bytes of file data charged.
    pub bytes: u64,
    /// Inodes charged.
    pub inodes: u64,
    /// The byte limit (`None`: none).
    pub byte_limit: Option<u64>,
    /// The inode limit (`None`: none).
    pub inode_limit: Option<u64>,
}

impl FsReport {
    /// Names each project `name(root)` says (a server: the export whose directory it
    /// is); the others keep their inode number.
    pub fn name_projects(&mut self, name: impl Fn(u64) -> Option<String>) {
        for q in &mut self.quotas {
            if let Some(n) = name(q.root) {
                q.name = n;
            }
        }
    }
}

/// The filesystem's state and counters now; `cache_limit` is the node cache's limit
/// it was mounted with.
pub async fn report<D: BlockDevice>(fs: &NineFs<D>, cache_limit: u64) -> FsReport {
    let sb = fs.superblock();
    let label_end = sb
        .label
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(sb.label.len());
    let statfs = fs.statfs().await.ok();
    let (cache_bytes, cache_nodes) = fs.cache_usage();
    let quotas = fs.quotas().await.unwrap_or_default();
    FsReport {
        label: String::from_utf8_lossy(&sb.label[..label_end]).into(),
        size_bytes: sb.layout.total_blocks * crate::format::BLOCK_SIZE as u64,
        free_bytes: statfs.map_or(0, |s| s.blocks_free * u64::from(s.block_size)),
        cache_bytes: cache_bytes as u64,
        cache_nodes: cache_nodes as u64,
        cache_limit,
        quotas: quotas
            .into_iter()
            .map(|(root, q)| QuotaReport {
                name: root.to_string(),
                root,
                bytes: q.bytes,
                inodes: q.inodes,
                byte_limit: q.byte_limit,
                inode_limit: q.inode_limit,
            })
            .collect(),
        streams: fs.stream_counters(),
        data_cache: fs.engine.dev.cache().report(),
        readahead: fs.readahead_counters(),
        stats: fs.stats(),
    }
}

/// How the `fs` object becomes metrics (`metrics::document`): what its paths alone do
/// not say. A counter without a rule is still exposed, as `ninefold_fs_<path>_total`.
pub const METRIC_RULES: &[Rule] = &[
    Rule::gauge("fs.size_bytes").help("Size of the filesystem."),
    // The stream jobs, labelled by kind (`job="send"`, `job="receive"`).
    Rule::keys("fs.streams", "job"),
    Rule::counter("fs.streams.*.jobs")
        .named("fs_stream_jobs")
        .help("Stream jobs started through ctl (send start, receive start)."),
    Rule::counter("fs.streams.*.bytes")
        .named("fs_stream_bytes")
        .help("Stream bytes the jobs moved through their buffers (a receive's two passes both count)."),
    Rule::counter("fs.streams.*.stalls")
        .named("fs_stream_stalls")
        .help("Times a job's filling side found its buffer (stream_buffer=) full: the other side is slower."),
    Rule::gauge("fs.streams.*.buffered")
        .named("fs_stream_buffered_bytes")
        .help("Bytes in the job's buffer now."),
    Rule::gauge("fs.streams.*.running")
        .named("fs_stream_running")
        .help("1 while a job of this kind runs."),
    Rule::gauge("fs.free_bytes").help("Free space of the filesystem, as statfs reports it."),
    Rule::gauge("fs.cache_bytes").help("Memory used by cached btree nodes."),
    Rule::gauge("fs.cache_nodes").help("Btree nodes cached."),
    Rule::gauge("fs.cache_limit")
        .named("fs_cache_limit_bytes")
        .help("Limit of the node cache (sized from the heap)."),
    Rule::gauge("fs.data_cache.limit_bytes")
        .help("Memory the data cache may use now: data_cache= and what the node cache leaves unused."),
    Rule::gauge("fs.data_cache.own_limit_bytes").help("The data cache's own limit (data_cache=)."),
    Rule::gauge("fs.data_cache.bytes").help("Memory charged for the file data blocks cached."),
    Rule::gauge("fs.data_cache.blocks").help("File data blocks (4 KiB) cached."),
    Rule::gauge("fs.data_cache.protected_blocks")
        .help("Cached blocks read at least twice (2Q's protected queue)."),
    Rule::gauge("fs.data_cache.fills").help("Device reads under way to fill the data cache."),
    Rule::counter("fs.data_cache.stale")
        .help("Cached blocks found with another checksum than the reader's plan (never served): must stay 0."),
    Rule::counter("fs.data_cache.hits").help("Data blocks reads found in the data cache."),
    Rule::counter("fs.data_cache.misses").help("Data blocks reads had to get from the device."),
    Rule::counter("fs.data_cache.inserted").help("Data blocks kept in the data cache."),
    Rule::counter("fs.data_cache.evictions").help("Data blocks evicted from the data cache to make room."),
    Rule::counter("fs.data_cache.invalidations")
        .help("Cached data blocks dropped because their device block was written, discarded or freed."),
    Rule::counter("fs.data_cache.prefetched").help("Data blocks read ahead into the data cache."),
    Rule::counter("fs.data_cache.prefetch_hits").help("Data blocks read ahead that a reader then read."),
    Rule::counter("fs.data_cache.prefetch_unused")
        .help("Data blocks read ahead and dropped before anyone read them."),
    Rule::elements("fs.data_cache.tenants", "tenant", "name"),
    Rule::gauge("fs.data_cache.tenants.*.tenant")
        .named("fs_data_cache_tenant_id")
        .help("The tenant's id in the 9P server (absent: the filesystem's own reads)."),
    Rule::gauge("fs.data_cache.tenants.*.bytes")
        .named("fs_data_cache_tenant_bytes")
        .help("Memory charged to a tenant for the data blocks its reads brought into the cache."),
    Rule::gauge("fs.data_cache.tenants.*.blocks")
        .named("fs_data_cache_tenant_blocks")
        .help("Data blocks cached for a tenant."),
    Rule::gauge("fs.data_cache.tenants.*.protected_blocks")
        .named("fs_data_cache_tenant_protected_blocks")
        .help("A tenant's cached blocks read at least twice."),
    Rule::counter("fs.data_cache.tenants.*.hits")
        .named("fs_data_cache_tenant_hits")
        .help("Data blocks a tenant's reads found in the cache."),
    Rule::counter("fs.data_cache.tenants.*.misses")
        .named("fs_data_cache_tenant_misses")
        .help("Data blocks a tenant's reads had to get from the device."),
    Rule::counter("fs.data_cache.tenants.*.inserted")
        .named("fs_data_cache_tenant_inserted")
        .help("Data blocks kept in the cache for a tenant."),
    Rule::counter("fs.data_cache.tenants.*.evictions")
        .named("fs_data_cache_tenant_evictions")
        .help("A tenant's cached blocks evicted to make room (for it or for a tenant below its fair share)."),
    Rule::counter("fs.data_cache.tenants.*.invalidations")
        .named("fs_data_cache_tenant_invalidations")
        .help("A tenant's cached blocks dropped because they were written, discarded or freed."),
    Rule::counter("fs.data_cache.tenants.*.prefetched")
        .named("fs_data_cache_tenant_prefetched")
        .help("Data blocks read ahead for a tenant."),
    Rule::counter("fs.data_cache.tenants.*.prefetch_hits")
        .named("fs_data_cache_tenant_prefetch_hits")
        .help("Data blocks read ahead for a tenant that it then read."),
    Rule::counter("fs.data_cache.tenants.*.prefetch_unused")
        .named("fs_data_cache_tenant_prefetch_unused")
        .help("Data blocks read ahead for a tenant and dropped before it read them."),
    Rule::counter("fs.readahead.requests").help("Readahead requests queued for sequential readers."),
    Rule::counter("fs.readahead.dropped")
        .help("Readahead requests dropped because the queue (or the tenant's part of it) was full."),
    Rule::counter("fs.readahead.cancelled")
        .help("Readahead requests dropped because their reader stopped reading sequentially."),
    Rule::counter("fs.readahead.reads").help("Device reads made by readahead."),
    Rule::counter("fs.readahead.bytes")
        .named("fs_readahead_read_bytes")
        .help("Bytes read by readahead."),
    Rule::counter("fs.readahead.skipped_blocks")
        .help("Blocks readahead found cached or already being read."),
    Rule::counter("fs.readahead.failed")
        .help("Readahead reads that failed or whose blocks failed their checksums (nothing kept)."),
    Rule::elements("fs.quotas", "project", "name"),
    Rule::gauge("fs.quotas.*.root")
        .named("fs_quota_root_inode")
        .help("A project's root directory (its inode number)."),
    Rule::gauge("fs.quotas.*.bytes")
        .named("fs_quota_bytes")
        .help("Bytes of file data charged to a project (a quota root, named after its export)."),
    Rule::gauge("fs.quotas.*.inodes")
        .named("fs_quota_inodes")
        .help("Inodes charged to a project."),
    Rule::gauge("fs.quotas.*.byte_limit")
        .named("fs_quota_byte_limit")
        .help("A project's byte limit (absent: none)."),
    Rule::gauge("fs.quotas.*.inode_limit")
        .named("fs_quota_inode_limit")
        .help("A project's inode limit (absent: none)."),
    Rule::counter("fs.quota_exceeded")
        .help("Writes, clones and creates refused with EDQUOT at a project's limit."),
    Rule::keys("fs.checkpoints", "cause")
        .named("fs_checkpoints")
        .help("Checkpoints committed, by what caused them."),
    Rule::keys("fs.node_writes", "cause"),
    Rule::counter("fs.node_writes.*.writes")
        .named("fs_node_writes")
        .help("Btree node writes, by cause."),
    Rule::counter("fs.node_writes.*.bytes")
        .named("fs_node_written_bytes")
        .help("Bytes of btree node writes, by cause."),
    Rule::counter("fs.corruptions")
        .help("Checksum or decoding failures the filesystem found (each also logged): must stay 0."),
    Rule::counter("fs.scrub_runs")
        .named("fs_scrub_runs")
        .help("Scrub passes completed."),
    Rule::counter("fs.scrub_bytes")
        .named("fs_scrub_verified_bytes")
        .help("Bytes of btree nodes and data read and verified by scrub."),
    Rule::counter("fs.scrub_errors")
        .named("fs_scrub_errors")
        .help("Blocks scrub found failing their checksum or unreadable (each also logged): must stay 0."),
    Rule::gauge("fs.scrub_running").help("1 while a scrub pass is running."),
    Rule::gauge("fs.failed").help(
        "1 once a failed device write or FLUSH made the filesystem refuse every request with EIO: reboot on a healthy disk.",
    ),
    Rule::gauge("fs.legs").help("Devices of a mirrored volume (0: a single device)."),
    Rule::gauge("fs.failed_legs").help(
        "Devices of a mirrored volume out of service (failed, missing or stale): the volume serves from the others; replace them.",
    ),
    Rule::counter("fs.rebuild_starts")
        .named("fs_rebuild_starts")
        .help("Replacements of a mirrored volume's leg started (ctl replace)."),
    Rule::counter("fs.rebuilds")
        .named("fs_rebuilds")
        .help("Rebuilds of a replaced leg completed: the leg is in service."),
    Rule::counter("fs.rebuild_failures")
        .named("fs_rebuild_failures")
        .help("Rebuilds ended by the new leg failing: replace it again."),
    Rule::counter("fs.rebuild_blocks")
        .named("fs_rebuild_copied_blocks")
        .help("4 KiB blocks copied to a leg being rebuilt."),
    Rule::counter("fs.rebuild_retries")
        .named("fs_rebuild_retries")
        .help("Rebuild copies done again or put off because a write over the same blocks was in flight."),
    Rule::counter("fs.rebuild_unverified")
        .named("fs_rebuild_unverified_blocks")
        .help("Blocks a rebuild copied failing their checksum on every leg in service (each logged): must stay 0."),
    Rule::gauge("fs.rebuild_running").help("1 while a replaced leg is being rebuilt."),
    Rule::gauge("fs.rebuild_cursor")
        .named("fs_rebuild_cursor_blocks")
        .help("The rebuild's copy position, a block number below fs_rebuild_end_blocks."),
    Rule::gauge("fs.rebuild_total")
        .named("fs_rebuild_end_blocks")
        .help("Blocks the rebuild's copy goes through (the filesystem's size)."),
    Rule::counter("fs.grows")
        .named("fs_grows")
        .help("Times the filesystem grew to a larger device."),
    Rule::counter("fs.grown_blocks")
        .named("fs_grown_blocks")
        .help("4 KiB blocks added by growth."),
    Rule::counter("fs.core_lock.acquisitions")
        .help("Times the filesystem's one metadata lock was taken (by any CPU)."),
    Rule::counter("fs.core_lock.contended")
        .help("Acquisitions of the metadata lock that found it held by another CPU and spun."),
    Rule::counter("fs.core_lock.hold_ns").help("Time the metadata lock was held."),
    Rule::gauge("fs.core_lock.max_hold_ns").help("Longest single hold of the metadata lock."),
    Rule::keys("fs.log.fallbacks", "reason")
        .named("fs_log_fallbacks")
        .help("Syncs served by a checkpoint instead of the fsync log, by reason."),
    Rule::counter("fs.log.commits").help("Commits of the fsync log (each one device FLUSH)."),
    Rule::counter("fs.log.unverified_commits").help(
        "Commits replayed at mount although the device could not read some of their data blocks (reads of those give EIO).",
    ),
    Rule::counter("fs.log.refused_commits").help(
        "Log commits replay refused at mount (each also logged): no live operation does what they ask, so they are forged or written by a bug; the filesystem is read-only. Must stay 0: run ninefold fsck.",
    ),
];
