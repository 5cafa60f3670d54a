//! `ninefold serve`: the appliance's filesystem and 9P2000.L server as a Linux process,
//! over std TCP, for development, debugging and comparisons.
//!
//! It serves with the appliance's serving policy ([`ninep::service`]: admission, the
//! worker a connection goes to, its life and close, deadlines, shutdown, counters); what
//! is its own is the transport: a tokio listener, and worker threads (`--threads`,
//! default one per core) instead of CPUs. A worker is a single-threaded tokio runtime
//! whose connection tasks drive a [`ninep::conn::Connection`] over their socket: the
//! request futures are not `Send`, so a connection stays on the worker it was handed to.
//!
//! SIGTERM or SIGINT shuts it down as the power button does the appliance: the listener
//! closes, every connection is asked to close politely (requests in flight answered,
//! then FIN), those still open after half of `--shutdown-timeout` are reset, and the
//! image is unmounted cleanly.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Args, ValueEnum};
use metrics::document::{Rule, Schema};
use metrics::endpoint::{Report, Request};
use ninefs::surface::report::FsReport;
use ninefs::volume::{MountOptions, NineFs};
use ninep::admin::AdminFs;
use ninep::conn::Transport;
use ninep::server::export::{self, apply_quotas};
use ninep::server::{AccessConfig, Config, Export, Server, Squash, TenantLimits, Timeouts};
use ninep::service::report::NinepReport;
use ninep::service::stats::ServiceStats;
use ninep::service::{Admitted, Endpoint, Runtime, Service, ServiceConfig};
use testkit::model::ModelFs;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use vfs::{Clock, FileSystem, Timespec};

