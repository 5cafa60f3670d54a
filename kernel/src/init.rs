//! Boot: from the boot crate's hand-off to the running executor.

use alloc::boxed::Box;
use alloc::rc::Rc;
use core::time::Duration;

use boot::BootInfo;
use log::{debug, error, info, warn};

use crate::apic::{ioapic, lapic, pic};
use crate::config::{self, Config, FsSource};
use crate::event::{self, Event};
use crate::exit::ExitCode;
use crate::hal::{console, cpu, gdt, percpu, trap};
use crate::mm::setup::MemorySummary;
use crate::monitor::Monitor;
use crate::net::stats_port::PortStats;
use crate::platform::{self, PlatformInfo};
use crate::storage::ServedVolume;
use crate::{
    bench, clock, crash, irq, klog, mm, net, pci, power, selftest, shutdown, smp, storage, task,
};

const MIB: u64 = 1 << 20;

/// Where `IA32_APIC_BASE` and the IOAPIC live on PCs when ACPI cannot tell us.
const DEFAULT_LAPIC: u64 = 0xfee0_0000;
const DEFAULT_IOAPIC: u64 = 0xfec0_0000;

/// The kernel's entry point (see `boot::entry_point!`).
pub fn kmain(info: &'static BootInfo) -> ! {
    // First: locks record their holder by CPU index.
    percpu::init(0);
    console::init();
    klog::init(config::log_level(info.cmdline()));
    info!(
        "ninefold {} booting (PVH start info at {:#x})",
        env!("CARGO_PKG_VERSION"),
        info.start_info
    );
    info!("cmdline: \"{}\"", info.cmdline());
    if info.cmdline_truncated() {
        warn!(
            "cmdline: longer than {} bytes; the rest was ignored",
            boot::info::MAX_CMDLINE
        );
    }

    gdt::init(0);
    trap::init();
    let tsc_hz = clock::init();
    debug!(
        "clock: TSC at {}.{:03} MHz (calibrated against the PIT)",
        tsc_hz / 1_000_000,
        tsc_hz / 1_000 % 1_000
    );

    for r in info.memory_map() {
        debug!("memory: {r}");
    }
    if info.regions_dropped() > 0 {
        warn!(
            "memory: {} map entries beyond the first {} ignored",
            info.regions_dropped(),
            boot::info::MAX_REGIONS
        );
    }
    let mem = mm::setup::init(info);
    // The heap exists: the whole command line can be parsed (exports allocate).
    let mut ignored = alloc::vec::Vec::new();
    let config = Config::parse(info.cmdline(), |i| {
        warn!("cmdline: {i}");
        ignored.push(event::IgnoredOption::from(i));
    });
    info!(
        "memory: {} MiB RAM, {} MiB managed; heap {} MiB in {} piece(s), {} MiB frames free for DMA",
        mem.ram_reported / MIB,
        mem.managed / MIB,
        mem.heap / MIB,
        mem.heap_chunks,
        mem.frames_free / MIB
    );
    debug!(
        "paging: {} MiB in 2 MiB pages, {} KiB in 4 KiB pages, {} guard pages, W^X kernel image",
        mem.map.huge_bytes / MIB,
        mem.map.small_bytes / 1024,
        mem.map.guards
    );

    let platform = match platform::init(info.rsdp) {
        Ok(p) => p,
        Err(e) => {
            warn!("acpi: {e:?}; assuming a PC's default APIC addresses");
            fallback_platform()
        }
    };
    init_interrupts(platform);
    arm_power_button(platform);
    start_cpus(platform, &config);

    for f in pci::device::scan() {
        debug!("pci: {f}");
    }
    info!("pci: {} functions", pci::device::functions().len());
    info!("config: {config}");
    event::emit(Event::Config {
        effective: event::Text::display(&config),
        ignored: event::list(ignored),
    });

    if let Some(c) = config.crash {
        crash::trigger(c);
    }
    let executor = task::init();
    cpu::enable_interrupts();
    let booted = clock::uptime().as_millis() as u64;
    info!("boot: complete in {booted} ms");
    event::emit(event::appliance::booted(&mem, booted));
    // On the heap: the main future holds the mount's and the server's state (29 KiB), and
    // the main stack (256 KiB) is what every poll runs on, where setting up the NIC and
    // its queues takes frames of tens of KiB (it overflowed with the future on it).
    let code = executor.block_on(Box::pin(run(config, mem)));
    info!("power off ({code:?})");
    cpu::exit(code)
}

