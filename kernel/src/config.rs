//! The appliance's configuration, from the kernel command line (QEMU `-append`).
//!
//! Options are whitespace-separated `key=value` pairs or bare flags:
//!
//! | option | meaning | default |
//! |---|---|---|
//! | `log=off\|error\|warn\|info\|debug\|trace` | console log level | `info` |
//! | `ip=ADDR/PREFIX` or `ip=dhcp` | the NIC's IPv4 address | `dhcp` |
//! | `gw=ADDR` | default IPv4 gateway (static `ip=` only) | none |
//! | `port=N` | TCP port of the 9P server | `564` |
//! | `offload=on\|off` | negotiate the checksum and segmentation offloads the NIC offers (virtio-net CSUM, GUEST_CSUM, HOST_TSO4: a tap with `vnet_hdr`; QEMU user networking offers none); `off`: smoltcp computes and verifies every checksum and sends MSS-sized frames | `on` |
//! | `fs=disk\|memory` | what 9P serves: the filesystem on the disk, or the same filesystem on a RAM disk formatted at boot (development only: nothing is stored) | `disk` |
//! | `disk=nvme0\|virtio0\|BB:DD.F[,...]` | the block device holding the filesystem: the Nth NVMe or virtio-blk device in PCI order, or a PCI address (`[SSSS:]BB:DD.F`, hex); several: the legs of a mirrored volume made by `ninefold mkfs A B` (each put in the place its label names; one that does not come up is missing and the others serve, degraded; `mkfs` is refused for a mirror) | the first one found |
//! | `mkfs` | format the disk first if it holds no ninefold filesystem (a disk with a damaged one is refused) | off |
//! | `mkfs=force` | format the disk first, whatever it holds (erases it) | off |
//! | `fault=RULE[,RULE...]` | inject device errors into the `disk=` device (testing the error paths on real drivers; `block::Fault::parse`): `write:N`, `flush:N`, `read:N` (the Nth request), `writes:PPM`, `reads:PPM` (a fraction), `write-range:A-B`, `read-range:A-B`, `flip:A-B` (blocks), `flush-after:S`, `write-after:S` (every one from S seconds after boot) | off |
//! | `fault_seed=N` | seed of the random `fault=` rules | `1` |
//! | `discard=SECS\|off` | give freed blocks back to the disk (NVMe Deallocate, virtio-blk DISCARD) once their release is durable, committing it at most SECS after a deletion | `20` |
//! | `scrub_rate=MIB` | most MiB per second a scrub pass reads (1..=4096), so clients keep their latency | `16` |
//! | `stream_rate=MIB` | most MiB per second the `send` and `receive` jobs of the administration export each move (1..=4096), so clients keep their latency | `32` |
//! | `stream_buffer=KIB` | bytes each of those jobs buffers between its client and the filesystem (64..=65536 KiB): a send waits while it is full | `1024` |
//! | `scrub_interval=SECS\|off` | start a scrub pass every SECS seconds (60..=31536000) | `off` (passes start through `ctl`) |
//! | `degraded=serve\|refuse` | a mirrored volume with a leg missing or failed at mount: served with the legs that are there (saying so), or not mounted | `serve` |
//! | `rebuild_rate=MIB` | most MiB per second a rebuild copies onto a leg put in place by `ctl replace LEG DEVICE` (1..=4096) | `64` |
//! | `data_cache=MIB` | memory for cached file data, besides what the node cache leaves unused of its own (0: no data cache; `docs/filesystem.md`, "The data cache") | an eighth of the heap |
//! | `readahead=KIB\|off` | the largest readahead window of a sequential reader (64..=65536 KiB) | `4096` |
//! | `snapshots=N` | most snapshots the filesystem may hold (1..=32767); creating more fails with `ENOSPC` | `1024` |
//! | `stats=PORT\|off` | TCP port of the read-only counters service (JSON; `stat` for `/sys/block`-style lines) | `5641` |
//! | `msize=BYTES` | largest 9P message size offered (512..=16 MiB) | `1048576` |
//! | `max_conns=N` | most concurrent 9P connections (1..=1024) | `64` |
//! | `max_conns_per_client=N` | most concurrent 9P connections from one client address (1..=1024) | `16` |
//! | `max_fids=N` | most fids per connection | `4096` |
//! | `max_in_flight=N` | most requests outstanding per connection (1..=1024) | `128` |
//! | `client_mem=MIB` | memory the 9P server may spend on clients' behalf | a sixth of the heap |
//! | `max_conns_per_tenant=N` | most concurrent 9P connections of one tenant (an export with its own `allow=`, else a client address; `docs/9p.md`, "Tenants") (1..=1024); a tenant below its fair share at `max_conns` takes a slot from the tenant most above its own | `max_conns` |
//! | `max_fids_per_tenant=N` | most fids one tenant's connections may hold together | 16 × `max_fids` |
//! | `max_locks_per_tenant=N` | most POSIX locks one tenant may hold (of 32768 in all) | `8192` |
//! | `max_in_flight_per_tenant=N` | most requests one tenant may have in flight | 16 × `max_in_flight` |
//! | `client_mem_per_tenant=MIB` | memory of the client budget one tenant's connections may hold together (a tenant below its fair share takes memory back from one above whatever this says) | `client_mem` |
//! | `handshake_timeout=SECS` | time a new connection has to complete `Tversion` | `10` |
//! | `idle_timeout=SECS` | quiet time after which a connection without fids is closed | `60` |
//! | `selftest` | run the kernel self-checks, then power off (exit status tells the result) | off |
//! | `selftest=block` | run the block-device self-checks on every NVMe and virtio-blk device, then power off | off |
//! | `cpus=N` | most CPUs to run on (1..=16): the boot CPU and the first N-1 others the firmware lists; the rest stay halted | every CPU, up to 16 |
//! | `serve_cpus=LIST` | the CPUs that serve 9P connections, by index (`0-3`, `1,2`, `1-3,5`); each new connection goes to the one serving fewest, CPU 0's connections counting double (CPUs not online are skipped; none online: CPU 0) | every CPU online |
//! | `nvme=irq\|poll` | NVMe I/O completions by MSI-X interrupt or by polling | `irq` |
//! | `nvme_queues=N` | NVMe I/O queue pairs to ask the controller for (1..=64; it may grant fewer); a request goes to the pair of the CPU it is submitted on | one per CPU online |
//! | `bench=dev` | run the device benchmark on the `disk=` device (all disks without `disk=`), print results, power off | off |
//! | `benchtime=SECS` | seconds per benchmark workload | `10` |
//! | `crash=pagefault\|stackoverflow\|panic` | deliberately crash after boot (tests the fault reports) | off |
//! | `poweroff` | power off once boot is complete (for probes) | off |
//! | `shutdown_timeout=SECS` | longest clean shutdown after the ACPI power button (1..=3600): past it the appliance powers off anyway (the log keeps what was fsynced) | `30` |
//! | `export=NAME:PATH[:OPT]...` | export directory PATH under aname NAME (repeatable; NAME may be empty); OPT: `ro`, `rw`, `squash=root\|all\|none`, `anonuid=N`, `anongid=N`, `allow=CIDR[,CIDR...]`, `quota=SIZE`, `inodes=N` (the export's directory becomes a quota root: `EDQUOT` past them; `Tstatfs` shows them), `weight=1..10000` (the tenant's CPU weight, default 100) | the whole filesystem at aname `""` (only while no `export=` is given) |
//! | `allow=CIDR[,CIDR...]` | clients allowed by exports that name no `allow=` (`any`, an address, or a network) | `any` |
//! | `group=UID:GID[,GID...]` | a uid's groups for permission checks (repeatable) | none |
//! | `stats_allow=CIDR[,CIDR...]` | clients allowed on the counters port | the `allow=` list |
//! | `admin_allow=CIDR[,CIDR...]` | enable the administration export (aname `ctl`: files `ctl`, `status`, `scrub`) for these clients | off |
//!
//! The access options (the last five) are parsed by `ninep::server::access`, the same
//! parser as `ninefold serve`'s.
//!
//! Parsing is a pure function ([`Config::parse`]) that never fails: an unknown or malformed
//! option is reported through the callback and ignored (the default, or an earlier valid
//! occurrence, stays); a later valid occurrence overrides an earlier one. It allocates
//! (exports, allow-lists), so it runs once the heap exists; [`log_level`] reads just
//! `log=` for what is logged before.