/// `ninefold serve` options.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Filesystem image to serve, or the legs of a mirrored volume (any order; the
    /// volume serves with legs missing, unless --refuse-degraded).
    #[arg(required_unless_present = "model", num_args = 1..)]
    images: Vec<PathBuf>,
    /// Refuse to serve a mirrored volume with a leg missing, failed or stale.
    #[arg(long)]
    refuse_degraded: bool,
    /// Address to listen on (port 0: any free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:5640")]
    listen: SocketAddr,
    /// Serve an empty in-memory reference filesystem instead of an image (development).
    #[arg(long, conflicts_with = "images")]
    model: bool,
    /// Open the image read-only; the implicit export refuses every change (`EROFS`).
    #[arg(long)]
    read_only: bool,
    /// Map users of the implicit export to the anonymous user: `root` (root_squash) or
    /// `all` (all_squash).
    #[arg(long, value_enum)]
    squash: Option<SquashArg>,
    /// uid of the implicit export's squashed users (default 65534).
    #[arg(long)]
    anon_uid: Option<u32>,
    /// gid of the implicit export's squashed users (default 65534).
    #[arg(long)]
    anon_gid: Option<u32>,
    /// Export directory PATH under aname NAME, as the kernel's `export=`; repeatable.
    /// OPTs: ro, rw, squash=root|all|none, anonuid=N, anongid=N, allow=CIDR[,CIDR...],
    /// quota=SIZE, inodes=N (the export's directory becomes a quota root: EDQUOT past
    /// them, Tstatfs shows them), weight=1..10000 (the tenant's CPU weight, default 100).
    /// Without any, the whole filesystem is exported at aname "".
    #[arg(long = "export", value_name = "NAME:PATH[:OPT]...")]
    exports: Vec<String>,
    /// Clients allowed by exports that name no allow=: CIDR[,CIDR...] or any. Others
    /// are disconnected at accept (when no export allows them) or refused at attach.
    #[arg(long, value_name = "CIDR[,CIDR...]", default_value = "any")]
    allow: String,
    /// Enable the administration export (aname `ctl`: files `ctl`, `status`, `scrub`)
    /// for these clients, as the kernel's `admin_allow=`. Off by default.
    #[arg(long, value_name = "CIDR[,CIDR...]")]
    admin_allow: Option<String>,
    /// Scrub passes started through `ctl` read at most this many MiB per second.
    #[arg(long, default_value_t = ninefs::features::redundancy::scrub::DEFAULT_SCRUB_RATE_MIB)]
    scrub_rate: u32,
    /// Most MiB per second each stream job of the administration export (`send`,
    /// `receive`) moves, as the kernel's `stream_rate=`.
    #[arg(long, default_value_t = ninefs::features::streams::jobs::DEFAULT_STREAM_RATE_MIB)]
    stream_rate: u32,
    /// Most MiB per second a rebuild copies onto a leg `ctl replace LEG IMAGE` put in
    /// place (or one the image records), as the kernel's `rebuild_rate=`.
    #[arg(long, default_value_t = ninefs::features::redundancy::rebuild::DEFAULT_REBUILD_RATE_MIB)]
    rebuild_rate: u32,
    /// KiB each stream job buffers between its client and the filesystem, as the
    /// kernel's `stream_buffer=`.
    #[arg(long, default_value_t = ninefs::features::streams::jobs::DEFAULT_STREAM_BUFFER >> 10)]
    stream_buffer_kib: usize,
    /// Group membership for permission checks, `UID:GID[,GID...]`; repeatable.
    #[arg(long = "group", value_name = "UID:GID[,GID...]")]
    groups: Vec<String>,
    /// Largest msize offered.
    #[arg(long, default_value_t = ninep::server::DEFAULT_MAX_MSIZE)]
    msize: u32,
    /// Most fids per connection.
    #[arg(long, default_value_t = Config::default().max_fids)]
    max_fids: usize,
    /// Most requests in flight per connection.
    #[arg(long, default_value_t = Config::default().max_in_flight)]
    max_in_flight: usize,
    /// Most POSIX locks per connection (`ENOLCK` beyond).
    #[arg(long, default_value_t = Config::default().max_locks_per_conn)]
    max_locks_per_conn: usize,
    /// Most POSIX locks of all connections together (`ENOLCK` beyond).
    #[arg(long, default_value_t = Config::default().max_locks)]
    max_locks: usize,
    /// Longest client id in a lock request, in bytes (`EINVAL` beyond).
    #[arg(long, default_value_t = Config::default().max_lock_client_id)]
    max_lock_client_id: usize,
    /// Most simultaneous connections; past it a new client takes the slot of the quietest
    /// connection without fids, or is closed at once.
    #[arg(long, default_value_t = 64)]
    max_connections: usize,
    /// Most simultaneous connections from one client address; more are closed at once.
    #[arg(long, default_value_t = ninep::server::DEFAULT_MAX_CONNS_PER_CLIENT)]
    max_connections_per_client: usize,
    /// Memory the server may spend on clients' behalf (frames, replies, fids, xattr
    /// values, locks), in MiB; a connection may use a quarter of it.
    #[arg(long, default_value_t = ninep::server::DEFAULT_MEMORY_LIMIT >> 20)]
    memory_mib: usize,
    /// Most simultaneous connections of one tenant (an export with its own allow=, else
    /// a client address; docs/9p.md "Tenants"); default: --max-connections (at the
    /// limit a tenant below its fair share takes a slot from the tenant most above).
    #[arg(long)]
    max_connections_per_tenant: Option<usize>,
    /// Most fids one tenant's connections may hold together (`EMFILE` beyond); default:
    /// 16 x --max-fids.
    #[arg(long)]
    max_fids_per_tenant: Option<usize>,
    /// Most POSIX locks one tenant may hold (`ENOLCK` beyond); default: a quarter of
    /// --max-locks.
    #[arg(long)]
    max_locks_per_tenant: Option<usize>,
    /// Most requests one tenant may have in flight; default: 16 x --max-in-flight.
    #[arg(long)]
    max_in_flight_per_tenant: Option<usize>,
    /// Memory one tenant's connections may hold together, in MiB; default: all of
    /// --memory-mib (a tenant below its fair share takes memory back from one above).
    #[arg(long)]
    memory_mib_per_tenant: Option<usize>,
    /// Seconds a new connection has to complete `Tversion`.
    #[arg(long, default_value_t = Timeouts::default().handshake_ns / NS_PER_SEC)]
    handshake_timeout: u64,
    /// Seconds after which a quiet connection without fids is closed.
    #[arg(long, default_value_t = Timeouts::default().idle_ns / NS_PER_SEC)]
    idle_timeout: u64,
    /// Memory for the filesystem's btree node cache, in MiB.
    #[arg(long, default_value_t = 64)]
    cache_mib: usize,
    /// Memory for cached file data, in MiB, besides what the node cache leaves unused
    /// (0: no data cache), as the kernel's `data_cache=`.
    #[arg(long, default_value_t = 64)]
    data_cache_mib: usize,
    /// The largest readahead window of a sequential reader, in KiB (0: no readahead),
    /// as the kernel's `readahead=`.
    #[arg(long, default_value_t = ninefs::volume::DEFAULT_READAHEAD >> 10)]
    readahead_kib: u64,
    /// Most snapshots the filesystem may hold (creating more fails with ENOSPC).
    #[arg(long, default_value_t = ninefs::features::snapshots::MAX_SNAPSHOTS)]
    max_snapshots: usize,
    /// Serve the counters here (`ADDR:PORT`; port 0: any free port, printed on the second
    /// line): JSON, `/metrics` for Prometheus, as the appliance's `stats=` port. Off
    /// unless given; it answers whoever reaches the address.
    #[arg(long, value_name = "ADDR:PORT")]
    stats: Option<SocketAddr>,
    /// Worker threads serving connections (each connection stays on one); default: one
    /// per core.
    #[arg(long)]
    threads: Option<usize>,
    /// Seconds a shutdown (SIGTERM, SIGINT) may take: connections get half of it to
    /// close politely, then are reset; as the appliance's `shutdown_timeout=`.
    #[arg(long, default_value_t = 30)]
    shutdown_timeout: u64,
    /// Log level: error, warn, info, debug, trace.
    #[arg(long, default_value = "info")]
    log_level: log::LevelFilter,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum SquashArg {
    None,
    Root,
    All,
}