fn fallback_platform() -> &'static PlatformInfo {
    static FALLBACK: spin::Once<PlatformInfo> = spin::Once::new();
    FALLBACK.call_once(|| PlatformInfo {
        lapic_addr: DEFAULT_LAPIC,
        cpus: alloc::vec![cpu::apic_id()],
        ioapics: alloc::vec![platform::IoApicInfo {
            id: 0,
            addr: DEFAULT_IOAPIC,
            gsi_base: 0
        }],
        overrides: alloc::vec::Vec::new(),
        hpet: None,
        fixed_hardware: Err("no ACPI tables"),
    })
}

fn init_interrupts(platform: &PlatformInfo) {
    pic::disable();
    lapic::init(platform.lapic_addr).expect("mapping the local APIC");
    irq::set_fixed_handler(irq::TIMER_VECTOR, task::timer_fired);
    irq::set_fixed_handler(irq::ERROR_VECTOR, || {});
    irq::set_fixed_handler(irq::WAKE_VECTOR, || {});
    let per_ms = lapic::calibrate_timer(clock::uptime);
    let lines = ioapic::init(platform);
    debug!(
        "interrupts: local APIC {} at {:#x} (timer {} kHz), {} IOAPIC(s) with {} lines, {} CPU(s) in MADT",
        lapic::id(),
        platform.lapic_addr,
        per_ms,
        platform.ioapics.len(),
        lines,
        platform.cpus.len()
    );
    if let Some(h) = platform.hpet {
        debug!("interrupts: HPET at {h:#x}");
    }
}

/// Starts the other CPUs (up to `cpus=`) and says how many run.
fn start_cpus(platform: &PlatformInfo, config: &Config) {
    let report =
        smp::start_application_processors(&platform.cpus, config.cpus.unwrap_or(smp::MAX_CPUS));
    info!(
        "smp: {} of {} CPU(s) online",
        report.online, report.reported
    );
    if !report.skipped.is_empty() {
        info!(
            "smp: left halted (cpus= or the limit of {}): local APIC ids {:?}",
            smp::MAX_CPUS,
            report.skipped
        );
    }
    if !report.failed.is_empty() {
        warn!("smp: did not start: local APIC ids {:?}", report.failed);
    }
}

/// Sends every other CPU a task and waits for their answers: proof that they run their
/// executors, take work from CPU 0 and wake it back.
async fn check_cpus() {
    let mut answers = alloc::vec::Vec::new();
    for cpu in 1..smp::online() {
        match smp::spawn_on(cpu, || async { lapic::id() }) {
            Ok(remote) => answers.push((cpu, remote)),
            Err(e) => warn!("smp: {e:?}"),
        }
    }
    if answers.is_empty() {
        event::emit(event::appliance::cpus(
            alloc::vec::Vec::new(),
            alloc::vec::Vec::new(),
        ));
        return;
    }
    let (mut ids, mut silent) = (alloc::vec::Vec::new(), alloc::vec::Vec::new());
    for (cpu, remote) in answers {
        match task::timeout(Duration::from_secs(5), remote).await {
            Ok(id) => ids.push(id),
            Err(_) => {
                warn!("smp: CPU {cpu} did not run the task sent to it within 5 s");
                silent.push(cpu);
            }
        }
    }
    debug!("smp: CPUs with local APIC ids {ids:?} each ran a task sent from CPU 0");
    event::emit(event::appliance::cpus(ids, silent));
}

