# ninefold: the two commands a user needs are `make run` and `make test`.
# Everything builds into build/ (artifacts) and target/ (cargo).

SHELL := /bin/bash
CARGO ?= cargo
QEMU ?= qemu-system-x86_64
BUILD := build
TARGET := x86_64-unknown-none

## The appliance image, and the disk `make run` gives it.
IMAGE := $(BUILD)/appliance.elf
KERNEL_ELF := target/$(TARGET)/release/ninefold-kernel

## `make run` knobs (override on the command line: make run MEM=1G PORT=15640).
# Guest memory.
MEM ?= 512M
# Virtual CPUs: every one serves 9P connections (default: as many as this host has cores).
SMP ?= $(shell nproc)
# Host TCP port (on 127.0.0.1) forwarded to the appliance's 9P port.
PORT ?= 5640
# The appliance's 9P port (passed as port= on its command line).
NINEP_PORT ?= 564
# Host TCP port (on 127.0.0.1) forwarded to the appliance's counters service (stats=).
STATS_PORT ?= 5641
# The disk image attached as an NVMe namespace (created and formatted with `ninefold mkfs`
# if missing).
DISK ?= $(BUILD)/disk.img
DISK_SIZE ?= 1G
# What 9P serves: `disk` = the filesystem on DISK; `memory` = an empty in-memory
# filesystem (development mode: nothing is stored).
FS ?= disk
# Extra kernel command-line options, e.g. APPEND="log=debug ip=10.0.2.15/24 gw=10.0.2.2".
APPEND ?=
# Accelerator: empty = probe (scripts/accel.sh: kvm only if it really works here).
ACCEL ?=
# Host TCP port (on 127.0.0.1) of QEMU's QMP socket: Ctrl-C presses the power button
# through it (scripts/run.sh).
QMP_PORT ?= 5642
# Seconds Ctrl-C waits for the clean shutdown before killing QEMU.
STOP_TIMEOUT ?= 45
# Where `make run` writes the appliance's structured events (its second serial port; the
# console, the first, is the terminal).
EVENTS ?= $(BUILD)/events.log

.PHONY: all deps image tool run test test-host test-qemu lint fmt clean bench-net crash crash-quick bench-meta

## The host tool (mkfs, fsck, dump, serve).
TOOL := target/debug/ninefold

all: test

## deps: install (or name) what building and booting needs: QEMU, the Rust target
deps:
	@QEMU=$(QEMU) scripts/deps.sh

## image: the bootable appliance, build/appliance.elf (boot it with QEMU -kernel)
image:
	$(CARGO) build --locked -p ninefold-kernel --target $(TARGET) --release
	@mkdir -p $(BUILD)
	cp $(KERNEL_ELF) $(IMAGE)

## image-profile: the image with frame pointers, build/appliance-profile.elf, for the sampling
## profiler (tests/bench/profile.py; `tests/bench/load.py --profile`); its own target dir
.PHONY: image-profile
image-profile:
	CARGO_TARGET_DIR=$(BUILD)/profile-target \
	CARGO_TARGET_X86_64_UNKNOWN_NONE_RUSTFLAGS="-C relocation-model=static -C force-frame-pointers=yes --cfg poly1305_backend=\"soft\"" \
	$(CARGO) build --locked -p ninefold-kernel --target $(TARGET) --release
	@mkdir -p $(BUILD)
	cp $(BUILD)/profile-target/$(TARGET)/release/ninefold-kernel $(BUILD)/appliance-profile.elf

## tool: the host CLI, target/debug/ninefold (mkfs, fsck, dump, serve)
tool:
	$(CARGO) build --locked -p ninefold-tools

$(DISK): | tool
	@mkdir -p $(dir $(DISK))
	$(TOOL) mkfs $(DISK) --size $(DISK_SIZE) --label ninefold