use alloc::vec::Vec;
use core::fmt;
use core::net::Ipv4Addr;

use block::Fault;
use log::LevelFilter;
use ninep::server::AccessConfig;

use crate::drivers::nvme::MAX_IO_QUEUES;
use crate::pci::PciAddress;

/// The default console log level (`log=`).
pub const DEFAULT_LOG: LevelFilter = LevelFilter::Info;

/// The default limit of a clean shutdown, in seconds (`shutdown_timeout=`).
pub const DEFAULT_SHUTDOWN_SECONDS: u32 = 30;

/// The default TCP port of the 9P server.
pub const DEFAULT_9P_PORT: u16 = 564;

/// How the NIC gets its IPv4 address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpConfig {
    /// Ask a DHCP server.
    Dhcp,
    /// A fixed address with its prefix length.
    Static {
        /// The address.
        addr: Ipv4Addr,
        /// Prefix length, 0..=32.
        prefix: u8,
    },
}

/// Which block device to put the filesystem on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskSelector {
    /// The Nth NVMe controller in PCI order (`nvme0` is the first).
    Nvme(u8),
    /// The Nth virtio-blk device in PCI order.
    VirtioBlk(u8),
    /// The device at this PCI address.
    Pci(PciAddress),
}

/// What the 9P service serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsSource {
    /// The filesystem on the block device.
    Disk,
    /// The filesystem on a RAM disk formatted at boot: for developing and testing
    /// the network side; nothing survives a reboot.
    Memory,
}

/// A deliberate crash, to test the fault reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crash {
    /// Read from an unmapped address.
    PageFault,
    /// Recurse until the stack's guard page is hit.
    StackOverflow,
    /// Call `panic!`.
    Panic,
}

/// Whether to format the disk before mounting it (`mkfs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mkfs {
    /// Never: a disk without a filesystem is reported and left alone.
    Off,
    /// Format a disk that holds no ninefold filesystem at all (no superblock magic in
    /// either copy); a damaged filesystem is still refused.
    IfBlank,
    /// Format whatever the disk holds.
    Force,
}

/// The default IP MTU of the NIC (`mtu=`): standard Ethernet.
pub const DEFAULT_MTU: u16 = 1500;
/// The largest IP MTU `mtu=` accepts (jumbo frames).
pub const MAX_MTU: u16 = 9000;

/// The default TCP port of the counters service (`stats=`).
pub const DEFAULT_STATS_PORT: u16 = 5641;

/// Default seconds per benchmark workload.
pub const DEFAULT_BENCH_SECONDS: u32 = 10;

/// The 9P service's limits (`msize=`, `max_conns=`, ...): what one client may make the
/// appliance hold. See `docs/9p.md` for what happens at each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NinepLimits {
    /// Largest msize offered.
    pub msize: u32,
    /// Most concurrent connections.
    pub max_conns: usize,
    /// Most concurrent connections from one client address.
    pub max_conns_per_client: usize,
    /// Most fids per connection.
    pub max_fids: usize,
    /// Most requests outstanding per connection.
    pub max_in_flight: usize,
    /// The client memory budget in MiB; `None`: sized from the heap.
    pub client_mem_mib: Option<u32>,
    /// Most concurrent connections of one tenant; `None`: `max_conns`.
    pub max_conns_per_tenant: Option<usize>,
    /// Most fids of one tenant; `None`: 16 × `max_fids`.
    pub max_fids_per_tenant: Option<usize>,
    /// Most POSIX locks of one tenant; `None`: a quarter of the lock table.
    pub max_locks_per_tenant: Option<usize>,
    /// Most requests in flight of one tenant; `None`: 16 × `max_in_flight`.
    pub max_in_flight_per_tenant: Option<usize>,
    /// Memory of one tenant, MiB; `None`: the whole budget.
    pub client_mem_per_tenant_mib: Option<u32>,
    /// Seconds a new connection has to complete `Tversion`.
    pub handshake_secs: u32,
    /// Seconds of quiet after which a connection without fids is closed.
    pub idle_secs: u32,
}

impl Default for NinepLimits {
    fn default() -> Self {
        NinepLimits {
            msize: 1 << 20,
            max_conns: 64,
            max_conns_per_client: ninep::server::DEFAULT_MAX_CONNS_PER_CLIENT,
            max_fids: 4096,
            max_in_flight: 128,
            client_mem_mib: None,
            max_conns_per_tenant: None,
            max_fids_per_tenant: None,
            max_locks_per_tenant: None,
            max_in_flight_per_tenant: None,
            client_mem_per_tenant_mib: None,
            handshake_secs: 10,
            idle_secs: 60,
        }
    }
}

