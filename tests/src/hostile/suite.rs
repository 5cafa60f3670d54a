//! The suite: boots the appliance on a fresh disk, runs honest clients alone (the
//! baseline), then each probe under honest load, then honest clients alone again, and
//! checks after every step:
//!
//! - the appliance is up: QEMU runs, no `panicked` or `!!!` on its console, the counters
//!   service answers;
//! - the memory budget held: `/9p/memory/peak <= /9p/memory/limit`;
//! - a new client connects and attaches within [`Bounds::attach`];
//! - the honest clients had no error (wrong data, refused request, lost connection),
//!   completed cycles, and their p99 and slowest request stayed within [`Bounds`];
//! - the step's connections all closed and their memory came back (`/9p/connections`
//!   and `/9p/memory/committed` back to 0).
//!
//! At the end QEMU is killed (every stop is a crash) and `ninefold fsck` must find the
//! disk clean. The run's [`Run::table`] shows the honest latency without and with each
//! attack; [`Run::json`] is the soak report.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::honest::{self, time_to_attach, AttachSplit, HonestLoad, LoadReport, Percentiles};
use super::probes::{self, access, Ctx, Outcome, Probe};
use super::raw::attached;
use super::{Limits, Scale};
use crate::{stats, FsImage, Qemu, Running};

/// Latency bounds for honest clients: "never held out for more than a few seconds", with
/// room for TCG on two shared cores (the soak's worst honest request is about 1.5 s:
/// `docs/testing.md`).
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// 99th percentile of honest requests during an attack
    /// (`NINEFOLD_HOSTILE_P99_MS`, default 2 s).
    pub p99: Duration,
    /// Slowest honest request (`NINEFOLD_HOSTILE_MAX_MS`, default 5 s).
    pub max: Duration,
    /// Connect, version and attach of a new client (`NINEFOLD_HOSTILE_ATTACH_MS`,
    /// default 5 s).
    pub attach: Duration,
}

impl Bounds {
    /// The defaults, overridden by the environment.
    pub fn from_env() -> Bounds {
        let ms = |name: &str, default: u64| {
            Duration::from_millis(
                std::env::var(name)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(default),
            )
        };
        Bounds {
            p99: ms("NINEFOLD_HOSTILE_P99_MS", 2_000),
            max: ms("NINEFOLD_HOSTILE_MAX_MS", 5_000),
            attach: ms("NINEFOLD_HOSTILE_ATTACH_MS", 5_000),
        }
    }
}

/// The counters whose change each step records, by name: the server's (under `/9p`)
/// and the listener's (under `/listener`: connection requests that reached the port,
/// and what the SYN gate did with those no socket listened for).
const COUNTERS: [(&str, &str); 22] = [
    ("requests", "/9p/requests"),
    ("error_replies", "/9p/error_replies"),
    ("decode_errors", "/9p/decode_errors"),
    ("bad_frame_sizes", "/9p/bad_frame_sizes"),
    ("duplicate_tags", "/9p/duplicate_tags"),
    ("fid_limit_hits", "/9p/fid_limit_hits"),
    ("in_flight_limit_hits", "/9p/in_flight_limit_hits"),
    ("memory_waits", "/9p/memory_waits"),
    ("enomem_replies", "/9p/enomem_replies"),
    ("memory_reclaims", "/9p/memory_reclaims"),
    ("reclaim_waits", "/9p/reclaim_waits"),
    ("slot_reclaims", "/9p/slot_reclaims"),
    ("handshake_timeouts", "/9p/handshake_timeouts"),
    ("idle_timeouts", "/9p/idle_timeouts"),
    ("cpu_yields", "/9p/cpu_yields"),
    ("shed", "/9p/shed"),
    ("refused", "/9p/refused"),
    ("syns", "/listener/syns"),
    ("syns_held", "/9p/syns_held"),
    ("syns_replayed", "/listener/syns_replayed"),
    ("syns_dropped", "/listener/syns_dropped"),
    ("syns_refused", "/listener/syns_refused"),
];

