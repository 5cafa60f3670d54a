//! `ninefold-crash`: the crash suite (testkit::sim::suite) as a release-mode command.
//!
//! `make crash` runs the full suite; `make test` a quick slice. The last line is always
//! `crash states: N, violations: V, fsck errors: E`; the exit status is non-zero if V or
//! E is. A failure prints the workload, the crash state, what was wrong and the command
//! that replays it (`--replay <id> --seed <seed>`).
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use testkit::sim::suite::{self, Workload};
use testkit::sim::CrashParams;

/// How much of the suite to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Size {
    /// Scenarios, every 4th ACE sequence and 100 random sequences (a minute or so).
    Quick,
    /// Scenarios, every ACE sequence and the random sequences.
    Full,
}

/// The crash suite: record workloads, enumerate crash states, mount, fsck, check.
#[derive(Debug, Parser)]
#[command(name = "ninefold-crash", about)]
struct Args {
    /// Suite size.
    #[arg(long, value_enum, default_value = "full")]
    size: Size,
    /// Run only this workload (an id such as `ace:42`, `fsx:7`, `scenario:generic-588`).
    #[arg(long)]
    replay: Option<String>,
    /// Seed of the crash-state enumeration.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Random (fsx) sequences in the full suite.
    #[arg(long, default_value_t = 400)]
    fsx: u64,
    /// Failure reports printed.
    #[arg(long, default_value_t = 3)]
    reports: usize,
    /// Also crash the recovery (log replay) of every Nth crash state that replays (0:
    /// never; default 8 for the full suite, 32 for the quick one).
    #[arg(long)]
    recovery_every: Option<usize>,
}

fn workload(id: &str) -> Option<Workload> {
    let (kind, arg) = id.split_once(':')?;
    match kind {
        "ace" => suite::ace().into_iter().nth(arg.parse().ok()?),
        "fsx" => Some(suite::fsx(arg.parse().ok()?)),
        "scenario" => suite::scenarios().into_iter().find(|w| w.id == id),
        _ => None,
    }
}

fn select(args: &Args) -> Result<Vec<Workload>, String> {
    if let Some(id) = &args.replay {
        return workload(id)
            .map(|w| vec![w])
            .ok_or_else(|| format!("no workload {id}"));
    }
    let mut all = suite::scenarios();
    match args.size {
        Size::Quick => {
            all.extend(suite::ace().into_iter().step_by(4));
            // Seeds the full suite does not use.
            all.extend((1_000_000..1_000_100).map(suite::fsx));
        }
        Size::Full => {
            all.extend(suite::ace());
            all.extend((0..args.fsx).map(suite::fsx));
        }
    }
    Ok(all)
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("error")).init();
    let args = Args::parse();
    let workloads = match select(&args) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("ninefold-crash: {e}");
            return ExitCode::FAILURE;
        }
    };
    let params = CrashParams {
        seed: args.seed,
        ..CrashParams::default()
    };
    let recovery_every = args.recovery_every.unwrap_or(match args.size {
        Size::Quick => 32,
        Size::Full => 8,
    });
    let count = workloads.len();
    println!(
        "crash suite: {count} workloads on {} threads (seed {})",
        args.threads, args.seed
    );
    let started = Instant::now();
    let every = (count / 20).max(1);
    let totals = suite::run(
        workloads,
        params,
        recovery_every,
        args.threads,
        args.reports,
        &|o, t| {
            if o.failure.is_some() {
                println!(
                    "FAIL {}: {} violations, {} fsck errors",
                    o.id, o.violations, o.fsck_errors
                );
            }
            if t.workloads % every == 0 || args.replay.is_some() {
                println!(
                    "  {}/{count} workloads, {} states, {:.0} s",
                    t.workloads,
                    t.states,
                    started.elapsed().as_secs_f64()
                );
            }
        },
    );
    for r in &totals.reports {
        println!("\n{r}");
    }
    println!(
        "{} workloads in {:.1} s; {} of the crash states are crashes during a recovery",
        totals.workloads,
        started.elapsed().as_secs_f64(),
        totals.recovery_states
    );
    println!(
        "crash states: {}, violations: {}, fsck errors: {}",
        totals.states, totals.violations, totals.fsck_errors
    );
    if totals.violations + totals.fsck_errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