## run: boot the appliance with an NVMe disk and a NIC; 127.0.0.1:$(PORT) reaches its 9P
## port, 127.0.0.1:$(STATS_PORT) its counters; its structured events go to $(EVENTS). Ctrl-C
## shuts it down cleanly (the ACPI power button, through QMP on 127.0.0.1:$(QMP_PORT));
## Ctrl-A X quits QEMU at once.
run: deps image $(DISK)
	@accel="$(ACCEL)"; [[ -n $$accel ]] || accel=$$(QEMU=$(QEMU) scripts/accel.sh $(IMAGE)); \
	cpu=; [[ $$accel == kvm ]] && cpu="-cpu host"; \
	echo "run: $(QEMU) with $$accel, $(SMP) vCPU(s), $(MEM), disk $(DISK) as NVMe, 127.0.0.1:$(PORT) -> 9P port $(NINEP_PORT), 127.0.0.1:$(STATS_PORT) -> counters, events in $(EVENTS) (stop: Ctrl-C, clean shutdown; quit at once: Ctrl-A X)"; \
	QMP_PORT=$(QMP_PORT) STOP_TIMEOUT=$(STOP_TIMEOUT) EVENTS=$(EVENTS) exec scripts/run.sh \
		$(QEMU) -accel $$accel $$cpu -m $(MEM) -smp $(SMP) -nodefaults -display none \
		-no-reboot \
		-device isa-debug-exit,iobase=0xf4,iosize=4 \
		-kernel $(IMAGE) -append "$(strip port=$(NINEP_PORT) fs=$(FS) $(APPEND))" \
		-drive file=$(DISK),if=none,id=disk0,format=raw,discard=unmap \
		-device nvme,drive=disk0,serial=ninefold0 \
		-netdev user,id=net0,hostfwd=tcp:127.0.0.1:$(PORT)-:$(NINEP_PORT),hostfwd=tcp:127.0.0.1:$(STATS_PORT)-:5641 \
		-device virtio-net-pci,netdev=net0,disable-legacy=on,romfile=

## test: everything CI runs: host tests, then the QEMU boot tests
test: test-host test-qemu

## test-host: unit, property and integration tests of every crate that runs on the host
## (fs, net, tools, and the pure parts of kernel and boot), then a slice of the crash suite
test-host:
	$(CARGO) test --workspace --locked --exclude ninefold-tests
	$(MAKE) crash-quick

## crash: the crash suite (docs/durability.md): ACE-style sequences, seeded random
## sequences, fstests scenarios and concurrent fsyncs; every crash state is mounted
## (log replay), fsck'd and checked against the contract. Ends with
## `crash states: N, violations: V, fsck errors: E`. CRASH_ARGS=--help for options.
## The full kill test (crash-kill, below) runs first so the suite's line ends the output.
CRASH_FSX ?= 3000
crash: crash-kill crash-trace crash-sim

