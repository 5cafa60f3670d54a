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