/// Arms the ACPI power button (the clean shutdown waits for it), or says why not.
fn arm_power_button(platform: &PlatformInfo) {
    let hw = match &platform.fixed_hardware {
        Ok(hw) => *hw,
        Err(why) => {
            warn!("power: no ACPI power button ({why}): stopping the appliance means killing it (the log keeps every acknowledged fsync)");
            event::emit(Event::PowerButton {
                armed: false,
                why: Some((*why).into()),
            });
            return;
        }
    };
    debug!("power: {hw}");
    match power::arm(hw) {
        Ok(sci) => {
            info!(
                "power: button armed (SCI on GSI {}, {}-triggered, active {})",
                sci.gsi,
                if sci.level_triggered { "level" } else { "edge" },
                if sci.active_low { "low" } else { "high" }
            );
            event::emit(Event::PowerButton {
                armed: true,
                why: None,
            });
        }
        Err(e) => {
            warn!("power: button not armed: {e}; stopping the appliance means killing it (the log keeps every acknowledged fsync)");
            event::emit(Event::PowerButton {
                armed: false,
                why: Some(event::Text::display(e)),
            });
        }
    }
}

/// What the appliance does once booted.
async fn run(config: Config, mem: MemorySummary) -> ExitCode {
    check_cpus().await;
    if config.selftest {
        return selftest::run(&mem).await;
    }
    if config.selftest_block {
        return selftest::run_block(&config).await;
    }
    if config.bench == Some(crate::config::Bench::Device) {
        return bench::device(&config).await;
    }
    if config.poweroff {
        return ExitCode::Success;
    }
    match config.fs {
        FsSource::Memory => {
            warn!("fs: DEVELOPMENT MODE (fs=memory): serving an empty filesystem on a RAM disk; nothing is stored on disk");
            match storage::mount_memory(&config, mem.heap).await {
                Ok(m) => serve(&config, m.fs, m.cache_limit, &mem).await,
                Err(e) => {
                    error!("fs: {e}");
                    info!("ready: idle (nothing to serve); events {}", events_where());
                    event::emit(idle("no_filesystem"));
                }
            }
        }
        FsSource::Disk if !config.mirror.is_empty() => {
            match storage::mount_mirror(&config, mem.heap).await {
                Ok(m) => serve(&config, m.fs, m.cache_limit, &mem).await,
                Err(e) => {
                    error!("fs: {e}");
                    info!("ready: idle (nothing to serve); events {}", events_where());
                    event::emit(idle("no_filesystem"));
                }
            }
        }
        FsSource::Disk => match storage::mount(&config, mem.heap).await {
            Ok(m) => serve(&config, m.fs, m.cache_limit, &mem).await,
            Err(e) => {
                error!("fs: {e}");
                info!("ready: idle (nothing to serve); events {}", events_where());
                event::emit(idle("no_filesystem"));
            }
        },
    }
    shutdown::on_power_button_idle().await;
    power::off()
}

/// Where the structured events go, for the `ready` line.
fn events_where() -> &'static str {
    if console::has_event_channel() {
        "on the second serial port (COM2)"
    } else if log::max_level() >= log::LevelFilter::Debug {
        "on the console (no second serial port)"
    } else {
        "dropped (no second serial port)"
    }
}

