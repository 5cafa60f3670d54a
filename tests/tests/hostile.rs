//! Hostile clients against the booted appliance (`ninefold_tests::hostile`): every probe
//! while honest clients keep working; the appliance must stay up, keep the honest
//! clients' latency bounded and its memory within budget, and leave a clean disk.
//!
//! `make test` runs the short slice (one boot at 128 MiB, every probe reduced); `make
//! soak` runs [`soak`]: every probe in full at 128 MiB and at 512 MiB, with its report
//! in `build/soak/report.json` (`NINEFOLD_SOAK_REPORT`).
//!
//! Host ports: 15850/15851 (short slice), 15852/15853 (soak).

use ninefold_tests::hostile::suite::{self, Run};
use ninefold_tests::hostile::Scale;

/// Prints the run's table and fails with every failure.
fn judge(runs: &[Run]) {
    for run in runs {
        println!("{}", run.table());
    }
    let failures: Vec<String> = runs.iter().flat_map(Run::failures).collect();
    assert!(
        failures.is_empty(),
        "{} hostile-client failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The short slice: every probe, reduced, at 128 MiB.
#[test]
fn hostile_clients_short() {
    let run = suite::run("128M", &Scale::short(), 15850, 15851);
    judge(&[run]);
}

/// The soak: every probe in full at 128 MiB and 512 MiB (`NINEFOLD_SOAK_MEMORY=128M`,
/// say, for one size), the JSON report written.
#[test]
#[ignore = "long: make soak"]
fn soak() {
    let scale = Scale::full();
    let sizes = std::env::var("NINEFOLD_SOAK_MEMORY").unwrap_or_else(|_| "128M,512M".into());
    let runs: Vec<Run> = sizes
        .split(',')
        .map(str::trim)
        .filter(|mem| !mem.is_empty())
        .map(|mem| suite::run(mem, &scale, 15852, 15853))
        .collect();
    let path = std::env::var_os("NINEFOLD_SOAK_REPORT").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../build/soak/report.json"),
        std::path::PathBuf::from,
    );
    let report = serde_json::json!({
        "suite": "hostile clients (make soak)",
        "scale": scale.name,
        "window_seconds": scale.window.as_secs(),
        "honest_clients": scale.honest_clients,
        "runs": runs.iter().map(Run::json).collect::<Vec<_>>(),
    });
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("making the report's directory");
    }
    std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap())
        .expect("writing the soak report");
    println!("soak report: {}", path.display());
    judge(&runs);
}

/// The probes' own expectations against a server already running on
/// `127.0.0.1:$NINEFOLD_HOSTILE_TARGET` (e.g. `ninefold serve --export :/ --export
/// squashed:/:squash=all --export locked:/:allow=192.0.2.1/32 --group 1000:1000` on a
/// fresh image), without the suite's checks around them (no honest load, no counters):
/// for trying a probe on the host. `NINEFOLD_HOSTILE_PROBES` picks probes (those that
/// read counters need the appliance); `NINEFOLD_HOSTILE_SCALE=full` runs them in full.
#[test]
#[ignore = "needs a running server: NINEFOLD_HOSTILE_TARGET=PORT"]
fn probes_against_a_running_server() {
    use ninefold_tests::hostile::probes::{self, Ctx};
    use ninefold_tests::hostile::raw::attached;
    use ninefold_tests::hostile::Limits;
    use std::time::{Duration, Instant};

    let port: u16 = std::env::var("NINEFOLD_HOSTILE_TARGET")
        .expect("NINEFOLD_HOSTILE_TARGET=PORT")
        .parse()
        .expect("a port number");
    let scale = match std::env::var("NINEFOLD_HOSTILE_SCALE").as_deref() {
        Ok("full") => Scale::full(),
        _ => Scale::short(),
    };
    let mut c = attached(port, 0, "").expect("attach as root");
    probes::prepare(&mut c, &scale).expect("making the fixtures");
    let filter = std::env::var("NINEFOLD_HOSTILE_PROBES").unwrap_or_default();
    let mut failures = Vec::new();
    for p in probes::all(&scale) {
        if !filter
            .split(',')
            .any(|part| !part.is_empty() && p.name.contains(part.trim()))
        {
            continue;
        }
        let ctx = Ctx {
            port,
            stats_port: 0,
            scale: &scale,
            limits: Limits::for_scale(&scale),
            memory_limit: u64::MAX,
            attach_bound: Duration::from_secs(10),
            started: Instant::now(),
        };
        let outcome = (p.run)(&ctx);
        println!("{}: {:?}", p.name, outcome.findings);
        failures.extend(outcome.failures.iter().map(|f| format!("{}: {f}", p.name)));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