const NS_PER_SEC: u64 = 1_000_000_000;
/// Readahead workers (as the appliance's): one device read in flight each.
const READAHEAD_WORKERS: usize = 4;

/// Nanoseconds on a monotonic clock (the server's request timings).
fn monotonic_ns() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

/// Wall-clock time for the filesystem.
#[derive(Debug)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timespec {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Timespec {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    }
}

impl ServeArgs {
    /// The server configuration the options describe (the access options through the
    /// kernel command line's parser).
    fn config(&self) -> Result<Config, String> {
        let mut access = AccessConfig::default();
        for spec in &self.exports {
            access
                .add_export(spec)
                .map_err(|e| format!("--export {spec}: {e}"))?;
        }
        access
            .set_allow(&self.allow)
            .map_err(|e| format!("--allow {}: {e}", self.allow))?;
        if let Some(list) = &self.admin_allow {
            access
                .set_admin_allow(list)
                .map_err(|e| format!("--admin-allow {list}: {e}"))?;
        }
        for spec in &self.groups {
            access
                .add_group(spec)
                .map_err(|e| format!("--group {spec}: {e}"))?;
        }
        let implicit_options =
            self.squash.is_some() || self.anon_uid.is_some() || self.anon_gid.is_some();
        if implicit_options && !self.exports.is_empty() {
            return Err(
                "--squash, --anon-uid and --anon-gid are for the implicit export; with --export give them as its options (squash=, anonuid=, anongid=)".into(),
            );
        }
        let mut implicit = Export::root("");
        implicit.read_only = self.read_only;
        implicit.squash = match self.squash {
            None | Some(SquashArg::None) => Squash::None,
            Some(SquashArg::Root) => Squash::Root,
            Some(SquashArg::All) => Squash::All,
        };
        implicit.anon_uid = self.anon_uid.unwrap_or(implicit.anon_uid);
        implicit.anon_gid = self.anon_gid.unwrap_or(implicit.anon_gid);
        let base = Config {
            max_msize: self.msize,
            max_fids: self.max_fids,
            max_in_flight: self.max_in_flight,
            max_conns_per_client: self.max_connections_per_client,
            max_locks_per_conn: self.max_locks_per_conn,
            max_locks: self.max_locks,
            max_lock_client_id: self.max_lock_client_id,
            clock: Some(monotonic_ns),
            timeouts: Timeouts {
                handshake_ns: self.handshake_timeout * NS_PER_SEC,
                idle_ns: self.idle_timeout * NS_PER_SEC,
                ..Timeouts::default()
            },
            ..Config::default()
        };
        let mut config = access.server_config(implicit, base);
        config.memory = config.memory_for(self.memory_mib << 20);
        if let Some(mib) = self.memory_mib_per_tenant {
            config.memory.per_tenant = mib << 20;
        }
        let tenant = &mut config.tenant;
        *tenant = TenantLimits::for_server(self.max_fids, self.max_in_flight, self.max_locks);
        tenant.max_fids = self.max_fids_per_tenant.unwrap_or(tenant.max_fids);
        tenant.max_locks = self.max_locks_per_tenant.unwrap_or(tenant.max_locks);
        tenant.max_in_flight = self
            .max_in_flight_per_tenant
            .unwrap_or(tenant.max_in_flight);
        Ok(config)
    }
}

