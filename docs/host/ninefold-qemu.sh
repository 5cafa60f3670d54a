#!/usr/bin/env bash
# Boots the ninefold appliance on a Linux host with QEMU/KVM: a passed-through NVMe drive
# (vfio-pci), a virtio-net NIC on a bridge, a static address. docs/real-host.md explains
# every line; tests/tests/host_files.rs boots this very script (TCG, a file instead of the
# NVMe drive, user networking instead of the bridge).
#
# Settings (environment):
#   KERNEL      the appliance image                   (default /var/lib/ninefold/appliance.elf)
#   NVME        PCI address of the NVMe drive to pass through, bound to vfio-pci
#               (e.g. 0000:03:00.0); several, comma-separated, for the legs of a
#               mirrored volume (served with disk=nvme0,nvme1,...); or
#   DISK        a raw image file for an emulated NVMe drive instead (testing); several,
#               comma-separated, for a mirror's legs
#   BRIDGE      host bridge for the NIC (default br0); NET=user:HOSTPORT instead gives
#               QEMU user networking with HOSTPORT forwarded to 9P (testing)
#   MAC         the NIC's MAC address                 (default 52:54:00:9f:00:01)
#   IP, GW      static address/prefix and gateway     (default 192.168.1.50/24, 192.168.1.1)
#   APPEND      more kernel options (README, "Kernel command line")
#   MEM, CPUS   memory and vCPUs                      (default 2G, 2)
#   ACCEL       kvm or tcg                            (default kvm)
#   QMP         QMP socket for `system_powerdown`     (default /run/ninefold/qmp.sock)
#   QEMU        the QEMU binary                       (default qemu-system-x86_64)
set -euo pipefail

kernel=${KERNEL:-/var/lib/ninefold/appliance.elf}
mem=${MEM:-2G}
cpus=${CPUS:-2}
accel=${ACCEL:-kvm}
ip=${IP:-192.168.1.50/24}
gw=${GW:-192.168.1.1}
mac=${MAC:-52:54:00:9f:00:01}
qmp=${QMP:-/run/ninefold/qmp.sock}
# KVM runs the host CPU model; TCG emulates the most it can.
cpu=max
[[ $accel == kvm ]] && cpu=host

disk=()
if [[ -n ${NVME:-} ]]; then
    # The drives belong to the appliance alone: bind them to vfio-pci first
    # (docs/real-host.md, "Passing the NVMe drive through").
    IFS=, read -ra legs <<<"$NVME"
    for addr in "${legs[@]}"; do
        disk+=(-device "vfio-pci,host=$addr")
    done
elif [[ -n ${DISK:-} ]]; then
    IFS=, read -ra legs <<<"$DISK"
    for i in "${!legs[@]}"; do
        disk+=(-drive "file=${legs[$i]},if=none,id=d$i,format=raw,discard=unmap"
            -device "nvme,drive=d$i,serial=nf$i")
    done
else
    echo "ninefold-qemu: set NVME=PCI-ADDRESS (or DISK=IMAGE)" >&2
    exit 2
fi
# Several drives are the legs of one mirrored volume (`ninefold mkfs A B`), each found
# by its label whatever order the guest enumerates them in.
mirror=
if ((${#legs[@]} > 1)); then
    mirror="disk=$(seq -s, -f 'nvme%g' 0 $((${#legs[@]} - 1)))"
fi

net=${NET:-bridge}
case $net in
bridge) netdev="bridge,id=n0,br=${BRIDGE:-br0}" ;;
user:*) netdev="user,id=n0,net=10.0.2.0/24,hostfwd=tcp:127.0.0.1:${net#user:}-:564" ;;
*)
    echo "ninefold-qemu: NET is bridge or user:HOSTPORT" >&2
    exit 2
    ;;
esac

mkdir -p "$(dirname "$qmp")"
exec "${QEMU:-qemu-system-x86_64}" \
    -name ninefold -machine q35 -accel "$accel" -cpu "$cpu" -smp "$cpus" -m "$mem" \
    -display none -vga none -serial stdio -monitor none \
    -qmp "unix:$qmp,server=on,wait=off" \
    -kernel "$kernel" -append "ip=$ip gw=$gw $mirror ${APPEND:-}" \
    "${disk[@]}" \
    -netdev "$netdev" -device "virtio-net-pci,netdev=n0,mac=$mac,romfile="
