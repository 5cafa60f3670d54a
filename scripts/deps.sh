#!/usr/bin/env bash
# Makes sure this machine can build and boot the appliance: QEMU (Debian's
# qemu-system-x86), promtool (Debian's prometheus: the metrics test checks /metrics with
# it), xmllint (libxml2-utils) and libvirt's domain schemas (extracted from Debian's
# libvirt0 into build/libvirt-schemas: tests/tests/host_files.rs validates the libvirt
# domain in docs/host with them) and the Rust target x86_64-unknown-none of the pinned
# toolchain.
# Installs what is missing when it can (apt-get as root, rustup); otherwise says exactly
# what to install and fails.
set -euo pipefail
cd "$(dirname "$0")/.."

QEMU=${QEMU:-qemu-system-x86_64}
missing=0

if ! command -v "$QEMU" >/dev/null 2>&1; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "deps: installing qemu-system-x86 (apt-get)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            qemu-system-x86 >&2
    else
        echo "deps: $QEMU not found. Install it, e.g.: sudo apt-get install qemu-system-x86" >&2
        missing=1
    fi
fi

if ! command -v promtool >/dev/null 2>&1; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "deps: installing prometheus for promtool (apt-get)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            prometheus >&2
    else
        echo "deps: promtool not found. Install it, e.g.: sudo apt-get install prometheus" >&2
        missing=1
    fi
fi

# Installs Debian package $2 for command $1 when missing (as root with apt-get).
need() {
    command -v "$1" >/dev/null 2>&1 && return
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "deps: installing $2 for $1 (apt-get)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >&2
    else
        echo "deps: $1 not found. Install it, e.g.: sudo apt-get install $2" >&2
        missing=1
    fi
}
need xmllint libxml2-utils
# `ninefold top`'s terminal test draws it in a detached tmux session.
need tmux tmux

# libvirt's schemas without libvirt: only the files, from the package, into build/.
schemas=build/libvirt-schemas
if [[ ! -f $schemas/domain.rng ]]; then
    tmp=$(mktemp -d)
    chmod 755 "$tmp" # apt downloads as _apt
    if (cd "$tmp" && apt-get download -qq libvirt0 >&2) &&
        dpkg-deb -x "$tmp"/libvirt0_*.deb "$tmp/root"; then
        mkdir -p "$schemas"
        cp "$tmp"/root/usr/share/libvirt/schemas/*.rng "$schemas/"
        echo "deps: libvirt schemas in $schemas" >&2
    else
        echo "deps: could not fetch libvirt's schemas (apt-get download libvirt0)" >&2
        missing=1
    fi
    rm -rf "$tmp"
fi

if command -v rustup >/dev/null 2>&1; then
    # rust-toolchain.toml selects the pinned toolchain for this directory.
    if ! rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-none; then
        echo "deps: adding the Rust target x86_64-unknown-none" >&2
        rustup target add x86_64-unknown-none >&2 || {
            echo "deps: could not add it. Run: rustup target add x86_64-unknown-none" >&2
            missing=1
        }
    fi
elif ! rustc --print target-list 2>/dev/null | grep -qx x86_64-unknown-none; then
    echo "deps: no rustup; install the toolchain in rust-toolchain.toml with its" \
        "x86_64-unknown-none target (https://rustup.rs)" >&2
    missing=1
fi

exit "$missing"
