#!/usr/bin/env bash
# Prints the QEMU accelerator for `make run`: "kvm" only if the appliance really works
# under KVM on this machine, else "tcg". /dev/kvm existing is not enough: some hosts
# expose a KVM that crashes this guest, or (PVM, nested setups) runs it but crawls: such
# a KVM booted the image in ~1 s here, then needed ~45 s for a heap check TCG does in
# 0.1 s. So the probe boots the image under KVM with `selftest` (the kernel's self-checks,
# well under a second with TCG) and a short timeout, and requires that they all pass.
# The verdict is cached in build/accel; delete it (or `make clean`) to probe again.
# Usage: scripts/accel.sh IMAGE
set -uo pipefail
cd "$(dirname "$0")/.."

image=${1:?usage: accel.sh IMAGE}
QEMU=${QEMU:-qemu-system-x86_64}
cache=build/accel
mkdir -p build

if [[ -s $cache ]]; then
    cat "$cache"
    exit 0
fi

verdict=tcg
reason="no usable /dev/kvm"
if [[ -r /dev/kvm && -w /dev/kvm ]]; then
    log=build/accel-probe.log
    echo "accel: probing KVM (up to 10 s, once)..." >&2
    timeout -k 2 10 "$QEMU" -accel kvm -cpu host -m 128M -smp 1 -nodefaults \
        -display none -monitor none -serial "file:$log" -no-reboot \
        -device isa-debug-exit,iobase=0xf4,iosize=4 \
        -kernel "$image" -append selftest >/dev/null 2>&1
    status=$?
    # 33 = ExitCode::Success through isa-debug-exit (kernel/src/exit.rs).
    if [[ $status == 33 ]] && grep -q "selftest: .* 0 failed" "$log"; then
        verdict=kvm
        reason="the image's self-checks pass under KVM"
    elif [[ $status == 124 || $status == 137 ]]; then
        reason="under KVM the self-checks did not finish within 10 s (see $log)"
    else
        reason="the KVM probe boot failed with status $status (see $log)"
    fi
fi
echo "$verdict" >"$cache"
echo "accel: using $verdict: $reason (cached in $cache)" >&2
echo "$verdict"
