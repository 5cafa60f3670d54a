#!/bin/sh
# Raw-device benchmark: devbench.sh SERIAL... (disks the runner attached, e.g. an NVMe
# disk with serial "nvme" and a virtio-blk disk with serial "vblk").
#
# On each device, through fio with direct I/O (results under /results/SERIAL-TEST):
#   randwrite-4k-qd1    4 KiB random writes, libaio, queue depth 1
#   randwrite-4k-qd32   4 KiB random writes, libaio, queue depth 32
#   write-128k          128 KiB sequential writes, libaio, queue depth NF_SEQ_QD (1)
#   write-flush-4k      4 KiB sequential writes each followed by fdatasync (= a device
#                       flush): fio's "sync" latency is the flush latency
# Knobs: NF_RUNTIME seconds per test (10), NF_DEV_SPAN bytes of the device used (1g),
# NF_DEV_TESTS to run a subset.
set -u
. /job/lib/lib.sh

[ $# -ge 1 ] || nf_die "usage: devbench.sh SERIAL..."
rt=${NF_RUNTIME:-10}
tests=${NF_DEV_TESTS:-randwrite-4k-qd1 randwrite-4k-qd32 write-128k write-flush-4k}

dev_fio() { # DEV NAME FIO-OPTIONS...
	dev=$1 name=$2
	shift 2
	fio --name="$name" --filename="$dev" --direct=1 --size="${NF_DEV_SPAN:-1g}" \
		--time_based --runtime="$rt" --group_reporting --output-format=json \
		--output=out.json "$@"
}

failed=0
for serial in "$@"; do
	dev=/dev/$(nf_dev "$serial")
	export NF_STAT_DEVS=$serial
	nf_log "$serial is $dev: $(cat "/sys/block/${dev#/dev/}/queue/write_cache"), $(($(cat "/sys/block/${dev#/dev/}/size") / 2048)) MiB"
	for t in $tests; do
		case $t in
		randwrite-4k-qd1) opts="--ioengine=libaio --rw=randwrite --bs=4k --iodepth=1" ;;
		randwrite-4k-qd32) opts="--ioengine=libaio --rw=randwrite --bs=4k --iodepth=32" ;;
		write-128k) opts="--ioengine=libaio --rw=write --bs=128k --iodepth=${NF_SEQ_QD:-1}" ;;
		write-flush-4k) opts="--ioengine=psync --rw=write --bs=4k --fdatasync=1" ;;
		*) nf_die "unknown test $t" ;;
		esac
		# shellcheck disable=SC2086 # $opts is a list of options
		nf_measure "$serial-$t" dev_fio "$dev" "$t" $opts || failed=$((failed + 1))
	done
done
[ "$failed" = 0 ] || nf_die "$failed test(s) failed"