impl NinepLimits {
    /// Applies `key=value` if it is one of these limits: `Ok(false)` if it is not.
    fn apply(&mut self, key: &str, value: Option<&str>) -> Result<bool, Option<&'static str>> {
        const KEYS: [&str; 13] = [
            "msize",
            "max_conns",
            "max_conns_per_client",
            "max_fids",
            "max_in_flight",
            "client_mem",
            "max_conns_per_tenant",
            "max_fids_per_tenant",
            "max_locks_per_tenant",
            "max_in_flight_per_tenant",
            "client_mem_per_tenant",
            "handshake_timeout",
            "idle_timeout",
        ];
        if !KEYS.contains(&key) {
            return Ok(false);
        }
        let value = value
            .filter(|v| !v.is_empty())
            .ok_or(Some("needs a value"))?;
        match key {
            "msize" => {
                self.msize = number(value, 512..=16 << 20, "expected 512 to 16777216 bytes")?
            }
            "max_conns" => self.max_conns = number(value, 1..=1024, "expected 1 to 1024")?,
            "max_conns_per_client" => {
                self.max_conns_per_client = number(value, 1..=1024, "expected 1 to 1024")?
            }
            "max_fids" => self.max_fids = number(value, 1..=1 << 20, "expected 1 to 1048576")?,
            "max_in_flight" => self.max_in_flight = number(value, 1..=1024, "expected 1 to 1024")?,
            "client_mem" => {
                self.client_mem_mib = Some(number(value, 1..=1 << 20, "expected a size in MiB")?)
            }
            "max_conns_per_tenant" => {
                self.max_conns_per_tenant = Some(number(value, 1..=1024, "expected 1 to 1024")?)
            }
            "max_fids_per_tenant" => {
                self.max_fids_per_tenant =
                    Some(number(value, 1..=1 << 24, "expected 1 to 16777216")?)
            }
            "max_locks_per_tenant" => {
                self.max_locks_per_tenant =
                    Some(number(value, 1..=1 << 20, "expected 1 to 1048576")?)
            }
            "max_in_flight_per_tenant" => {
                self.max_in_flight_per_tenant =
                    Some(number(value, 1..=1 << 16, "expected 1 to 65536")?)
            }
            "client_mem_per_tenant" => {
                self.client_mem_per_tenant_mib =
                    Some(number(value, 1..=1 << 20, "expected a size in MiB")?)
            }
            "handshake_timeout" => {
                self.handshake_secs = number(value, 1..=86_400, "expected 1 to 86400 seconds")?
            }
            "idle_timeout" => self.idle_secs = number(value, 1..=86_400 * 7, "expected seconds")?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl fmt::Display for NinepLimits {
    /// The limits that differ from their defaults, in command-line syntax.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = NinepLimits::default();
        if self.msize != d.msize {
            write!(f, " msize={}", self.msize)?;
        }
        if self.max_conns != d.max_conns {
            write!(f, " max_conns={}", self.max_conns)?;
        }
        if self.max_conns_per_client != d.max_conns_per_client {
            write!(f, " max_conns_per_client={}", self.max_conns_per_client)?;
        }
        if self.max_fids != d.max_fids {
            write!(f, " max_fids={}", self.max_fids)?;
        }
        if self.max_in_flight != d.max_in_flight {
            write!(f, " max_in_flight={}", self.max_in_flight)?;
        }
        if let Some(m) = self.client_mem_mib {
            write!(f, " client_mem={m}")?;
        }
        if let Some(n) = self.max_conns_per_tenant {
            write!(f, " max_conns_per_tenant={n}")?;
        }
        if let Some(n) = self.max_fids_per_tenant {
            write!(f, " max_fids_per_tenant={n}")?;
        }
        if let Some(n) = self.max_locks_per_tenant {
            write!(f, " max_locks_per_tenant={n}")?;
        }
        if let Some(n) = self.max_in_flight_per_tenant {
            write!(f, " max_in_flight_per_tenant={n}")?;
        }
        if let Some(m) = self.client_mem_per_tenant_mib {
            write!(f, " client_mem_per_tenant={m}")?;
        }
        if self.handshake_secs != d.handshake_secs {
            write!(f, " handshake_timeout={}", self.handshake_secs)?;
        }
        if self.idle_secs != d.idle_secs {
            write!(f, " idle_timeout={}", self.idle_secs)?;
        }
        Ok(())
    }
}

/// A benchmark to run instead of serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bench {
    /// Raw block-device workloads on the disk (`bench=dev`).
    Device,
}

/// The effective configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Console log level.
    pub log: LevelFilter,
    /// IPv4 address configuration.
    pub ip: IpConfig,
    /// Default gateway.
    pub gateway: Option<Ipv4Addr>,
    /// TCP port of the 9P server.
    pub port: u16,
    /// IP MTU of the NIC: the largest IP packet sent, and the receive buffers' size.
    pub mtu: u16,
    /// Negotiate the NIC's checksum and segmentation offloads (`offload=`).
    pub offload: bool,
    /// What the 9P service serves.
    pub fs: FsSource,
    /// The block device for the filesystem; `None` picks the first one found.
    pub disk: Option<DiskSelector>,
    /// The other legs of a mirrored volume (`disk=A,B,...`: `disk` is A).
    pub mirror: Vec<DiskSelector>,
    /// Format the disk before mounting it.
    pub mkfs: Mkfs,
    /// TCP port of the counters service; `None`: off.
    pub stats_port: Option<u16>,
    /// The 9P service's limits.
    pub ninep: NinepLimits,
    /// Run the self-checks and power off.
    pub selftest: bool,
    /// Run the block-device self-checks and power off.
    pub selftest_block: bool,
    /// Poll for NVMe completions instead of taking interrupts.
    pub nvme_poll: bool,
    /// NVMe I/O queue pairs to ask for (`nvme_queues=`); `None`: the driver's default.
    pub nvme_queues: Option<u16>,
    /// Run a benchmark and power off.
    pub bench: Option<Bench>,
    /// Seconds per benchmark workload.
    pub bench_seconds: u32,
    /// Crash deliberately after boot.
    pub crash: Option<Crash>,
    /// Power off once boot is complete.
    pub poweroff: bool,
    /// Longest the shutdown after a power-button press may take, in seconds.
    pub shutdown_secs: u32,
    /// Exports, client allow-lists (9P and counters port) and group membership.
    pub access: AccessConfig,
    /// Device errors to inject into the disk (`fault=`).
    pub faults: Vec<Fault>,
    /// Seed of the random fault rules (`fault_seed=`).
    pub fault_seed: u64,
    /// Seconds after a deletion by which freed blocks are discarded; `None`: never
    /// (`discard=`).
    pub discard_secs: Option<u32>,
    /// Most MiB per second a scrub pass reads (`scrub_rate=`).
    pub scrub_rate_mib: u32,
    /// Seconds between scrub passes started by the appliance; `None`: only `ctl` starts
    /// them (`scrub_interval=`).
    pub scrub_interval_secs: Option<u32>,
    /// Most MiB per second each stream job (`send`, `receive`) moves (`stream_rate=`).
    pub stream_rate_mib: u32,
    /// Bytes each stream job buffers (`stream_buffer=`, in KiB).
    pub stream_buffer: usize,
    /// Most snapshots the filesystem may hold (`snapshots=`).
    pub max_snapshots: usize,
    /// A mirrored volume with a leg missing or failed is not served (`degraded=refuse`).
    pub refuse_degraded: bool,
    /// Most MiB per second a rebuild after `ctl replace` copies (`rebuild_rate=`).
    pub rebuild_rate_mib: u32,
    /// MiB of the data cache (`data_cache=`; 0: none); `None`: sized from the heap.
    pub data_cache_mib: Option<u32>,
    /// The largest readahead window in bytes (`readahead=`, in KiB; 0: `off`).
    pub readahead: u64,
    /// Most CPUs to run on (`cpus=`); `None`: all, up to [`MAX_CPUS`].
    pub cpus: Option<usize>,
    /// The CPUs that serve 9P connections (`serve_cpus=`); `None`: every CPU online.
    pub serve_cpus: Option<CpuMask>,
}

/// A set of CPUs by index (below [`MAX_CPUS`]), as `serve_cpus=` writes it: indices and
/// ranges separated by commas (`0-3`, `1,2`, `1-3,5`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuMask(u16);

impl CpuMask {
    /// Parses `0-3`, `1,2`, `1-3,5`: at least one CPU, each below [`MAX_CPUS`].
    pub fn parse(v: &str) -> Result<CpuMask, &'static str> {
        const WHY: &str = "expected CPU indices 0-15 and ranges, e.g. 1-3 or 0,2";
        let index = |s: &str| s.parse::<usize>().ok().filter(|&i| i < MAX_CPUS).ok_or(WHY);
        let mut mask = 0u16;
        for part in v.split(',') {
            let (first, last) = match part.split_once('-') {
                Some((a, b)) => (index(a)?, index(b)?),
                None => (index(part)?, index(part)?),
            };
            if first > last {
                return Err(WHY);
            }
            for cpu in first..=last {
                mask |= 1 << cpu;
            }
        }
        Ok(CpuMask(mask))
    }

    /// Whether CPU `cpu` is in the set.
    pub fn contains(&self, cpu: usize) -> bool {
        cpu < MAX_CPUS && self.0 & (1 << cpu) != 0
    }
}