/// Runs the server until SIGTERM or SIGINT, then shuts it down cleanly.
pub fn run(args: ServeArgs) -> Result<(), String> {
    env_logger::Builder::new()
        .filter_level(args.log_level)
        .format_timestamp_millis()
        .init();
    let mut config = args.config()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let local = tokio::task::LocalSet::new();
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let service_config = ServiceConfig {
        max_conns: args.max_connections,
        max_conns_per_tenant: args
            .max_connections_per_tenant
            .unwrap_or(args.max_connections),
        workers: threads.max(1),
        // The host's kernel runs TCP: no worker carries it.
        stack_worker: None,
        worker_noun: "thread",
    };
    let limit = std::time::Duration::from_secs(args.shutdown_timeout);
    if args.model {
        if config.exports.iter().any(|e| e.quota.is_some()) {
            return Err("quota= and inodes= need an image (the model keeps no quotas)".into());
        }
        let server = Arc::new(Server::new(ModelFs::new(SystemClock), config));
        log_exports(server.config());
        let service = Arc::new(Service::new(server, service_config));
        let counters = Counters::new(service.clone(), args.stats, || async { None });
        return serve(&runtime, &local, &service, args.listen, counters, limit);
    }
    let image = args.images[0].as_path();
    let disk = crate::image::open_volume(&args.images, !args.read_only)?
        .with_opener(crate::image::leg_opener(&args.images));
    let opts = MountOptions {
        read_only: args.read_only,
        refuse_degraded: args.refuse_degraded,
        cache_limit: args.cache_mib << 20,
        max_snapshots: args.max_snapshots,
        stream_buffer: args.stream_buffer_kib.max(1) << 10,
        data_cache: args.data_cache_mib << 20,
        readahead: args.readahead_kib << 10,
        ..MountOptions::default()
    };
    let fs = runtime
        .block_on(NineFs::mount(disk, opts, Box::new(SystemClock)))
        .map_err(|e| format!("{}: mount: {e}", image.display()))?;
    if fs.stats().legs > 0 {
        log::info!("{}", crate::image::describe_legs(fs.device()).trim_end());
    }
    log::info!("mounted {}", image.display());
    let quotas = runtime.block_on(apply_quotas(&fs, &mut config.exports));
    for (export, q) in quotas.map_err(|(export, e)| format!("export {export:?}: quota: {e}"))? {
        log::info!(
            "export {export:?}: quota {:?} bytes, {:?} inodes; holds {} bytes, {} inodes",
            q.limits.bytes,
            q.limits.inodes,
            q.bytes,
            q.inodes
        );
    }
    let server = Arc::new(Server::new(AdminFs::new(fs), config));
    log_exports(server.config());
    let service = Arc::new(Service::new(server.clone(), service_config));
    local.spawn_local(scrub_in_background(
        server.clone(),
        args.scrub_rate,
        args.stream_rate,
        args.rebuild_rate,
    ));
    // The stream jobs' workers wait for `ctl` (and then for their clients).
    let sender = server.clone();
    local.spawn_local(async move { sender.fs().inner().send_worker().await });
    let receiver = server.clone();
    local.spawn_local(async move { receiver.fs().inner().receive_worker().await });
    for _ in 0..READAHEAD_WORKERS {
        let reader = server.clone();
        local.spawn_local(async move { reader.fs().inner().readahead_worker().await });
    }
    let cache_limit = (args.cache_mib << 20) as u64;
    let counted = server.clone();
    let counters = Counters::new(service.clone(), args.stats, move || {
        let server = counted.clone();
        async move {
            let mut report = server.fs().inner().report(cache_limit).await;
            let exports = &server.config().exports;
            report.name_projects(|root| export::of_project(exports, root).map(|e| e.name.clone()));
            report.data_cache.name_tenants(|id| server.tenant_name(id));
            Some(report)
        }
    });
    let served = serve(&runtime, &local, &service, args.listen, counters, limit);
    drop(local);
    served?;
    // Every connection has ended (a request cut short by a reset was never answered,
    // so nothing it did was acknowledged): the image is unmounted cleanly, unlinked-but-
    // open files freed, a final checkpoint marked clean, nothing left in the log for the
    // next mount to replay.
    runtime
        .block_on(server.fs().inner().remount_read_only())
        .map_err(|e| format!("{}: unmount: {e}", image.display()))?;
    log::info!("unmounted {} cleanly", image.display());
    Ok(())
}

