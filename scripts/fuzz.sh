#!/usr/bin/env bash
# The fuzz targets of fuzz/ (docs/testing.md, "Fuzzing"), driven without cargo-fuzz:
# libFuzzer comes from the libfuzzer-sys crate, the targets are built with the
# sanitizer-coverage flags cargo-fuzz passes, with a pinned nightly toolchain (only
# here: the project's own toolchain stays the one rust-toolchain.toml pins).
#
#   scripts/fuzz.sh build              build the targets (instrumented, release + checks)
#   scripts/fuzz.sh run                fuzz each target FUZZ_SECONDS (default 60)
#   scripts/fuzz.sh fuzz               the same without building first
#   scripts/fuzz.sh replay             run every seed and regression input once
#   scripts/fuzz.sh seeds              regenerate the seed corpora (fuzz/corpus/*/seed-*)
#   scripts/fuzz.sh toolchain          print (installing if needed) the nightly it uses
#
# FUZZ_TARGETS="node receive" picks targets (default: all). FUZZ_JOBS: cargo's -j
# (default 1: the machine is shared). FUZZ_ARGS: more libFuzzer options for `run`.
# FUZZ_TOOLCHAIN: another toolchain (default the pinned nightly below). FUZZ_BIN_DIR:
# run the binaries found there (e.g. a copy, while the build dir is rebuilt).
# FUZZ_PROFILE: the cargo profile (default release; CI uses fuzz-ci, fuzz/Cargo.toml).
#
# Where things go (build/fuzz/): target/ the build, corpus/TARGET/ what the fuzzer
# found interesting (the seeds in fuzz/corpus/ are only read), artifacts/TARGET/ the
# crashing, timing-out or leaking inputs, logs/TARGET.log libFuzzer's output, and
# summary.txt one line per target (its latest run).
set -euo pipefail
cd "$(dirname "$0")/.."

# The nightly the targets are built with: a dated one, so runs are reproducible. Its
# rustc reports "1.97.0-nightly (e50aa6fba 2026-05-19)".
PINNED=nightly-2026-05-20
PINNED_RUSTC="(e50aa6fba 2026-05-19)"
TARGETS_ALL="node superblock image log_replay receive ninep_wire ninep_server ctl cmdline compress wrapped_key"
TARGETS=${FUZZ_TARGETS:-$TARGETS_ALL}
OUT=build/fuzz
HOST=x86_64-unknown-linux-gnu
PROFILE=${FUZZ_PROFILE:-release}
export CARGO_TARGET_DIR=$PWD/$OUT/target

# The toolchain to build with: FUZZ_TOOLCHAIN, else the pinned nightly under its dated
# name, else an installed `nightly` that is that very build, else the pinned one
# installed now (a fresh machine with rustup: a minimal profile is enough).
toolchain() {
    if [[ -n ${FUZZ_TOOLCHAIN:-} ]]; then
        echo "$FUZZ_TOOLCHAIN"
        return
    fi
    if rustup toolchain list | grep -q "^$PINNED"; then
        echo "$PINNED"
        return
    fi
    if rustup toolchain list | grep -q '^nightly-x86_64' &&
        [[ $(rustup run nightly rustc -V 2>/dev/null) == *"$PINNED_RUSTC"* ]]; then
        echo nightly
        return
    fi
    echo "fuzz: installing $PINNED (rustup, minimal profile)" >&2
    rustup toolchain install "$PINNED" --profile minimal >&2
    echo "$PINNED"
}

# libFuzzer's runtime is C++ (compiled by libfuzzer-sys's build script).
need_cxx() {
    command -v c++ >/dev/null 2>&1 && return
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "fuzz: installing g++ (apt-get)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++ >&2
    else
        echo "fuzz: a C++ compiler is needed (libFuzzer), e.g.: sudo apt-get install g++" >&2
        exit 1
    fi
}

build() {
    need_cxx
    local tc
    tc=$(toolchain)
    local bins=()
    for t in $TARGETS; do bins+=(--bin "$t"); done
    # As cargo-fuzz builds (src/project.rs there), without a sanitizer: the code is
    # safe Rust (`unsafe_code` is forbidden in fs/ and net/), so ASan would find little
    # for its 2-3x cost. Overflow checks and debug assertions come from fuzz/Cargo.toml's
    # release profile. --target keeps the flags off build scripts and proc macros.
    echo "fuzz: building ${TARGETS// /, } with $tc ($(rustup run "$tc" rustc -V))" >&2
    RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cllvm-args=-simplifycfg-branch-fold-threshold=0 \
-Cllvm-args=-sanitizer-coverage-stack-depth --cfg fuzzing ${RUSTFLAGS:-}" \
        cargo "+$tc" build --manifest-path fuzz/Cargo.toml --locked --profile "$PROFILE" \
        --target "$HOST" -j "${FUZZ_JOBS:-1}" "${bins[@]}"
}