/// The [`Event::Ready`] of an appliance with nothing to serve, for `reason`.
fn idle(reason: &'static str) -> Event<'static> {
    Event::Ready {
        serving: false,
        port: None,
        reason: Some(reason),
    }
}

/// Runs the scrub passes of the served filesystem at `rate_mib` MiB per second: those
/// `ctl` starts, and one every `interval_secs` when given; and grants the stream jobs
/// (`send`, `receive`) `stream_mib` MiB per second, and a rebuild after `ctl replace`
/// `rebuild_mib`. A step every
/// [`SCRUB_TICK`](ninefs::features::redundancy::scrub::SCRUB_TICK) with sleeps between keeps the rates
/// and leaves the CPU and the device to clients.
async fn scrub_in_background<V: ServedVolume>(
    service: Rc<net::listener::Listener<ninep::admin::AdminFs<V>>>,
    rate_mib: u32,
    interval_secs: Option<u32>,
    stream_mib: u32,
    rebuild_mib: u32,
) {
    use ninefs::features::redundancy::scrub::{budget_per_tick, SCRUB_TICK};
    let budget = budget_per_tick(rate_mib);
    let rebuild_budget = budget_per_tick(rebuild_mib);
    let stream_budget = budget_per_tick(stream_mib);
    let interval = interval_secs.map(|s| Duration::from_secs(u64::from(s)));
    let mut next_start = interval.map(|i| task::now() + i);
    loop {
        task::sleep(SCRUB_TICK).await;
        let due = next_start.is_some_and(|t| task::now() >= t);
        if due {
            next_start = interval.map(|i| task::now() + i);
        }
        let fs = service.server().fs().inner();
        fs.stream_grant(stream_budget);
        fs.scrub_tick(budget, due).await;
        fs.rebuild_tick(rebuild_budget).await;
    }
}

/// Serves `fs` over 9P, with its counters on the stats port and in the log, until the
/// power button shuts it down cleanly and powers off; returns (having logged why) if
/// the network cannot start.
async fn serve<V: ServedVolume>(config: &Config, fs: V, cache_limit: usize, mem: &MemorySummary) {
    match net::serve(config, fs, mem.heap).await {
        Ok(service) => {
            let tended = service.clone();
            task::spawn(async move {
                loop {
                    task::sleep(storage::HOUSEKEEPING_INTERVAL).await;
                    tended.server().fs().inner().housekeeping().await;
                }
            });
            let watched = service.clone();
            task::spawn(async move {
                loop {
                    task::sleep(storage::FAILURE_CHECK).await;
                    watched.server().fs().inner().watch_failure();
                }
            });
            task::spawn(scrub_in_background(
                service.clone(),
                config.scrub_rate_mib,
                config.scrub_interval_secs,
                config.stream_rate_mib,
                config.rebuild_rate_mib,
            ));
            // The stream jobs' workers wait for `ctl` (and then for their clients).
            let sender = service.clone();
            task::spawn(async move { sender.server().fs().inner().send_worker().await });
            let receiver = service.clone();
            task::spawn(async move { receiver.server().fs().inner().receive_worker().await });
            for _ in 0..storage::READAHEAD_WORKERS {
                let reader = service.clone();
                task::spawn(async move { reader.server().fs().inner().readahead_worker().await });
            }
            let port_stats = Rc::new(PortStats::default());
            let monitor = Monitor::new(service.clone(), cache_limit, port_stats.clone());
            task::spawn(monitor.clone().log_periodically());
            if let Some(port) = config.stats_port {
                let allow = config.access.stats_allow().clone();
                net::stats_port::announce(port, &allow);
                let stack = service.stack().clone();
                task::spawn(net::stats_port::run(
                    stack, port, allow, port_stats, monitor,
                ));
            }
            info!(
                "ready: serving 9P on port {}; counters {}; events {}",
                config.port,
                match config.stats_port {
                    Some(p) => alloc::format!("on port {p}"),
                    None => "off (stats=off)".into(),
                },
                events_where()
            );
            event::emit(Event::Ready {
                serving: true,
                port: Some(config.port),
                reason: None,
            });
            let limit = Duration::from_secs(u64::from(config.shutdown_secs));
            shutdown::on_power_button(service, limit).await;
            power::off()
        }
        Err(e) => {
            error!("net: {e}; not serving 9P");
            info!("ready: idle (no network); events {}", events_where());
            event::emit(idle("no_network"));
        }
    }
}