/// Serves `service` on `listen` until a stop signal, then closes every connection
/// (politely, reset after half of `limit`) and stops the workers.
fn serve<F, S, R>(
    runtime: &tokio::runtime::Runtime,
    local: &tokio::task::LocalSet,
    service: &Arc<Service<F>>,
    listen: SocketAddr,
    counters: Counters<F, S>,
    limit: std::time::Duration,
) -> Result<(), String>
where
    F: FileSystem + Send + Sync + 'static,
    S: Fn() -> R + 'static,
    R: std::future::Future<Output = Option<FsReport>> + 'static,
{
    let workers = Workers::start(service)?;
    let listened = local.block_on(runtime, self::listen(service, &workers, listen, counters));
    if listened.is_ok() {
        // Made inside the runtime: a tokio timer needs one.
        let drain = async { tokio::time::timeout(limit, service.drain(&Tokio, limit / 2)).await };
        match local.block_on(runtime, drain) {
            Ok(d) if d.shed > 0 => log::warn!(
                "9p: every connection closed: {} asked to close, {} had not finished after {} s and were reset",
                d.asked,
                d.shed,
                (limit / 2).as_secs()
            ),
            Ok(d) => log::info!("9p: every connection closed ({} asked to close)", d.asked),
            Err(_) => log::error!(
                "9p: connections still open after {} s (--shutdown-timeout); dropping them",
                limit.as_secs()
            ),
        }
    }
    workers.stop(service);
    service.log_stats();
    listened
}

/// Runs the scrub pass `ctl` starts, `rate_mib` MiB per second, grants the stream
/// jobs `stream_mib` MiB per second, and copies a rebuild's `rebuild_mib`.
async fn scrub_in_background<D: block::BlockDevice>(
    server: Arc<Server<AdminFs<NineFs<D>>>>,
    rate_mib: u32,
    stream_mib: u32,
    rebuild_mib: u32,
) {
    use ninefs::features::redundancy::rebuild::RebuildStep;
    use ninefs::features::redundancy::scrub::{budget_per_tick, SCRUB_TICK};
    let budget = budget_per_tick(rate_mib);
    let stream_budget = budget_per_tick(stream_mib);
    let rebuild_budget = budget_per_tick(rebuild_mib);
    let mut tick = tokio::time::interval(SCRUB_TICK);
    loop {
        tick.tick().await;
        let fs = server.fs().inner();
        fs.stream_grant(stream_budget);
        if fs.scrub_running() {
            if let Err(e) = fs.scrub_step(budget).await {
                log::warn!("scrub: {e}");
            }
        }
        if let Some(going) = fs.rebuild_progress() {
            match fs.rebuild_step(rebuild_budget).await {
                Ok(RebuildStep::Done) => log::info!("rebuild: leg {} done", going.place),
                Ok(_) => {}
                Err(e) => log::warn!("rebuild: leg {}: {e}", going.place),
            }
        }
    }
}