bin() { echo "${FUZZ_BIN_DIR:-$CARGO_TARGET_DIR/$HOST/$PROFILE}/$1"; }

# Inputs a target is run on besides what it finds: its seeds and its regressions.
inputs() {
    local d
    for d in fuzz/corpus/$1 fuzz/regressions/$1; do
        [[ -d $d ]] && echo "$d"
    done
    return 0
}

# Every seed and regression input once, per target; fails if one crashes.
replay() {
    local failed=0 t n
    for t in $TARGETS; do
        mapfile -t dirs < <(inputs "$t")
        n=$(find "${dirs[@]}" -type f | wc -l)
        mkdir -p "$OUT/logs"
        local start=$SECONDS
        if "$(bin "$t")" -runs=0 -timeout=60 -rss_limit_mb=4096 "${dirs[@]}" \
            >"$OUT/logs/$t.replay.log" 2>&1; then
            echo "fuzz replay: $t: $n inputs ok ($((SECONDS - start)) s)"
        else
            echo "fuzz replay: $t: FAILED (log: $OUT/logs/$t.replay.log)"
            grep -E "panicked|ERROR|SUMMARY|Test unit written" "$OUT/logs/$t.replay.log" | head -5 || true
            failed=1
        fi
    done
    return $failed
}

# Fuzzes each target FUZZ_SECONDS; fails if one found a crash, a timeout or an OOM.
run() {
    local secs=${FUZZ_SECONDS:-60} failed=0 t
    mkdir -p "$OUT/logs" "$OUT/summary"
    for t in $TARGETS; do
        mkdir -p "$OUT/corpus/$t" "$OUT/artifacts/$t"
        mapfile -t dirs < <(inputs "$t")
        local log=$OUT/logs/$t.log rc=0 start=$SECONDS
        # -timeout: one input may take this long (a hang is a finding); -rss_limit_mb:
        # a runaway allocation is one too. FUZZ_ARGS may override either.
        "$(bin "$t")" -max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 \
            -max_len=262144 -print_final_stats=1 \
            -artifact_prefix="$OUT/artifacts/$t/" ${FUZZ_ARGS:-} \
            "$OUT/corpus/$t" "${dirs[@]}" >"$log" 2>&1 || rc=$?
        local took=$((SECONDS - start)) execs cov ft
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
        cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
        ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
        local corpus
        corpus=$(find "$OUT/corpus/$t" -type f | wc -l)
        local line="$t: ${took}s, ${execs:-?} execs ($((${execs:-0} / (took > 0 ? took : 1)))/s), cov ${cov:-?}, ft ${ft:-?}, corpus +$corpus"
        if [[ $rc != 0 ]]; then
            line+=", FAILED (rc $rc): $(ls "$OUT/artifacts/$t" | tail -1)"
            failed=1
            grep -E "panicked|ERROR: libFuzzer|SUMMARY" "$log" | head -3 >&2 || true
        fi
        echo "fuzz: $line"
        echo "$(date -u +%FT%TZ) $line" >"$OUT/summary/$t.txt"
    done
    # One line per target, the latest run of each.
    for t in $TARGETS_ALL; do
        [[ -f $OUT/summary/$t.txt ]] && cat "$OUT/summary/$t.txt"
    done >"$OUT/summary.txt"
    return $failed
}

# Seeds are made by the same library, built without the instrumentation.
seeds() {
    local tc
    tc=$(toolchain)
    need_cxx
    CARGO_TARGET_DIR=$PWD/$OUT/seeds-target cargo "+$tc" run --manifest-path fuzz/Cargo.toml \
        --locked -j "${FUZZ_JOBS:-1}" --bin seeds -- "$PWD/fuzz/corpus" ${FUZZ_TARGETS:-}
}

case ${1:-} in
    toolchain) toolchain ;;
    build) build ;;
    run) build && run ;;
    fuzz) run ;;
    replay) build && replay ;;
    seeds) seeds ;;
    *)
        sed -n '2,/^set -e/p' "$0" | sed '$d' >&2
        exit 2
        ;;
esac
