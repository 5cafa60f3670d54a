#!/bin/sh
# Server guest of the linux-vm-{ext4,btrfs}-nfs peers: nfs-server.sh FS
#
# Makes FS (ext4 or btrfs) on the disk with serial "data", mounts it on /srv and exports
# it with the kernel's NFS server (knfsd, Debian's nfs-kernel-server tools) over NFSv4
# only (TCP 2049; no rpcbind, no NFSv3 (Debian's kernel has no NFSv2), no statd), as
#   /srv NF_NFS_CLIENTS(rw,sync,no_subtree_check,no_root_squash)
# `sync` is the exports(5) default and the safe one: a WRITE the client asks to be stable
# and a COMMIT return only once the data is on the disk (an fsync of the file, so a
# device flush). The 90 s NFSv4 grace period after start is ended at once (nothing to
# reclaim on a fresh filesystem). The control port (7000, ctl.sh) answers "stat" with the
# data disk's /sys/block counters, "nfsd" with /proc/net/rpc/nfsd (operation counts) and
# "quit", as for the diod peers.
set -u
. /job/lib/lib.sh

fs=${1:?usage: nfs-server.sh FS}
threads=${NF_NFSD_THREADS:-8} # Debian's default RPCNFSDCOUNT
nf_mount_local "$fs" /dev/disk/data /srv

modprobe nfsd || nf_die "cannot load nfsd"
mkdir -p /proc/fs/nfsd /var/lib/nfs/v4recovery /run
grep -q " /proc/fs/nfsd " /proc/mounts || mount -t nfsd nfsd /proc/fs/nfsd ||
	nf_die "cannot mount the nfsd filesystem"
: >/var/lib/nfs/etab
: >/var/lib/nfs/rmtab
echo "/srv ${NF_NFS_CLIENTS:-10.0.3.0/24}(rw,sync,no_subtree_check,no_root_squash)" >/etc/exports
exportfs -ra || nf_die "exportfs failed"
# -F: foreground; -N 2 -N 3: NFSv4 only, so mountd only answers the kernel's export
# upcalls (no MOUNT service, no rpcbind).
rpc.mountd -F -N 2 -N 3 &
mountd=$!
echo 10 >/proc/fs/nfsd/nfsv4gracetime
# Unset, knfsd sizes its largest READ/WRITE by the RAM (16 KiB with 128 MiB), as Debian
# leaves it; NF_NFSD_MAX_BLOCK (bytes, up to 1 MiB) overrides that.
if [ -n "${NF_NFSD_MAX_BLOCK:-}" ]; then
	echo "$NF_NFSD_MAX_BLOCK" >/proc/fs/nfsd/max_block_size || nf_die "cannot set max_block_size"
fi
rpc.nfsd -N 3 -p 2049 "$threads" || nf_die "rpc.nfsd failed"
echo Y >/proc/fs/nfsd/v4_end_grace 2>/dev/null || nf_log "warning: cannot end the grace period"

export NF_CTL_DEVS=data
nc -ll -p 7000 -e sh /job/lib/ctl.sh &
ctl=$!
nf_log "knfsd ($threads threads, max block $(cat /proc/fs/nfsd/max_block_size) B, versions $(cat /proc/fs/nfsd/versions)) exporting $fs /srv:" \
	"$(exportfs -v | tr -s ' \t\n' ' ') ($(awk '/MemTotal/ {print $2}' /proc/meminfo) KiB RAM)"

while [ ! -e /tmp/nf-quit ]; do
	kill -0 "$mountd" 2>/dev/null || nf_die "rpc.mountd exited"
	sleep 1
done
nf_log "quit requested; memory: $(awk '/MemAvailable/ {print $2}' /proc/meminfo) KiB available"
kill "$ctl"
rpc.nfsd 0 || nf_log "warning: rpc.nfsd 0 failed"
exportfs -ua
kill "$mountd"
wait "$mountd"
umount /srv || nf_die "umount /srv failed"