/// Logs what is exported, and to whom.
fn log_exports(config: &Config) {
    for e in &config.exports {
        log::info!("9p: export {e} (clients: {})", config.allow_list(e));
    }
}

/// Resolves when the process is asked to stop (SIGINT or SIGTERM).
async fn stop_requested() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            log::warn!("cannot watch SIGTERM ({e}); only SIGINT stops the server cleanly");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The host's tokio as the serving policy's [`Runtime`].
#[derive(Clone, Copy, Debug)]
struct Tokio;

impl Runtime for Tokio {
    fn sleep(&self, duration: std::time::Duration) -> impl std::future::Future<Output = ()> {
        tokio::time::sleep(duration)
    }
}

/// A connection for a worker: the accepted socket and its peer.
type Accepted = (std::net::TcpStream, SocketAddr, Admitted);

/// The threads that serve connections. See the module documentation.
struct Workers {
    workers: Vec<Worker>,
}

/// One worker thread: where its new connections go.
struct Worker {
    inbox: tokio::sync::mpsc::UnboundedSender<Accepted>,
    thread: JoinHandle<()>,
}

impl Workers {
    /// Starts `service.config().workers` worker threads serving its connections.
    fn start<F: FileSystem + Send + Sync + 'static>(
        service: &Arc<Service<F>>,
    ) -> Result<Workers, String> {
        let workers = (0..service.config().workers)
            .map(|i| {
                let (inbox, rx) = tokio::sync::mpsc::unbounded_channel();
                let service = service.clone();
                let thread = std::thread::Builder::new()
                    .name(format!("9p-worker-{i}"))
                    .spawn(move || work(service, i, rx))
                    .map_err(|e| format!("worker thread: {e}"))?;
                Ok(Worker { inbox, thread })
            })
            .collect::<Result<Vec<_>, String>>()?;
        log::info!("9p: {} worker thread(s)", workers.len());
        Ok(Workers { workers })
    }

    /// Hands a connection the service admitted to worker `worker`.
    fn hand_off<F: FileSystem + 'static>(
        &self,
        service: &Service<F>,
        worker: usize,
        accepted: Accepted,
    ) {
        if self.workers[worker].inbox.send(accepted).is_err() {
            // The worker's thread ended (it panicked): the socket is closed with it.
            service.abandon(worker);
        }
    }

    /// Ends every worker (their connections have ended, or are dropped with them).
    fn stop<F: FileSystem + 'static>(self, service: &Service<F>) {
        for (i, w) in self.workers.into_iter().enumerate() {
            log::info!(
                "9p: worker {i} served {} connection(s)",
                service.stats().worker(i).accepted.get()
            );
            drop(w.inbox);
            if w.thread.join().is_err() {
                log::error!("9p: a worker thread panicked");
            }
        }
    }
}

/// A worker thread's life: serves each connection it is handed as a local task until its
/// inbox closes, then drops those still open.
fn work<F: FileSystem + Send + Sync + 'static>(
    service: Arc<Service<F>>,
    worker: usize,
    mut inbox: tokio::sync::mpsc::UnboundedReceiver<Accepted>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            log::error!("9p: worker runtime: {e}");
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        while let Some((stream, peer, admitted)) = inbox.recv().await {
            let service = service.clone();
            tokio::task::spawn_local(async move {
                match Tcp::new(stream, service.stats().clone(), worker) {
                    Ok(io) => {
                        service.serve(&Tokio, io, Some(peer), admitted).await;
                    }
                    Err(e) => {
                        log::warn!("9p: {peer}: {e}");
                        service.abandon(worker);
                    }
                }
            });
        }
    });
}