impl fmt::Display for CpuMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut cpu = 0;
        let mut first = true;
        while cpu < MAX_CPUS {
            if !self.contains(cpu) {
                cpu += 1;
                continue;
            }
            let start = cpu;
            while cpu + 1 < MAX_CPUS && self.contains(cpu + 1) {
                cpu += 1;
            }
            f.write_str(if first { "" } else { "," })?;
            match cpu - start {
                0 => write!(f, "{start}")?,
                _ => write!(f, "{start}-{cpu}")?,
            }
            first = false;
            cpu += 1;
        }
        Ok(())
    }
}

/// `v` as a number within `range`, or `why` it is not.
fn number<T: core::str::FromStr + PartialOrd>(
    v: &str,
    range: core::ops::RangeInclusive<T>,
    why: &'static str,
) -> Result<T, Option<&'static str>> {
    v.parse()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or(Some(why))
}

/// The most CPUs the kernel runs on; others the firmware reports stay halted.
pub const MAX_CPUS: usize = 16;

/// Default of [`Config::discard_secs`].
pub const DEFAULT_DISCARD_SECS: u32 = 20;

/// Default of [`Config::fault_seed`].
pub const DEFAULT_FAULT_SEED: u64 = 1;

impl Default for Config {
    fn default() -> Self {
        Config {
            log: DEFAULT_LOG,
            ip: IpConfig::Dhcp,
            gateway: None,
            port: DEFAULT_9P_PORT,
            mtu: DEFAULT_MTU,
            offload: true,
            fs: FsSource::Disk,
            disk: None,
            mirror: Vec::new(),
            mkfs: Mkfs::Off,
            stats_port: Some(DEFAULT_STATS_PORT),
            ninep: NinepLimits::default(),
            selftest: false,
            selftest_block: false,
            nvme_poll: false,
            nvme_queues: None,
            bench: None,
            bench_seconds: DEFAULT_BENCH_SECONDS,
            crash: None,
            poweroff: false,
            shutdown_secs: DEFAULT_SHUTDOWN_SECONDS,
            access: AccessConfig::default(),
            faults: Vec::new(),
            fault_seed: DEFAULT_FAULT_SEED,
            discard_secs: Some(DEFAULT_DISCARD_SECS),
            scrub_rate_mib: ninefs::features::redundancy::scrub::DEFAULT_SCRUB_RATE_MIB,
            scrub_interval_secs: None,
            stream_rate_mib: ninefs::features::streams::jobs::DEFAULT_STREAM_RATE_MIB,
            stream_buffer: ninefs::features::streams::jobs::DEFAULT_STREAM_BUFFER,
            max_snapshots: ninefs::features::snapshots::MAX_SNAPSHOTS,
            refuse_degraded: false,
            rebuild_rate_mib: ninefs::features::redundancy::rebuild::DEFAULT_REBUILD_RATE_MIB,
            data_cache_mib: None,
            readahead: ninefs::volume::DEFAULT_READAHEAD,
            cpus: None,
            serve_cpus: None,
        }
    }
}

/// A command-line option that was ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ignored<'a> {
    /// No such option.
    Unknown(&'a str),
    /// A known option with a value it cannot take.
    Malformed {
        /// The whole option as written.
        option: &'a str,
        /// What is wrong.
        reason: &'static str,
    },
}

impl fmt::Display for Ignored<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ignored::Unknown(opt) => write!(f, "unknown option `{opt}` ignored"),
            Ignored::Malformed { option, reason } => {
                write!(f, "malformed option `{option}` ignored: {reason}")
            }
        }
    }
}

impl Config {
    /// Parses a command line, reporting each ignored option to `ignored`.
    pub fn parse<'a>(cmdline: &'a str, mut ignored: impl FnMut(Ignored<'a>)) -> Config {
        let mut config = Config::default();
        for option in cmdline.split_ascii_whitespace() {
            if let Err(reason) = config.apply(option) {
                ignored(match reason {
                    None => Ignored::Unknown(option),
                    Some(reason) => Ignored::Malformed { option, reason },
                });
            }
        }
        if config.gateway.is_some() && config.ip == IpConfig::Dhcp {
            ignored(Ignored::Malformed {
                option: "gw",
                reason: "a gateway needs a static ip= (DHCP supplies its own)",
            });
            config.gateway = None;
        }
        config
    }