/// One step of a run: honest load alone, or with a probe.
#[derive(Clone, Debug, Default)]
pub struct Row {
    /// The probe (`"none (before)"`, `"none (after)"` for the baselines).
    pub probe: String,
    /// What it did.
    pub about: String,
    /// What the honest clients saw.
    pub load: LoadReport,
    /// A new client's connect-and-attach time after the step.
    pub attach: Option<Duration>,
    /// `/9p/memory/peak` and `/9p/memory/limit` after the step.
    pub memory_peak: u64,
    /// See [`Row::memory_peak`].
    pub memory_limit: u64,
    /// Highest `/heap/allocated` sampled during the step, and `/heap/bytes`.
    pub heap_peak: u64,
    /// See [`Row::heap_peak`].
    pub heap_bytes: u64,
    /// Times the counters service did not answer during the step.
    pub stats_misses: u64,
    /// Changes of [`COUNTERS`] over the step.
    pub counters: BTreeMap<&'static str, u64>,
    /// The probe's own findings.
    pub findings: BTreeMap<String, u64>,
    /// Everything that failed.
    pub failures: Vec<String>,
    /// How long the step took.
    pub elapsed: Duration,
}

/// A whole run at one memory size.
#[derive(Debug, Default)]
pub struct Run {
    /// Guest memory.
    pub memory: String,
    /// Scale name.
    pub scale: &'static str,
    /// The steps.
    pub rows: Vec<Row>,
    /// Failures outside the steps (boot, setup, console, fsck).
    pub failures: Vec<String>,
    /// Probes not run because the appliance had stopped.
    pub skipped: Vec<String>,
    /// `ninefold fsck`'s report.
    pub fsck: String,
    /// Wall time.
    pub elapsed: Duration,
}

/// Samples the counters every second in the background: the heap's high-water mark,
/// and how often the service did not answer.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(u64, u64)>,
}

impl Sampler {
    fn start(stats_port: u16) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut heap_peak, mut misses) = (0, 0);
            while !flag.load(Ordering::SeqCst) {
                match stats::try_json(stats_port, Duration::from_secs(10)) {
                    Ok(v) => {
                        heap_peak = heap_peak.max(stats::counter_or_zero(&v, "/heap/allocated"))
                    }
                    Err(_) => misses += 1,
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            (heap_peak, misses)
        });
        Sampler { stop, thread }
    }

    /// Stops; returns the heap's high-water mark and the misses.
    fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap_or((0, 0))
    }
}

/// A booted appliance under test.
struct Target<'a> {
    vm: Running,
    port: u16,
    stats_port: u16,
    scale: &'a Scale,
    limits: Limits,
    bounds: Bounds,
    memory_limit: u64,
}