## crash-trace: crash states from the real appliance's own block traces: the appliance
## boots under QEMU's blklogwrites on NVMe and on virtio-blk, four workloads (writers,
## smallfiles, replace, truncate) run over 9P from the host and three (guest-tar,
## guest-writers, guest-replace) from the Linux test guest's v9fs, once (seed 1,
## GUEST_TRACE_OPS synced operations), each logging what was acknowledged; the
## traces (build/traces/, recorded at test time) are enumerated, mounted, fsck'd and
## checked by `ninefold crash-trace`; then the power-cut test and the device-fault tests.
## Ends with `trace crash states: N, violations: V, fsck errors: E` and
## `device faults: N injected, acknowledged-and-lost: L, fsck errors: E`.
TRACE_OPS ?= 400
# One recording per seed, disk and workload (4 x 2 x 4 = 32 recordings, ~100,000 states).
TRACE_SEEDS ?= 1,2,3,4
TRACE_DIR := $(BUILD)/traces
# The guest workloads: ~2-3 min of recording each under TCG, 6 recordings.
GUEST_TRACE_OPS ?= 200
.PHONY: crash-trace
crash-trace: deps image guest tool
	rm -rf $(TRACE_DIR)
	NINEFOLD_IMAGE=$(abspath $(IMAGE)) NINEFOLD_QEMU=$(QEMU) NINEFOLD_TOOL=$(abspath $(TOOL)) \
		NINEFOLD_TRACE_OUT=$(abspath $(TRACE_DIR)) NINEFOLD_TRACE_OPS=$(TRACE_OPS) NINEFOLD_TRACE_SEEDS=$(TRACE_SEEDS) \
		NINEFOLD_TRACE_DISKS=nvme,virtio NINEFOLD_TRACE_WORKLOADS=writers,smallfiles,replace,truncate \
		NINEFOLD_TRACE_PORT=16410 \
		$(CARGO) test --locked -p ninefold-tests --test trace -- --nocapture --test-threads=1
	NINEFOLD_IMAGE=$(abspath $(IMAGE)) NINEFOLD_QEMU=$(QEMU) NINEFOLD_TOOL=$(abspath $(TOOL)) \
		NINEFOLD_TRACE_OUT=$(abspath $(TRACE_DIR)) NINEFOLD_TRACE_OPS=$(GUEST_TRACE_OPS) NINEFOLD_TRACE_SEEDS=1 \
		NINEFOLD_TRACE_DISKS=nvme,virtio NINEFOLD_TRACE_WORKLOADS=guest-tar,guest-writers,guest-replace \
		NINEFOLD_TRACE_PORT=16410 \
		$(CARGO) test --locked -p ninefold-tests --test trace -- --nocapture --test-threads=1 crash_states
	@set -o pipefail; $(CARGO) run --locked --release -p ninefold-tools --bin ninefold -- \
		crash-trace $(TRACE_DIR)/*/ $(TRACE_ARGS) | tee $(TRACE_DIR)/summary.txt
	@set -o pipefail; NINEFOLD_IMAGE=$(abspath $(IMAGE)) NINEFOLD_QEMU=$(QEMU) NINEFOLD_TOOL=$(abspath $(TOOL)) \
		$(CARGO) test --locked -p ninefold-tests --test faults -- --nocapture --test-threads=1 \
		| tee $(BUILD)/faults.log
	@awk '/device faults: [0-9]/{sub(/.*device faults: /, "device faults: "); n+=$$3; l+=$$6; e+=$$9} END {printf "device faults: %d injected, acknowledged-and-lost: %d, fsck errors: %d\n", n, l, e}' $(BUILD)/faults.log
	@tail -1 $(BUILD)/traces/summary.txt

## crash-sim: the crash simulator part of `make crash` alone (host only, no QEMU)
.PHONY: crash-sim
crash-sim:
	$(CARGO) run --locked --profile crash -p ninefold-tools --bin ninefold-crash -- --size full --fsx $(CRASH_FSX) $(CRASH_ARGS)

## bench-meta: an fs_mark-like workload under the reclaim-driven write policy and the 4 KiB
## baseline, and group commit at 1/4/16 fsyncers: build/bench/btree-writes.json
bench-meta:
	$(CARGO) run --locked --release -p ninefold-tools --bin ninefold-bench-meta -- --out $(BUILD)/bench/btree-writes.json $(BENCH_ARGS)

## bench-host: host-side measurements (release build; figures printed, nothing asserted):
## the filesystem on a RAM disk, crash-state enumeration and checking, 9P lock requests
## with 40,000 locks held, the 9P server's CPU time per request, snapshot streams of 2 GiB
.PHONY: bench-host
bench-host:
	$(CARGO) bench --locked -p ninefold-fs -p ninefold-ninep --bench fs_measure --bench crash_states --bench locks --bench requests --bench streams

## crash-quick: the slice of the crash suite `make test` runs
crash-quick:
	$(CARGO) run --locked --profile crash -p ninefold-tools --bin ninefold-crash -- --size quick $(CRASH_ARGS)

## test-qemu: boot build/appliance.elf in QEMU (tests/): devices, self-checks, faults, the
## disk's filesystem served over 9P/TCP (images made and checked with the host tool), the
## NIC's offloads on a tap in a network namespace of the test's own (as root; skipped,
## saying why, elsewhere), a short kill test, the short slice of the hostile-client suite,
## and a Linux guest mounting it (the guest is built first, cached)
test-qemu: deps image guest tool
	NINEFOLD_IMAGE=$(abspath $(IMAGE)) NINEFOLD_QEMU=$(QEMU) NINEFOLD_TOOL=$(abspath $(TOOL)) \
		$(CARGO) test --locked -p ninefold-tests -- --test-threads=2

## crash-kill: the full kill test: SIGKILL the appliance at random moments under
## fsync-heavy 9P writes, 20 times on NVMe (8 writers) and 10 on virtio-blk; fsck after
## every kill, every acknowledged byte after every restart. KILL_SEED=N repeats a run.
.PHONY: crash-kill
crash-kill: deps image tool
	NINEFOLD_IMAGE=$(abspath $(IMAGE)) NINEFOLD_QEMU=$(QEMU) NINEFOLD_TOOL=$(abspath $(TOOL)) \
		NINEFOLD_KILLS=$${KILLS:-20} NINEFOLD_KILL_WRITERS=8 NINEFOLD_KILL_PORT=15843 \
		$${KILL_SEED:+NINEFOLD_KILL_SEED=$$KILL_SEED} \
		$(CARGO) test --locked -p ninefold-tests --test kill -- --nocapture acknowledged_fsyncs_survive_kills
	NINEFOLD_IMAGE=$(abspath $(IMAGE)) NINEFOLD_QEMU=$(QEMU) NINEFOLD_TOOL=$(abspath $(TOOL)) \
		NINEFOLD_KILLS=10 NINEFOLD_KILL_DISK=virtio NINEFOLD_KILL_PORT=15845 \
		$${KILL_SEED:+NINEFOLD_KILL_SEED=$$KILL_SEED} \
		$(CARGO) test --locked -p ninefold-tests --test kill -- --nocapture acknowledged_fsyncs_survive_kills

## soak: the hostile-client suite in full (docs/testing.md, "Hostile clients"): every
## probe at 128 MiB and at 512 MiB while honest clients work, ~40 s each; prints the honest
## latency table and writes it to build/soak/report.json. ~25 min.
## NINEFOLD_HOSTILE_PROBES=name,... runs some probes; NINEFOLD_SOAK_MEMORY=128M one size;
## NINEFOLD_HOSTILE_SEED=N repeats a fuzz run.
.PHONY: soak
soak: deps image tool
	NINEFOLD_IMAGE=$(abspath $(IMAGE)) NINEFOLD_QEMU=$(QEMU) NINEFOLD_TOOL=$(abspath $(TOOL)) \
		NINEFOLD_SOAK_REPORT=$(abspath $(BUILD)/soak/report.json) \
		$(CARGO) test --locked -p ninefold-tests --test hostile -- --ignored --nocapture soak

## bench-net: 9P throughput (1 MiB messages) and small-request latency from the host
## against the appliance in QEMU (TCG): docs/benchmarks.md, section Network
bench-net: deps image
	NINEFOLD_IMAGE=$(abspath $(IMAGE)) NINEFOLD_QEMU=$(QEMU) \
		$(CARGO) run --locked --release -p ninefold-tests --bin ninep-bench -- $(BENCH_ARGS)

## bench-nic: the NIC's checksum offload and TSO measured: the appliance on a tap device
## (with the virtio-net header) in a network namespace of its own, read from the host side
## with offloads on and off (offload=off), alternately: MiB/s, the appliance's and QEMU's
## CPU per MiB, frames per MiB (docs/benchmarks.md, Network). Needs root (unshare -n).
## BENCH_ARGS="MIB PASSES ROUNDS" (default 64 2 3)
.PHONY: bench-nic
bench-nic: deps image
	$(CARGO) build --locked --release -p ninefold-tests --bin ninep-tap-bench
	NINEFOLD_IMAGE=$(abspath $(IMAGE)) NINEFOLD_QEMU=$(QEMU) \
		unshare -n target/release/ninep-tap-bench $(BENCH_ARGS)

## fuzz: the coverage-guided fuzz targets of fuzz/ (docs/testing.md, "Fuzzing"), built
## with a pinned nightly (scripts/fuzz.sh; installed with rustup if missing), each run
## FUZZ_SECONDS (default 600) one after another; FUZZ_TARGETS="node receive" picks some.
## Per-target logs, new corpus entries and crashing inputs go to build/fuzz/; the
## summary line per target to build/fuzz/summary.txt.
FUZZ_SECONDS ?= 600
.PHONY: fuzz fuzz-replay fuzz-seeds
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh run

## fuzz-replay: every seed (fuzz/corpus/) and regression input (fuzz/regressions/) once
fuzz-replay:
	scripts/fuzz.sh replay

## fuzz-seeds: regenerate the seed corpora with the filesystem's own code (after a format
## change)
fuzz-seeds:
	scripts/fuzz.sh seeds

## lint: formatting, the layer check of fs/src (docs/filesystem.md, "Layers") and clippy
## with warnings denied (host crates, then boot and kernel
## for the appliance target)
lint:
	$(CARGO) fmt --all --check
	$(CARGO) run --locked -q -p ninefold-layers
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	$(CARGO) clippy -p ninefold-kernel -p ninefold-boot --target $(TARGET) --locked -- -D warnings
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml --check

fmt:
	$(CARGO) fmt --all
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml

## clean: build outputs and the KVM verdict; the disk image (your data) stays
clean:
	rm -f $(IMAGE) $(BUILD)/accel $(BUILD)/accel-probe.log
	$(CARGO) clean

# --- Linux guest harness (tests/guest, docs/guests.md) ---------------------------------
.PHONY: guest test-guest bench-peers bench-devices

## guest: build the Linux test guest from Debian packages (cached in build/guest/out)
guest:
	tests/guest/build-guest

## test-guest: smoke test: the guest mounts a host diod export over 9P/TCP, checks file ops
test-guest:
	tests/guest/smoke

## bench-peers: fio/dbench/... in the client guest against the peers; PEERS_ARGS=--help
bench-peers: image tool guest
	tests/guest/peers $(PEERS_ARGS)

## bench: the appliance against the Linux peers (diod and NFS server VMs on ext4 and btrfs,
## the client's own disk) and the in-memory ceiling (fio fsync=1 at 1/4/16 jobs, randwrite,
## dbench, bonnie++, fs_mark; fio reads: 1 MiB sequential and 4 KiB random, warm and cold,
## and a randrw mix with fsync) in one run; writes build/bench/report.{json,md} and charts.
## The guests' link: taps on a bridge in a network namespace of the run's own as root
## (--link tap), else QEMU's UDP link (--link dgram). About 70 min; BENCH_ARGS=--writes (the writes only, ~30 min), --reads (the reads only,
## 37 min), --quick (~8 min), --baseline REPORT.json, or --system/--workload/--runtime (--help)
.PHONY: bench
bench: image tool guest
	tests/bench/fs.py $(BENCH_ARGS)

## bench-load: the appliance, the Linux server VMs (diod on btrfs and ext4) and the in-memory
## ceiling driven from the host by the native 9P load generator (tests/src/bin/ninep-load.rs;
## 9P only, so not the NFS peers of `make bench`; writes with fsync, creates, getattr, and
## warm 4 KiB random and 1 MiB sequential reads of one shared file)
## at 1/4/16/64 connections: build/bench/load.{json,md} and load-*.png. The appliance runs
## once per vCPU count of SMP= (default 1,2: systems ninefold-smp1, ninefold-smp2; the Linux
## VMs keep 1 vCPU); every point reports ops/s, p99, each vCPU's busy share and the host's
## own CPU use. ~30 min (the reads 9 of them); BENCH_ARGS=--quick (~12 min) or
## --system/--workload/--conns/--seconds (--help)
.PHONY: bench-load
# Its own default, whatever SMP means to other targets (make SMP=1,2,4 bench-load still wins).
bench-load: SMP = 1,2
bench-load: deps image guest
	$(CARGO) build --locked --release -p ninefold-tools --bin ninefold -p ninefold-tests --bin ninep-load
	tests/bench/load.py --smp $(SMP) $(BENCH_ARGS)

## bench-devices: fio on raw emulated NVMe and virtio-blk disks inside the guest
bench-devices: guest
	tests/guest/devbench

## bench-dev: device benchmark, the appliance's drivers vs Linux's (fio) on the same emulated
## NVMe and virtio-blk disks; writes build/bench/device.json (BENCH_ARGS=--help)
.PHONY: bench-dev
bench-dev: image guest
	tests/bench/device.py $(BENCH_ARGS)
