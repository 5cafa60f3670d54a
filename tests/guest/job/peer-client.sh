#!/bin/sh
# Client guest of the peer benchmarks: peer-client.sh TARGET WORKLOAD...
#
# TARGET is where the workloads run:
#   9p            mount NF_9P_ADDR:NF_9P_PORT, export NF_9P_ANAME, over 9P2000.L/TCP
#   nfs           mount -t nfs4 -o vers=4.2 NF_NFS_ADDR:NF_NFS_PATH (knfsd's operation
#                 counts are recorded too, through NF_CTL)
#   local-ext4    mkfs + mount the client's own disk with serial "data"
#   local-btrfs   likewise with btrfs
# With NF_CTL=ADDR:PORT (a server guest's control port) the server's disk counters are
# recorded too, and the server is told to quit at the end.
set -u
. /job/lib/lib.sh

target=${1:?usage: peer-client.sh TARGET WORKLOAD...}
shift
case $target in
9p)
	if [ -n "${NF_CTL:-}" ]; then
		nf_wait_tcp "${NF_CTL%:*}" "${NF_CTL##*:}" "${NF_MOUNT_WAIT:-60}"
		export NF_STAT_REMOTE=$NF_CTL
	fi
	nf_mount_9p "$NF_9P_ADDR" "$NF_9P_PORT" "$NF_9P_ANAME" /mnt
	;;
nfs)
	nf_wait_tcp "${NF_CTL%:*}" "${NF_CTL##*:}" "${NF_MOUNT_WAIT:-60}"
	export NF_STAT_REMOTE=$NF_CTL NF_STAT_NFSD=$NF_CTL
	nf_mount_nfs "$NF_NFS_ADDR" "$NF_NFS_PATH" /mnt
	;;
local-ext4 | local-btrfs)
	nf_mount_local "${target#local-}" /dev/disk/data /mnt
	export NF_STAT_DEVS=data
	;;
*) nf_die "unknown target $target" ;;
esac

sh /job/lib/bench.sh /mnt "$@"
status=$?
umount /mnt || status=1
if [ -n "${NF_CTL:-}" ]; then
	nf_ctl "$NF_CTL" quit >/dev/null || nf_log "warning: server did not take quit"
fi
exit $status