/// Runs every probe at `scale` (those named in `NINEFOLD_HOSTILE_PROBES`, a comma-separated
/// list of name parts, if set) against an appliance with `memory` of RAM, its 9P port
/// forwarded from `port` and its counters from `stats_port`. `NINEFOLD_HOSTILE_CONSOLE`
/// names a file for the whole console log.
pub fn run(memory: &str, scale: &Scale, port: u16, stats_port: u16) -> Run {
    let started = Instant::now();
    let mut run = Run {
        memory: memory.into(),
        scale: scale.name,
        ..Run::default()
    };
    let image = FsImage::formatted("1G");
    let limits = Limits::for_scale(scale);
    // Room for every step's window, its waits (a minute at most each) and the boot.
    let boot_time = Duration::from_secs(600) + (scale.window + Duration::from_secs(120)) * 20;
    let mut vm = Qemu::serving()
        .memory(memory)
        .nvme_image("nf-hostile", &image)
        .virtio_net_forwards(&[(port, 564), (stats_port, 5641)])
        .append(&limits.kernel_options())
        .append(access::KERNEL_OPTIONS)
        .timeout(boot_time)
        .spawn();
    vm.wait_for_event("listening", json!({"service": "9p"}));
    let mut target = Target {
        vm,
        port,
        stats_port,
        scale,
        limits,
        bounds: Bounds::from_env(),
        memory_limit: 0,
    };
    if let Err(e) = prepare(&mut target) {
        target
            .vm
            .fail(&format!("setting up the hostile suite: {e}"));
    }
    let chosen = chosen_probes(scale);
    let before = target.step("none (before)", "honest clients alone", |_| {
        Outcome::default()
    });
    eprintln!("{}", row_line(&before));
    run.rows.push(before);
    for p in &chosen {
        if !target.vm.is_running() {
            run.skipped.push(p.name.clone());
            continue;
        }
        let row = target.step(&p.name, &p.about, |ctx| (p.run)(ctx));
        eprintln!("{}", row_line(&row));
        run.rows.push(row);
    }
    if target.vm.is_running() {
        let after = target.step(
            "none (after)",
            "honest clients alone, after every probe",
            |_| Outcome::default(),
        );
        eprintln!("{}", row_line(&after));
        run.rows.push(after);
    }
    let boot = target.vm.stop();
    if let Some(path) = std::env::var_os("NINEFOLD_HOSTILE_CONSOLE") {
        let _ = std::fs::write(path, &boot.serial);
    }
    for marker in ["panicked", "!!!"] {
        if let Some(line) = boot.line(marker) {
            run.failures.push(format!("console: {line}"));
        }
    }
    if boot.status.is_some() {
        run.failures.push(format!(
            "the appliance exited by itself (status {:?})",
            boot.status
        ));
    }
    let (status, report) = image.fsck_status();
    if status != Some(0) {
        run.failures
            .push(format!("ninefold fsck: exit status {status:?}\n{report}"));
    }
    run.fsck = report;
    if !run.failures.is_empty() || run.rows.iter().any(|r| !r.failures.is_empty()) {
        let tail: Vec<&str> = boot.serial.lines().rev().take(60).collect();
        eprintln!(
            "----- last console lines -----\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    run.elapsed = started.elapsed();
    run
}

/// The probes to run: all, or those `NINEFOLD_HOSTILE_PROBES` names.
fn chosen_probes(scale: &Scale) -> Vec<Probe> {
    let filter = std::env::var("NINEFOLD_HOSTILE_PROBES").unwrap_or_default();
    let parts: Vec<&str> = filter
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    probes::all(scale)
        .into_iter()
        .filter(|p| parts.is_empty() || parts.iter().any(|part| p.name.contains(part)))
        .collect()
}

/// The honest clients' directories, the probes' fixtures, the memory limit.
fn prepare(t: &mut Target<'_>) -> Result<(), String> {
    let mut c = attached(t.port, 0, "").map_err(|e| format!("attach: {e}"))?;
    honest::prepare(&mut c, t.scale.honest_clients).map_err(|e| format!("honest dirs: {e}"))?;
    probes::prepare(&mut c, t.scale)?;
    let v = stats::try_json(t.stats_port, Duration::from_secs(30))?;
    t.memory_limit = stats::counter_or_zero(&v, "/9p/memory/limit");
    if t.memory_limit == 0 {
        return Err(format!("no /9p/memory/limit in the counters: {v}"));
    }
    Ok(())
}

impl Target<'_> {
    /// The counters, retried for up to a minute (the service answers four clients at
    /// once and may be slow under attack).
    fn counters(&self) -> Result<Value, String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match stats::try_json(self.stats_port, Duration::from_secs(20)) {
                Ok(v) => return Ok(v),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }

    /// Runs `attack` under honest load for at least the window, and checks the
    /// appliance afterwards (see the module documentation).
    fn step(&mut self, name: &str, about: &str, attack: impl FnOnce(&Ctx<'_>) -> Outcome) -> Row {
        let started = Instant::now();
        let mut row = Row {
            probe: name.into(),
            about: about.into(),
            ..Row::default()
        };
        let before = self.counters().unwrap_or_default();
        let sampler = Sampler::start(self.stats_port);
        let load = HonestLoad::start(self.port, self.scale.honest_clients);
        let ctx = Ctx {
            port: self.port,
            stats_port: self.stats_port,
            scale: self.scale,
            limits: self.limits,
            memory_limit: self.memory_limit,
            attach_bound: self.bounds.attach,
            started,
        };
        let outcome = attack(&ctx);
        ctx.hold();
        row.load = load.stop();
        (row.heap_peak, row.stats_misses) = sampler.stop();
        row.findings = outcome.findings;
        row.failures = outcome
            .failures
            .iter()
            .map(|f| format!("probe: {f}"))
            .collect();
        self.check_alive(&mut row, &before);
        self.check_honest(&mut row);
        self.settle(&mut row);
        row.elapsed = started.elapsed();
        row
    }

    /// The appliance runs, its console shows no crash, its counters answer, its memory
    /// budget held, and a new client can attach.
    fn check_alive(&mut self, row: &mut Row, before: &Value) {
        if !self.vm.is_running() {
            row.failures.push("the appliance stopped".into());
            return;
        }
        let serial = self.vm.serial();
        for marker in ["panicked", "!!!"] {
            if let Some(line) = serial.lines().find(|l| l.contains(marker)) {
                row.failures.push(format!("console: {line}"));
            }
        }
        match self.counters() {
            Ok(after) => {
                let m = |p: &str| stats::counter_or_zero(&after, p);
                row.memory_peak = m("/9p/memory/peak");
                row.memory_limit = m("/9p/memory/limit");
                row.heap_bytes = m("/heap/bytes");
                row.heap_peak = row.heap_peak.max(m("/heap/allocated"));
                if row.memory_peak > row.memory_limit {
                    row.failures.push(format!(
                        "memory peak {} B above the limit {} B",
                        row.memory_peak, row.memory_limit
                    ));
                }
                for (name, p) in COUNTERS {
                    let delta = m(p).saturating_sub(stats::counter_or_zero(before, p));
                    row.counters.insert(name, delta);
                }
            }
            Err(e) => row.failures.push(format!("the counters service: {e}")),
        }
        match time_to_attach(self.port) {
            Ok(took) => {
                row.attach = Some(took);
                if took > self.bounds.attach {
                    row.failures.push(format!(
                        "a new client took {took:?} to attach (bound {:?})",
                        self.bounds.attach
                    ));
                }
            }
            Err(e) => row
                .failures
                .push(format!("a new client could not attach: {e}")),
        }
    }

    /// The honest clients had no error, got work done, and within the latency bounds.
    fn check_honest(&self, row: &mut Row) {
        let load = &row.load;
        let mut failures = Vec::new();
        for e in load.errors.iter().take(10) {
            failures.push(format!("honest client: {e}"));
        }
        if load.errors.len() > 10 {
            failures.push(format!("... {} honest errors in all", load.errors.len()));
        }
        if load.cycles == 0 {
            failures.push("the honest clients completed no cycle".into());
        }
        if load.all.p99 > self.bounds.p99 {
            failures.push(format!(
                "honest p99 {:?} above the bound {:?}",
                load.all.p99, self.bounds.p99
            ));
        }
        if load.all.max > self.bounds.max {
            failures.push(format!(
                "an honest request took {:?} (bound {:?})",
                load.all.max, self.bounds.max
            ));
        }
        row.failures.extend(failures);
    }

    /// Waits (up to a minute) for the step's connections to close and give their memory
    /// back.
    fn settle(&mut self, row: &mut Row) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = (0, 0);
        while Instant::now() < deadline && self.vm.is_running() {
            if let Ok(v) = stats::try_json(self.stats_port, Duration::from_secs(10)) {
                last = (
                    stats::counter_or_zero(&v, "/9p/connections"),
                    stats::counter_or_zero(&v, "/9p/memory/committed"),
                );
                if last == (0, 0) {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        row.failures.push(format!(
            "a minute after the step, {} connections still open and {} B of client memory committed",
            last.0, last.1
        ));
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

/// The slowest honest `attach` in parts, e.g. `6012.3 ms = connect 0.2 + version 6009.1 +
/// attach 2.9 (1 try)`.
fn attach_line(a: &AttachSplit) -> String {
    format!(
        "{:.1} ms = retrying {:.1} + connect {:.1} + version {:.1} + attach {:.1} ({} tries)",
        ms(a.total),
        ms(a.retrying),
        ms(a.connect),
        ms(a.version),
        ms(a.attach),
        a.tries
    )
}

/// One line for the progress log.
fn row_line(r: &Row) -> String {
    format!(
        "hostile: {:<24} honest p50 {:>7.1} ms p99 {:>7.1} ms max {:>7.1} ms, {} cycles; slowest attach {}; {}; {}",
        r.probe,
        ms(r.load.all.p50),
        ms(r.load.all.p99),
        ms(r.load.all.max),
        r.load.cycles,
        r.load.slowest_attach.as_ref().map_or("-".into(), attach_line),
        notable(r),
        if r.failures.is_empty() {
            "ok".to_string()
        } else {
            format!("FAILED: {}", r.failures.join("; "))
        }
    )
}

/// Notable server counters of a row, for the table.
fn notable(r: &Row) -> String {
    let names = [
        ("enomem_replies", "ENOMEM"),
        ("memory_waits", "mem waits"),
        ("memory_reclaims", "mem reclaims"),
        ("reclaim_waits", "reclaim waits"),
        ("slot_reclaims", "slot reclaims"),
        ("handshake_timeouts", "handshake t/o"),
        ("shed", "shed"),
        ("refused", "refused"),
        ("cpu_yields", "yields"),
        ("syns_held", "SYNs held"),
        ("syns_replayed", "replayed"),
        ("syns_dropped", "SYNs dropped"),
        ("syns_refused", "SYNs refused"),
    ];
    names
        .iter()
        .filter_map(|(k, label)| {
            let v = r.counters.get(k).copied().unwrap_or(0);
            (v > 0).then(|| format!("{label} {v}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl Run {
    /// Every failure of the run, each prefixed with where it happened.
    pub fn failures(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .failures
            .iter()
            .map(|f| format!("[{}] {f}", self.memory))
            .collect();
        for r in &self.rows {
            all.extend(
                r.failures
                    .iter()
                    .map(|f| format!("[{}] {}: {f}", self.memory, r.probe)),
            );
        }
        for s in &self.skipped {
            all.push(format!(
                "[{}] {s}: not run (the appliance had stopped)",
                self.memory
            ));
        }
        all
    }

    /// The latency table (Markdown).
    pub fn table(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "Hostile clients at {} ({} scale, {:.0} s): honest request latency without and with each attack\n",
            self.memory,
            self.scale,
            self.elapsed.as_secs_f64()
        );
        let _ = writeln!(
            t,
            "| attack | honest cycles | p50 ms | p99 ms | max ms | new attach ms | client memory peak / limit MiB | heap peak MiB | server | result |"
        );
        let _ = writeln!(t, "|---|---|---|---|---|---|---|---|---|---|");
        for r in &self.rows {
            let mib = |b: u64| b as f64 / (1 << 20) as f64;
            let _ = writeln!(
                t,
                "| {} | {} | {:.1} | {:.1} | {:.1} | {} | {:.1} / {:.1} | {:.1} | {} | {} |",
                r.probe,
                r.load.cycles,
                ms(r.load.all.p50),
                ms(r.load.all.p99),
                ms(r.load.all.max),
                r.attach.map_or("-".into(), |d| format!("{:.1}", ms(d))),
                mib(r.memory_peak),
                mib(r.memory_limit),
                mib(r.heap_peak),
                notable(r),
                if r.failures.is_empty() {
                    "ok"
                } else {
                    "FAILED"
                }
            );
        }
        t
    }

    /// The run as JSON (the soak report's element per memory size).
    pub fn json(&self) -> Value {
        let pct = |p: &Percentiles| {
            json!({
                "count": p.count,
                "p50_ms": ms(p.p50),
                "p99_ms": ms(p.p99),
                "max_ms": ms(p.max),
            })
        };
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                json!({
                    "probe": r.probe,
                    "about": r.about,
                    "seconds": r.elapsed.as_secs_f64(),
                    "honest": {
                        "cycles": r.load.cycles,
                        "all": pct(&r.load.all),
                        "by_op": r.load.by_op.iter().map(|(k, p)| (k.to_string(), pct(p))).collect::<BTreeMap<_, _>>(),
                        "attach_parts": r.load.attach_parts.iter().map(|(k, p)| (k.to_string(), pct(p))).collect::<BTreeMap<_, _>>(),
                        "slowest_attach": r.load.slowest_attach.as_ref().map(|a| json!({
                            "ms": ms(a.total),
                            "tries": a.tries,
                            "retrying_ms": ms(a.retrying),
                            "connect_ms": ms(a.connect),
                            "version_ms": ms(a.version),
                            "attach_ms": ms(a.attach),
                        })),
                        "errors": r.load.errors.len(),
                    },
                    "new_attach_ms": r.attach.map(ms),
                    "memory": { "peak": r.memory_peak, "limit": r.memory_limit },
                    "heap": { "peak_allocated": r.heap_peak, "bytes": r.heap_bytes },
                    "stats_misses": r.stats_misses,
                    "counters": r.counters,
                    "findings": r.findings,
                    "failures": r.failures,
                })
            })
            .collect();
        json!({
            "memory": self.memory,
            "scale": self.scale,
            "seconds": self.elapsed.as_secs_f64(),
            "rows": rows,
            "skipped": self.skipped,
            "failures": self.failures,
            "fsck_clean": !self.failures.iter().any(|f| f.starts_with("ninefold fsck")),
        })
    }
}