    /// Applies one option. `Err(None)`: unknown; `Err(Some(why))`: malformed.
    fn apply(&mut self, option: &str) -> Result<(), Option<&'static str>> {
        fn need(v: Option<&str>) -> Result<&str, Option<&'static str>> {
            v.filter(|v| !v.is_empty()).ok_or(Some("needs a value"))
        }
        let (key, value) = match option.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (option, None),
        };
        match key {
            "log" => self.log = parse_level(need(value)?)?,
            "ip" => self.ip = parse_ip(need(value)?)?,
            // `none` and `auto` below are what the effective configuration prints for
            // the defaults (the `config` event): that line parses back to itself.
            "gw" => {
                self.gateway = match need(value)? {
                    "none" => None,
                    v => Some(v.parse().map_err(|_| Some("not an IPv4 address or none"))?),
                }
            }
            "port" => self.port = parse_port(need(value)?)?,
            "mtu" => {
                self.mtu = need(value)?
                    .parse()
                    .ok()
                    .filter(|m| (576..=MAX_MTU).contains(m))
                    .ok_or(Some("expected an MTU from 576 to 9000"))?
            }
            "offload" => {
                self.offload = match need(value)? {
                    "on" => true,
                    "off" => false,
                    _ => return Err(Some("expected on or off")),
                }
            }
            "stats" => {
                self.stats_port = match need(value)? {
                    "off" => None,
                    v => Some(parse_port(v)?),
                }
            }
            "mkfs" => {
                self.mkfs = match value {
                    None => Mkfs::IfBlank,
                    Some("force") => Mkfs::Force,
                    Some(_) => return Err(Some("expected mkfs or mkfs=force")),
                }
            }
            "disk" if value == Some("auto") => {
                self.disk = None;
                self.mirror.clear();
            }
            "disk" => {
                let legs = need(value)?.split(',').map(parse_disk);
                let mut legs = legs.collect::<Result<Vec<_>, _>>()?;
                self.disk = Some(legs.remove(0));
                self.mirror = legs;
            }
            "fs" => {
                self.fs = match need(value)? {
                    "disk" => FsSource::Disk,
                    "memory" => FsSource::Memory,
                    _ => return Err(Some("expected disk or memory")),
                }
            }
            "crash" => {
                self.crash = Some(match need(value)? {
                    "pagefault" => Crash::PageFault,
                    "stackoverflow" => Crash::StackOverflow,
                    "panic" => Crash::Panic,
                    _ => return Err(Some("expected pagefault, stackoverflow or panic")),
                })
            }
            "selftest" if value.is_some() => match value {
                Some("block") => self.selftest_block = true,
                _ => return Err(Some("expected selftest (kernel checks) or selftest=block")),
            },
            "nvme" => {
                self.nvme_poll = match need(value)? {
                    "poll" => true,
                    "irq" => false,
                    _ => return Err(Some("expected irq or poll")),
                }
            }
            "nvme_queues" => {
                self.nvme_queues = Some(number(
                    need(value)?,
                    1..=MAX_IO_QUEUES,
                    "expected 1-64 queue pairs",
                )?)
            }
            "benchtime" => {
                self.bench_seconds = need(value)?
                    .parse()
                    .ok()
                    .filter(|s| (1..=3600).contains(s))
                    .ok_or(Some("expected 1-3600 seconds"))?
            }
            "shutdown_timeout" => {
                self.shutdown_secs = need(value)?
                    .parse()
                    .ok()
                    .filter(|s| (1..=3600).contains(s))
                    .ok_or(Some("expected 1-3600 seconds"))?
            }
            "bench" => {
                self.bench = match need(value)? {
                    "dev" => Some(Bench::Device),
                    _ => return Err(Some("expected dev")),
                }
            }
            "fault" => {
                for rule in need(value)?.split(',') {
                    self.faults.push(Fault::parse(rule).map_err(Some)?);
                }
            }
            "discard" => {
                self.discard_secs = match need(value)? {
                    "off" => None,
                    v => Some(
                        v.parse()
                            .ok()
                            .filter(|s| (1..=3600).contains(s))
                            .ok_or(Some("expected off or 1-3600 seconds"))?,
                    ),
                }
            }
            "rebuild_rate" => {
                self.rebuild_rate_mib = need(value)?
                    .parse()
                    .ok()
                    .filter(|r| (1..=4096).contains(r))
                    .ok_or(Some("expected 1-4096 MiB per second"))?
            }
            "scrub_rate" => {
                self.scrub_rate_mib = need(value)?
                    .parse()
                    .ok()
                    .filter(|r| (1..=4096).contains(r))
                    .ok_or(Some("expected 1-4096 MiB per second"))?
            }
            "stream_rate" => {
                self.stream_rate_mib = need(value)?
                    .parse()
                    .ok()
                    .filter(|r| (1..=4096).contains(r))
                    .ok_or(Some("expected 1-4096 MiB per second"))?
            }
            "data_cache" => {
                self.data_cache_mib =
                    Some(number(need(value)?, 0..=1 << 20, "expected a size in MiB")?)
            }
            "readahead" => {
                self.readahead = match need(value)? {
                    "off" => 0,
                    v => number::<u64>(v, 64..=65536, "expected off or 64-65536 KiB")? << 10,
                }
            }
            "stream_buffer" => {
                let kib: usize = number(need(value)?, 64..=65536, "expected 64-65536 KiB")?;
                self.stream_buffer = kib << 10;
            }
            "scrub_interval" => {
                self.scrub_interval_secs = match need(value)? {
                    "off" => None,
                    v => Some(
                        v.parse()
                            .ok()
                            .filter(|s| (60..=31_536_000).contains(s))
                            .ok_or(Some("expected off or 60-31536000 seconds"))?,
                    ),
                }
            }
            "cpus" => self.cpus = Some(number(need(value)?, 1..=MAX_CPUS, "expected 1-16")?),
            "serve_cpus" => self.serve_cpus = Some(CpuMask::parse(need(value)?).map_err(Some)?),
            "snapshots" => {
                self.max_snapshots = number(need(value)?, 1..=32767, "expected 1-32767")?
            }
            "degraded" => {
                self.refuse_degraded = match need(value)? {
                    "serve" => false,
                    "refuse" => true,
                    _ => return Err(Some("expected serve or refuse")),
                }
            }
            "fault_seed" => {
                self.fault_seed = need(value)?
                    .parse()
                    .map_err(|_| Some("expected a number"))?
            }
            "export" => self.access.add_export(need(value)?)?,
            "allow" => self.access.set_allow(need(value)?)?,
            "group" => self.access.add_group(need(value)?)?,
            "stats_allow" => self.access.set_stats_allow(need(value)?)?,
            "admin_allow" => self.access.set_admin_allow(need(value)?)?,
            "selftest" | "poweroff" => {
                if value.is_some() {
                    return Err(Some("is a flag and takes no value"));
                }
                match key {
                    "selftest" => self.selftest = true,
                    _ => self.poweroff = true,
                }
            }
            _ => {
                if !self.ninep.apply(key, value)? {
                    return Err(None);
                }
            }
        }
        Ok(())
    }
}

/// The console log level `cmdline` asks for, as [`Config::parse`] would find it (the
/// last valid `log=`), without allocating: for the lines logged before the heap exists.
pub fn log_level(cmdline: &str) -> LevelFilter {
    cmdline
        .split_ascii_whitespace()
        .rev()
        .find_map(|option| parse_level(option.strip_prefix("log=")?).ok())
        .unwrap_or(DEFAULT_LOG)
}

fn parse_port(v: &str) -> Result<u16, Option<&'static str>> {
    let port: u16 = v.parse().map_err(|_| Some("not a port number (1-65535)"))?;
    if port == 0 {
        return Err(Some("port 0 is not a port"));
    }
    Ok(port)
}

fn parse_level(v: &str) -> Result<LevelFilter, Option<&'static str>> {
    v.parse()
        .map_err(|_| Some("expected off, error, warn, info, debug or trace"))
}

fn level_name(level: LevelFilter) -> &'static str {
    match level {
        LevelFilter::Off => "off",
        LevelFilter::Error => "error",
        LevelFilter::Warn => "warn",
        LevelFilter::Info => "info",
        LevelFilter::Debug => "debug",
        LevelFilter::Trace => "trace",
    }
}

fn parse_ip(v: &str) -> Result<IpConfig, Option<&'static str>> {
    if v == "dhcp" {
        return Ok(IpConfig::Dhcp);
    }
    let (addr, prefix) = v
        .split_once('/')
        .ok_or(Some("expected ADDR/PREFIX or dhcp"))?;
    let addr = addr.parse().map_err(|_| Some("not an IPv4 address"))?;
    let prefix = prefix
        .parse::<u8>()
        .ok()
        .filter(|p| *p <= 32)
        .ok_or(Some("prefix length must be 0-32"))?;
    Ok(IpConfig::Static { addr, prefix })
}

impl DiskSelector {
    /// A selector as `disk=` and `ctl replace` write it: `nvmeN`, `virtioN` or a PCI
    /// address.
    pub fn parse(v: &str) -> Result<DiskSelector, &'static str> {
        parse_disk(v).map_err(|e| e.unwrap_or("expected a device"))
    }
}

fn parse_disk(v: &str) -> Result<DiskSelector, Option<&'static str>> {
    let index = |s: &str| s.parse::<u8>().map_err(|_| Some("bad device number"));
    if let Some(n) = v.strip_prefix("nvme") {
        return Ok(DiskSelector::Nvme(index(n)?));
    }
    if let Some(n) = v.strip_prefix("virtio") {
        return Ok(DiskSelector::VirtioBlk(index(n)?));
    }
    v.parse::<PciAddress>()
        .map(DiskSelector::Pci)
        .map_err(|_| Some("expected nvmeN, virtioN or a PCI address BB:DD.F"))
}

impl fmt::Display for IpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpConfig::Dhcp => f.write_str("dhcp"),
            IpConfig::Static { addr, prefix } => write!(f, "{addr}/{prefix}"),
        }
    }
}

impl fmt::Display for DiskSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiskSelector::Nvme(n) => write!(f, "nvme{n}"),
            DiskSelector::VirtioBlk(n) => write!(f, "virtio{n}"),
            DiskSelector::Pci(a) => write!(f, "{a}"),
        }
    }
}