/// Accepts connections and hands each the service admits to its worker, until a stop
/// signal arrives (then the service stops listening).
async fn listen<F, S, R>(
    service: &Arc<Service<F>>,
    workers: &Workers,
    address: SocketAddr,
    counters: Counters<F, S>,
) -> Result<(), String>
where
    F: FileSystem + Send + Sync + 'static,
    S: Fn() -> R + 'static,
    R: std::future::Future<Output = Option<FsReport>> + 'static,
{
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| format!("listen on {address}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    // Tests and scripts read the bound address from the first line.
    println!("listening on {bound}");
    log::info!("9p: serving on {bound}");
    if let Some(at) = counters.address {
        let endpoint = TcpListener::bind(at)
            .await
            .map_err(|e| format!("counters on {at}: {e}"))?;
        let bound = endpoint.local_addr().map_err(|e| e.to_string())?;
        // ... and the counters' from the second.
        println!("counters on {bound}");
        log::info!("stats: counters on {bound} (JSON; `stat`; GET /metrics for Prometheus)");
        tokio::task::spawn_local(counters.serve(endpoint));
    }
    tokio::task::spawn_local({
        let service = service.clone();
        async move { service.housekeeping(&Tokio).await }
    });
    let stop = stop_requested();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => {
                service.stop_listening();
                log::info!("9p: stop requested; {} connection(s) open", service.stats().active());
                return Ok(());
            }
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                log::warn!("9p: accept: {e}");
                continue;
            }
        };
        let admitted = match service.admit(Some(peer), 0..service.config().workers) {
            Ok(admitted) => admitted,
            Err(_) => {
                // Reset, as the appliance does: the client learns at once.
                let _ = stream.set_zero_linger();
                drop(stream);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let worker = admitted.worker;
        match stream.into_std() {
            Ok(stream) => workers.hand_off(service, worker, (stream, peer, admitted)),
            Err(e) => {
                log::warn!("9p: {peer}: {e}");
                service.abandon(worker);
            }
        }
    }
}

/// A tokio TCP stream as the serving policy's [`Endpoint`], counting its bytes in its
/// worker's counters.
struct Tcp {
    stream: TcpStream,
    stats: Arc<ServiceStats>,
    worker: usize,
    rx: u64,
    tx: u64,
    /// Our FIN is sent (the polite close's first half).
    shut: bool,
}

impl Tcp {
    /// Takes over an accepted socket on the worker that serves it.
    fn new(
        stream: std::net::TcpStream,
        stats: Arc<ServiceStats>,
        worker: usize,
    ) -> io::Result<Tcp> {
        stream.set_nonblocking(true)?;
        Ok(Tcp {
            stream: TcpStream::from_std(stream)?,
            stats,
            worker,
            rx: 0,
            tx: 0,
            shut: false,
        })
    }
}

impl Transport for Tcp {
    type Error = io::Error;

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        let mut rb = ReadBuf::new(buf);
        match Pin::new(&mut self.stream).poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) => {
                let n = rb.filled().len();
                self.rx += n as u64;
                self.stats.worker(self.worker).rx_bytes.add(n as u64);
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.tx += n as u64;
            self.stats.worker(self.worker).tx_bytes.add(n as u64);
        }
        r
    }
}

impl Endpoint for Tcp {
    fn close(&mut self) {
        // The FIN goes out in `poll_closed`, which can wait for the socket's buffer.
    }

