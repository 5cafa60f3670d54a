# ninefold: the two commands a user needs are `make run` and `make test`.
# Everything builds into build/ (artifacts) and target/ (cargo).

SHELL := /bin/bash
CARGO ?= cargo
BUILD := build

.PHONY: all test test-host lint fmt clean

all: test

## test: everything CI runs (host tests, then the QEMU tests)
test: test-host

## test-host: unit, property and integration tests of the host crates (fs, net, tools)
test-host:
	$(CARGO) test --workspace --locked

## lint: formatting and clippy with warnings denied
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

fmt:
	$(CARGO) fmt --all

clean:
	rm -rf $(BUILD)
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
bench-peers: guest
	tests/guest/peers $(PEERS_ARGS)

## bench-devices: fio on raw emulated NVMe and virtio-blk disks inside the guest
bench-devices: guest
	tests/guest/devbench