/// One line, in command-line syntax: what the appliance will actually do.
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "log={} ip={}", level_name(self.log), self.ip)?;
        match self.gateway {
            Some(gw) => write!(f, " gw={gw}")?,
            None => f.write_str(" gw=none")?,
        }
        write!(f, " port={}", self.port)?;
        if self.mtu != DEFAULT_MTU {
            write!(f, " mtu={}", self.mtu)?;
        }
        if !self.offload {
            f.write_str(" offload=off")?;
        }
        match self.disk {
            Some(d) => {
                write!(f, " disk={d}")?;
                for leg in &self.mirror {
                    write!(f, ",{leg}")?;
                }
            }
            None => f.write_str(" disk=auto")?,
        }
        if self.fs == FsSource::Memory {
            f.write_str(" fs=memory")?;
        }
        match self.mkfs {
            Mkfs::Off => {}
            Mkfs::IfBlank => f.write_str(" mkfs")?,
            Mkfs::Force => f.write_str(" mkfs=force")?,
        }
        match self.stats_port {
            Some(DEFAULT_STATS_PORT) => {}
            Some(p) => write!(f, " stats={p}")?,
            None => f.write_str(" stats=off")?,
        }
        write!(f, "{}", self.ninep)?;
        if self.nvme_poll {
            f.write_str(" nvme=poll")?;
        }
        if let Some(n) = self.nvme_queues {
            write!(f, " nvme_queues={n}")?;
        }
        if self.selftest {
            f.write_str(" selftest")?;
        }
        if self.selftest_block {
            f.write_str(" selftest=block")?;
        }
        if self.bench == Some(Bench::Device) {
            f.write_str(" bench=dev")?;
        }
        if self.bench_seconds != DEFAULT_BENCH_SECONDS {
            write!(f, " benchtime={}", self.bench_seconds)?;
        }
        if self.poweroff {
            f.write_str(" poweroff")?;
        }
        if self.shutdown_secs != DEFAULT_SHUTDOWN_SECONDS {
            write!(f, " shutdown_timeout={}", self.shutdown_secs)?;
        }
        if let Some(c) = self.crash {
            let name = match c {
                Crash::PageFault => "pagefault",
                Crash::StackOverflow => "stackoverflow",
                Crash::Panic => "panic",
            };
            write!(f, " crash={name}")?;
        }
        if self.access != AccessConfig::default() {
            write!(f, " {}", self.access)?;
        }
        for (i, fault) in self.faults.iter().enumerate() {
            write!(f, "{}{fault}", if i == 0 { " fault=" } else { "," })?;
        }
        match self.discard_secs {
            Some(DEFAULT_DISCARD_SECS) => {}
            Some(s) => write!(f, " discard={s}")?,
            None => f.write_str(" discard=off")?,
        }
        if let Some(n) = self.cpus {
            write!(f, " cpus={n}")?;
        }
        if let Some(m) = self.serve_cpus {
            write!(f, " serve_cpus={m}")?;
        }
        if self.max_snapshots != ninefs::features::snapshots::MAX_SNAPSHOTS {
            write!(f, " snapshots={}", self.max_snapshots)?;
        }
        if self.refuse_degraded {
            write!(f, " degraded=refuse")?;
        }
        if self.rebuild_rate_mib != ninefs::features::redundancy::rebuild::DEFAULT_REBUILD_RATE_MIB
        {
            write!(f, " rebuild_rate={}", self.rebuild_rate_mib)?;
        }
        if self.fault_seed != DEFAULT_FAULT_SEED {
            write!(f, " fault_seed={}", self.fault_seed)?;
        }
        if self.scrub_rate_mib != ninefs::features::redundancy::scrub::DEFAULT_SCRUB_RATE_MIB {
            write!(f, " scrub_rate={}", self.scrub_rate_mib)?;
        }
        if let Some(s) = self.scrub_interval_secs {
            write!(f, " scrub_interval={s}")?;
        }
        if self.stream_rate_mib != ninefs::features::streams::jobs::DEFAULT_STREAM_RATE_MIB {
            write!(f, " stream_rate={}", self.stream_rate_mib)?;
        }
        if self.stream_buffer != ninefs::features::streams::jobs::DEFAULT_STREAM_BUFFER {
            write!(f, " stream_buffer={}", self.stream_buffer >> 10)?;
        }
        if let Some(mib) = self.data_cache_mib {
            write!(f, " data_cache={mib}")?;
        }
        match self.readahead {
            0 => write!(f, " readahead=off")?,
            r if r != ninefs::volume::DEFAULT_READAHEAD => write!(f, " readahead={}", r >> 10)?,
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::{String, ToString};
    use std::vec::Vec;

    fn parse(cmdline: &str) -> (Config, Vec<String>) {
        let mut ignored = Vec::new();
        let c = Config::parse(cmdline, |i| ignored.push(i.to_string()));
        (c, ignored)
    }

    #[test]
    fn empty_command_line_gives_defaults() {
        let (c, ignored) = parse("   ");
        assert_eq!(c, Config::default());
        assert!(ignored.is_empty());
        assert_eq!(c.to_string(), "log=info ip=dhcp gw=none port=564 disk=auto");
    }

    /// Found by the `cmdline` fuzz target (fuzz/regressions/cmdline/): the effective
    /// line the `config` event prints said `gw=none` and `disk=auto`, which the parser
    /// refused, so that line did not parse back to the configuration it described.
    #[test]
    fn effective_line_parses_back_to_itself() {
        for line in [
            "",
            "ip=10.0.2.15/24 gw=10.0.2.2 disk=nvme0,nvme1 mkfs",
            "gw=10.0.2.2 ip=10.0.2.15/24 gw=none disk=virtio0 disk=auto",
        ] {
            let (c, ignored) = parse(line);
            assert!(ignored.is_empty(), "{line:?}: {ignored:?}");
            let effective = c.to_string();
            let (again, ignored) = parse(&effective);
            assert!(ignored.is_empty(), "{effective:?}: {ignored:?}");
            assert_eq!(again, c, "{effective:?}");
        }
        let (c, _) = parse("ip=10.0.2.15/24 gw=10.0.2.2 gw=none disk=nvme0,nvme1 disk=auto");
        assert_eq!((c.gateway, c.disk, c.mirror.len()), (None, None, 0));
        let (_, ignored) = parse("gw=nonsense disk=automatic");
        assert_eq!(ignored.len(), 2, "{ignored:?}");
    }

    #[test]
    fn fault_rules_parse_and_print_back() {
        let (c, ignored) = parse("fault=flush-after:60,writes:1000 fault=read:3 fault_seed=7");
        assert!(ignored.is_empty(), "{ignored:?}");
        assert_eq!(
            c.faults,
            [
                Fault::FlushesAfter(60_000_000_000),
                Fault::RandomWrites(1000),
                Fault::NthRead(3)
            ]
        );
        assert_eq!(c.fault_seed, 7);
        assert!(c
            .to_string()
            .ends_with(" fault=flush-after:60,writes:1000,read:3 fault_seed=7"));
        let (c, _) = parse("discard=off");
        assert_eq!(
            (c.discard_secs, c.to_string().ends_with(" discard=off")),
            (None, true)
        );
        let (c, bad) = parse("scrub_rate=64 scrub_interval=3600 admin_allow=10.0.2.2");
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!((c.scrub_rate_mib, c.scrub_interval_secs), (64, Some(3600)));
        assert!(c.access.admin_allow().is_some());
        let text = c.to_string();
        assert!(text.contains(" scrub_rate=64") && text.contains(" scrub_interval=3600"));
        assert!(text.contains(" admin_allow=10.0.2.2"), "{text}");
        let (c, bad) = parse("stream_rate=8 stream_buffer=256");
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!((c.stream_rate_mib, c.stream_buffer), (8, 256 << 10));
        assert!(c.to_string().ends_with(" stream_rate=8 stream_buffer=256"));
        let (_, bad) = parse("stream_rate=0 stream_buffer=1");
        assert_eq!(bad.len(), 2, "{bad:?}");
        let (c, bad) = parse("scrub_rate=0 scrub_interval=5");
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert_eq!(c.scrub_interval_secs, None);
        let (c, _) = parse("cpus=4");
        assert_eq!(c.cpus, Some(4));
        assert!(c.to_string().ends_with(" cpus=4"));
        let (c, ignored) = parse("cpus=0 cpus=17 cpus=x");
        assert_eq!((c.cpus, ignored.len()), (None, 3));
    }

    #[test]
    fn serve_cpus_takes_indices_and_ranges() {
        let (c, _) = parse("serve_cpus=1-3,5");
        let m = c.serve_cpus.expect("parsed");
        let cpus: Vec<usize> = (0..MAX_CPUS).filter(|&i| m.contains(i)).collect();
        assert_eq!(cpus, [1, 2, 3, 5]);
        assert!(c.to_string().ends_with(" serve_cpus=1-3,5"));
        let (c, _) = parse("serve_cpus=0,1");
        assert!(c.to_string().ends_with(" serve_cpus=0-1"));
        let (c, ignored) = parse("serve_cpus=16 serve_cpus=3-1 serve_cpus= serve_cpus=a,1");
        assert_eq!((c.serve_cpus, ignored.len()), (None, 4));
        let (c, _) = parse("snapshots=3");
        assert_eq!(c.max_snapshots, 3);
        assert!(c.to_string().ends_with(" snapshots=3"));
        let (c, ignored) = parse("snapshots=0");
        assert_eq!((c.max_snapshots, ignored.len()), (1024, 1));
        let (c, _) = parse("degraded=refuse");
        assert!(c.refuse_degraded);
        assert!(c.to_string().ends_with(" degraded=refuse"));
        let (c, ignored) = parse("degraded=maybe");
        assert_eq!((c.refuse_degraded, ignored.len()), (false, 1));
        let (c, _) = parse("rebuild_rate=8");
        assert_eq!(c.rebuild_rate_mib, 8);
        assert!(c.to_string().ends_with(" rebuild_rate=8"));
        let (c, ignored) = parse("rebuild_rate=0");
        assert_eq!((c.rebuild_rate_mib, ignored.len()), (64, 1));
        let (c, _) = parse("discard=5");
        assert_eq!(c.discard_secs, Some(5));
        let (c, ignored) = parse("fault=flush-after:x fault=tear:1");
        assert!(c.faults.is_empty());
        assert_eq!(ignored.len(), 2, "{ignored:?}");
    }

    #[test]
    fn every_option_parses() {
        let (c, ignored) = parse(
            "log=debug ip=10.0.2.15/24 gw=10.0.2.2 port=5640 mtu=9000 offload=off disk=00:04.0 fs=memory selftest poweroff crash=stackoverflow",
        );
        assert!(ignored.is_empty(), "{ignored:?}");
        assert_eq!(c.log, LevelFilter::Debug);
        assert_eq!(
            c.ip,
            IpConfig::Static {
                addr: Ipv4Addr::new(10, 0, 2, 15),
                prefix: 24
            }
        );
        assert_eq!(c.gateway, Some(Ipv4Addr::new(10, 0, 2, 2)));
        assert_eq!(c.port, 5640);
        assert_eq!(c.mtu, 9000);
        assert!(!c.offload);
        assert!(parse("").0.offload && parse("offload=off offload=on").0.offload);
        assert_eq!(parse("offload=maybe").1.len(), 1);
        assert_eq!(c.disk, Some(DiskSelector::Pci(PciAddress::new(0, 0, 4, 0))));
        assert_eq!(c.fs, FsSource::Memory);
        assert!(c.selftest && c.poweroff);
        assert_eq!(c.crash, Some(Crash::StackOverflow));
        // The summary is itself a valid command line that parses to the same config.
        let (again, ignored) = parse(&c.to_string());
        assert!(ignored.is_empty());
        assert_eq!(again, c);
    }

    #[test]
    fn disk_selectors() {
        assert_eq!(parse("disk=nvme0").0.disk, Some(DiskSelector::Nvme(0)));
        let (c, _) = parse("disk=nvme0,virtio1");
        assert_eq!(
            (c.disk, c.mirror.as_slice()),
            (
                Some(DiskSelector::Nvme(0)),
                &[DiskSelector::VirtioBlk(1)][..]
            )
        );
        assert!(c.to_string().ends_with(" disk=nvme0,virtio1"));
        assert_eq!(
            parse("disk=virtio1").0.disk,
            Some(DiskSelector::VirtioBlk(1))
        );
        assert_eq!(
            parse("disk=0001:1a:1f.7").0.disk,
            Some(DiskSelector::Pci(PciAddress::new(1, 0x1a, 0x1f, 7)))
        );
        for bad in [
            "disk=nvme",
            "disk=nvmex",
            "disk=sda",
            "disk=00:20.0",
            "disk=00:04.8",
        ] {
            let (c, ignored) = parse(bad);
            assert_eq!(c.disk, None, "{bad}");
            assert_eq!(ignored.len(), 1, "{bad}");
        }
    }

    #[test]
    fn unknown_and_malformed_options_are_reported_and_ignored() {
        let (c, ignored) = parse(
            "log=loud ip=10.0.0.1 ip=300.1.1.1/8 ip=10.0.0.1/33 port=0 port=70000 port= frobnicate selftest=yes crash=reboot gw=x log fs=tmpfs mtu=100 mtu=9001 mtu=",
        );
        assert_eq!(c, Config::default());
        assert_eq!(ignored.len(), 16, "{ignored:#?}");
        assert!(ignored[0].contains("`log=loud`"));
        assert!(ignored[7].starts_with("unknown option `frobnicate`"));
    }

    #[test]
    fn later_valid_options_override_and_invalid_ones_do_not() {
        let (c, ignored) = parse("port=1000 port=2000 port=bad log=warn log=nope");
        assert_eq!(c.port, 2000);
        assert_eq!(c.log, LevelFilter::Warn);
        assert_eq!(ignored.len(), 2);
    }

    #[test]
    fn block_options() {
        let (c, ignored) = parse("selftest=block nvme=poll bench=dev disk=virtio0 benchtime=3");
        assert!(ignored.is_empty(), "{ignored:?}");
        assert!(c.selftest_block && !c.selftest && c.nvme_poll);
        assert_eq!((c.bench, c.bench_seconds), (Some(Bench::Device), 3));
        assert_eq!(
            c.to_string(),
            "log=info ip=dhcp gw=none port=564 disk=virtio0 nvme=poll selftest=block bench=dev benchtime=3"
        );
        assert_eq!(parse(&c.to_string()).0, c);
        assert!(!parse("nvme=poll nvme=irq").0.nvme_poll);
        let (c, ignored) = parse("selftest=disk nvme=spin bench= bench=fs benchtime=0");
        assert_eq!(c, Config::default());
        assert_eq!(ignored.len(), 5, "{ignored:?}");
        let (c, ignored) = parse("nvme_queues=3");
        assert!(ignored.is_empty(), "{ignored:?}");
        assert_eq!(c.nvme_queues, Some(3));
        assert!(c.to_string().ends_with(" nvme_queues=3"), "{c}");
        assert_eq!(parse(&c.to_string()).0, c);
        assert_eq!(parse("nvme_queues=64").0.nvme_queues, Some(64));
        // Out of range or malformed: ignored, an earlier valid one stays.
        let (c, ignored) =
            parse("nvme_queues=2 nvme_queues=0 nvme_queues=65 nvme_queues=x nvme_queues=");
        assert_eq!((c.nvme_queues, ignored.len()), (Some(2), 4), "{ignored:?}");
        assert_eq!(parse("nvme_queues=0").0, Config::default());
    }

    #[test]
    fn shutdown_timeout() {
        assert_eq!(Config::default().shutdown_secs, DEFAULT_SHUTDOWN_SECONDS);
        let (c, ignored) = parse("shutdown_timeout=5");
        assert!(ignored.is_empty(), "{ignored:?}");
        assert_eq!(c.shutdown_secs, 5);
        assert!(c.to_string().ends_with(" shutdown_timeout=5"), "{c}");
        assert_eq!(parse(&c.to_string()).0, c);
        let (c, ignored) =
            parse("shutdown_timeout=0 shutdown_timeout=3601 shutdown_timeout=x shutdown_timeout");
        assert_eq!(c, Config::default());
        assert_eq!(ignored.len(), 4, "{ignored:?}");
    }

    #[test]
    fn disk_service_options() {
        let (c, ignored) = parse("mkfs stats=15641");
        assert!(ignored.is_empty(), "{ignored:?}");
        assert_eq!((c.mkfs, c.stats_port), (Mkfs::IfBlank, Some(15641)));
        assert_eq!(
            c.to_string(),
            "log=info ip=dhcp gw=none port=564 disk=auto mkfs stats=15641"
        );
        assert_eq!(parse(&c.to_string()).0, c);
        let (c, _) = parse("mkfs=force stats=off");
        assert_eq!((c.mkfs, c.stats_port), (Mkfs::Force, None));
        assert_eq!(parse(&c.to_string()).0, c);
        let (c, ignored) = parse("mkfs=yes stats=0 stats=http");
        assert_eq!(c, Config::default());
        assert_eq!(ignored.len(), 3, "{ignored:?}");
    }

    #[test]
    fn ninep_limits() {
        let (c, ignored) = parse(
            "msize=65536 max_conns=8 max_conns_per_client=2 max_fids=100 max_in_flight=16 client_mem=32 handshake_timeout=3 idle_timeout=30 max_conns_per_tenant=4 max_fids_per_tenant=300 max_locks_per_tenant=50 max_in_flight_per_tenant=20 client_mem_per_tenant=8",
        );
        assert!(ignored.is_empty(), "{ignored:?}");
        assert_eq!(
            c.ninep,
            NinepLimits {
                msize: 65536,
                max_conns: 8,
                max_conns_per_client: 2,
                max_fids: 100,
                max_in_flight: 16,
                client_mem_mib: Some(32),
                max_conns_per_tenant: Some(4),
                max_fids_per_tenant: Some(300),
                max_locks_per_tenant: Some(50),
                max_in_flight_per_tenant: Some(20),
                client_mem_per_tenant_mib: Some(8),
                handshake_secs: 3,
                idle_secs: 30,
            }
        );
        assert_eq!(parse(&c.to_string()).0, c);
        let (c, ignored) =
            parse("msize=100 max_conns=0 max_in_flight=5000 client_mem=x idle_timeout max_fids=");
        assert_eq!(c, Config::default());
        assert_eq!(ignored.len(), 6, "{ignored:?}");
        assert!(ignored[4].contains("needs a value"), "{ignored:?}");
    }

    #[test]
    fn early_log_level_agrees_with_the_full_parse() {
        for cmdline in [
            "",
            "log=debug",
            "log=warn port=1 log=trace",
            "log=trace log=nope",
            "log= log",
            "export=x:/ log=error allow=bad",
        ] {
            assert_eq!(log_level(cmdline), parse(cmdline).0.log, "{cmdline:?}");
        }
        assert_eq!(log_level("log=trace log=nope"), LevelFilter::Trace);
    }

    #[test]
    fn access_options() {
        let (c, ignored) = parse(
            "export=:/srv:ro export=data:/srv/data:squash=all:allow=10.0.2.0/24 allow=10.0.2.2 group=1000:100,200 stats_allow=10.0.2.0/24",
        );
        assert!(ignored.is_empty(), "{ignored:?}");
        let exports = c.access.named_exports();
        assert_eq!(exports.len(), 2);
        assert_eq!(
            (exports[0].name.as_str(), exports[0].path.as_str()),
            ("", "/srv")
        );
        assert!(exports[0].read_only);
        assert_eq!(exports[1].squash, ninep::server::Squash::All);
        let host = Some(core::net::IpAddr::V4(Ipv4Addr::new(10, 0, 2, 2)));
        let guest = Some(core::net::IpAddr::V4(Ipv4Addr::new(10, 0, 2, 15)));
        assert!(c.access.allow().admits(host) && !c.access.allow().admits(guest));
        assert!(c.access.stats_allow().admits(guest));
        assert_eq!(c.access.groups().get(&1000), Some(&std::vec![100, 200]));
        assert_eq!(
            c.to_string(),
            "log=info ip=dhcp gw=none port=564 disk=auto export=:/srv:ro export=data:/srv/data:squash=all:allow=10.0.2.0/24 allow=10.0.2.2 stats_allow=10.0.2.0/24 group=1000:100,200"
        );
        assert_eq!(parse(&c.to_string()).0, c);
        // stats_allow follows allow= unless given.
        let (c, _) = parse("allow=192.0.2.0/24");
        assert!(!c.access.stats_allow().admits(host));
    }

    #[test]
    fn malformed_access_options_are_reported_and_ignored() {
        let (c, ignored) = parse(
            "export= export=data export=data:srv export=data:/:rw:squash=some allow= allow=10.0.2.15/24 allow=any,, group=1000 group=x:1 stats_allow=none",
        );
        assert_eq!(c, Config::default());
        assert_eq!(ignored.len(), 10, "{ignored:#?}");
        assert!(
            ignored[3].contains("`export=data:/:rw:squash=some`"),
            "{}",
            ignored[3]
        );
        assert!(ignored[5].contains("past the prefix"), "{}", ignored[5]);
        // An earlier valid allow= stays.
        let (c, ignored) = parse("allow=10.0.2.2 allow=bad");
        assert_eq!(ignored.len(), 1);
        assert_eq!(c.access.allow().to_string(), "10.0.2.2");
    }

    #[test]
    fn gateway_without_static_ip_is_dropped() {
        let (c, ignored) = parse("gw=10.0.2.2");
        assert_eq!(c.gateway, None);
        assert_eq!(ignored.len(), 1);
        let (c, ignored) = parse("ip=dhcp");
        assert_eq!(c.ip, IpConfig::Dhcp);
        assert!(ignored.is_empty());
    }
}
