#!/bin/sh
# A crash-trace workload from a Linux 9P client: trace.sh ADDR PORT
#
# Mounts the export (v9fs, 9P2000.L over TCP) on /mnt and runs, from /mnt, the plan the
# host made (tests/tests/trace.rs): /job/data/plan.sh, a deterministic shell script
# (tar, dd, mv, sync FILE...) that reads its data from /job/data and prints
# "trace-ack N" after the Nth sync it acknowledges returned. The host notes the trace's
# length when it sees that line. Ends with "trace: plan done".
set -eu
. /job/lib/lib.sh

[ $# = 2 ] || nf_die "usage: trace.sh ADDR PORT"
nf_mount_9p "$1" "$2" / /mnt
cd /mnt
sh -eu /job/data/plan.sh || nf_die "the plan failed"
cd /
umount /mnt
echo "trace: plan done"