    fn poll_closed(&mut self, cx: &mut Context<'_>, stopping: bool) -> Poll<()> {
        if !self.shut {
            match Pin::new(&mut self.stream).poll_shutdown(cx) {
                Poll::Pending => return Poll::Pending,
                // Sent, or the peer is gone: either way nothing more will go out.
                Poll::Ready(_) => self.shut = true,
            }
        }
        if stopping {
            return Poll::Ready(());
        }
        // The peer's FIN (or its reset) ends the close; what it still sends is dropped.
        let mut scratch = [0u8; 512];
        loop {
            let mut rb = ReadBuf::new(&mut scratch);
            match Pin::new(&mut self.stream).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if !rb.filled().is_empty() => continue,
                Poll::Ready(_) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    async fn abort(&mut self) {
        // Closing a socket that lingers for zero seconds resets it.
        let _ = self.stream.set_zero_linger();
    }

    fn was_reset(&mut self) -> bool {
        // A reset reads as an error, which the service counts as such.
        false
    }

    fn rx_bytes(&self) -> u64 {
        self.rx
    }

    fn tx_bytes(&self) -> u64 {
        self.tx
    }
}

/// The counters endpoint (`--stats`): the appliance's protocol (`metrics::endpoint`) over
/// the host's TCP, answering with this process's counters document.
struct Counters<F: FileSystem + 'static, S> {
    service: Arc<Service<F>>,
    address: Option<SocketAddr>,
    /// The filesystem's part of the document (none for `--model`).
    fs: S,
    started: std::time::Instant,
}

/// How long a client may take to send its request line; one that sends nothing gets the
/// JSON document after this (as the appliance's counters port).
const REQUEST_WAIT: std::time::Duration = std::time::Duration::from_millis(250);
/// How long sending an answer may take.
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `ninefold serve`'s counters document: its clock, the filesystem's part and the 9P
/// service's, as in the appliance's (`kernel/src/report.rs`), whose metrics rules for
/// those parts it shares.
#[derive(Debug, serde::Serialize)]
struct Document {
    /// Milliseconds since the server started.
    uptime_ms: u64,
    /// The mounted filesystem (absent for `--model`).
    #[serde(skip_serializing_if = "Option::is_none")]
    fs: Option<FsReport>,
    /// The 9P service.
    #[serde(rename = "9p")]
    ninep: NinepReport,
}

/// How the document becomes metrics: its own clock, then the parts' shared rules.
const METRICS: Schema<'static> = Schema {
    prefix: "ninefold",
    rules: &[
        &[Rule::gauge("uptime_ms")
            .named("uptime_seconds")
            .help("Time since the server started.")],
        ninefs::surface::report::METRIC_RULES,
        ninep::service::report::METRIC_RULES,
    ],
};

impl Report for Document {
    fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    fn stat_lines(&self) -> String {
        // No block devices of its own: the image is a file.
        String::new()
    }

    fn prometheus(&self) -> String {
        match serde_json::to_value(self) {
            Ok(document) => METRICS.walk(&document).exposition.render(),
            Err(e) => format!("# the counters could not be serialised: {e}\n"),
        }
    }
}

impl<F, S, R> Counters<F, S>
where
    F: FileSystem + 'static,
    S: Fn() -> R + 'static,
    R: std::future::Future<Output = Option<FsReport>> + 'static,
{
    fn new(service: Arc<Service<F>>, address: Option<SocketAddr>, fs: S) -> Self {
        Counters {
            service,
            address,
            fs,
            started: std::time::Instant::now(),
        }
    }

    /// The document now.
    async fn document(&self) -> Document {
        Document {
            uptime_ms: self.started.elapsed().as_millis() as u64,
            fs: (self.fs)().await,
            ninep: self.service.report(),
        }
    }

    /// Answers one client at a time, for as long as the server runs.
    async fn serve(self, listener: TcpListener) {
        loop {
            let (mut stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    log::warn!("stats: accept: {e}");
                    continue;
                }
            };
            let mut line = Vec::new();
            let mut buf = [0u8; 256];
            let _ = tokio::time::timeout(REQUEST_WAIT, async {
                while !line.contains(&b'\n') && line.len() < buf.len() {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => line.extend_from_slice(&buf[..n]),
                    }
                }
            })
            .await;
            let end = line.iter().position(|&b| b == b'\n').unwrap_or(line.len());
            let answer = Request::parse(&line[..end]).answer(&self.document().await);
            let sent = tokio::time::timeout(ANSWER_TIMEOUT, async {
                stream.write_all(&answer).await?;
                stream.shutdown().await
            })
            .await;
            if !matches!(sent, Ok(Ok(()))) {
                log::debug!("stats: {peer}: the answer was not taken");
            }
        }
    }
}
