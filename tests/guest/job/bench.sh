#!/bin/sh
# File-system workloads: bench.sh DIR WORKLOAD...
#
# Runs each workload in an empty DIR through nf_measure (results under /results/WORKLOAD,
# parsed on the host by tests/guest/results.py). Workloads:
#   fio-write-jN      fio rw=write bs=64k fsync=1, N jobs (time based)
#   fio-randwrite-jN  fio rw=randwrite bs=4k fsync=1, N jobs (time based)
#   fio-read-jN-T     fio rw=read bs=1m, N jobs, T warm or cold (below)
#   fio-randread-jN-T fio rw=randread bs=4k, N jobs, T warm or cold
#   fio-randrw-jN     fio rw=randrw rwmixread=70 bs=4k fsync=1 (an fsync after every
#                     write, none after reads), N jobs, over a fresh warm-sized file
#   dbench-N          dbench with N clients and Debian's client.txt load file
#   bonnie            bonnie++ -f (no per-character I/O; small file size and count)
#   fsmark            fs_mark: small files, fsync before each close
# Reads go over one file per temperature, laid out once (written in 1 MiB blocks and
# fsynced) and kept for the run; job i of N reads its own 1/N of it (fio offset_increment):
#   warm  NF_READ_WARM_MIB (12): a set the server's cache holds; read once, untimed,
#         right before each measured run, so the server's cache has it
#   cold  NF_READ_COLD_MIB (256): twice a 128 MiB server's memory, so the server's cache
#         cannot hold it; the client drops its own caches before the measured run
# The client must not answer reads from its own page cache: 9P mounts are cache=none
# already; on NFS every read workload runs O_DIRECT (direct=1: each read is an NFS READ);
# on the client's own disk warm reads come from its page cache and cold ones run
# O_DIRECT (from the device). NF_READ_DIRECT=0|1 forces one way for every read workload.
# Knobs (environment): NF_RUNTIME seconds per fio/dbench run (15), NF_FIO_SIZE file size
# per fio job (64m), NF_BONNIE_MB (32), NF_BONNIE_FILES (x1024, 1), NF_FSMARK_FILES
# (200), NF_FSMARK_SIZE bytes (4096), NF_FSMARK_THREADS (1), NF_READ_WARM_MIB,
# NF_READ_COLD_MIB, NF_READ_DIRECT.
set -u
. /job/lib/lib.sh

[ $# -ge 2 ] || nf_die "usage: bench.sh DIR WORKLOAD..."
dir=$1
shift
rt=${NF_RUNTIME:-15}
sets=$dir/nf-read

fio_fsync() { # RW BS JOBS
	fio --name="$1-$2" --directory="$dir/w" --rw="$1" --bs="$2" --fsync=1 --numjobs="$3" \
		--size="${NF_FIO_SIZE:-64m}" --time_based --runtime="$rt" --fallocate=none \
		--ioengine=psync --group_reporting --output-format=json --output=out.json
}

# The file system DIR is on: 9p, nfs4, ext4, btrfs...
fstype=$(awk -v d="$dir" '$2 == d { t = $3 } END { print t }' /proc/mounts)

# read_direct TEMPERATURE: fio's direct= for a read workload (see the header).
read_direct() {
	if [ -n "${NF_READ_DIRECT:-}" ]; then
		echo "$NF_READ_DIRECT"
		return
	fi
	case $fstype in
	nfs*) echo 1 ;;
	9p) echo 0 ;;
	*) [ "$1" = cold ] && echo 1 || echo 0 ;;
	esac
}

# set_mib TEMPERATURE: the size of a temperature's file set, MiB.
set_mib() {
	if [ "$1" = cold ]; then echo "${NF_READ_COLD_MIB:-256}"; else echo "${NF_READ_WARM_MIB:-12}"; fi
}

# layout FILE MIB: write FILE in 1 MiB blocks and fsync it (untimed, not measured; fio's
# output in /tmp).
layout() {
	nf_log "lay out $1: $2 MiB"
	mkdir -p "$(dirname "$1")"
	t0=$(cut -d" " -f1 /proc/uptime)
	fio --name=layout --filename="$1" --rw=write --bs=1m --size="$2m" --end_fsync=1 \
		--fallocate=none --ioengine=psync >/tmp/nf-layout.out 2>&1 ||
		{ nf_log "cannot lay out $1:"; tail -n 5 /tmp/nf-layout.out; rm -f "$1"; return 1; }
	nf_log "laid out $1 in $(echo "$t0 $(cut -d" " -f1 /proc/uptime)" | awk '{printf "%.1f", $2 - $1}') s"
}

# read_once FILE MIB DIRECT: one untimed sequential pass, so the server's cache holds FILE
# (and, on a local disk with DIRECT 0, the client's page cache).
read_once() {
	fio --name=warmup --filename="$1" --rw=read --bs=1m --size="$2m" --invalidate=0 \
		--direct="$3" --ioengine=psync >/tmp/nf-warmup.out 2>&1 ||
		{ nf_log "cannot read $1:"; tail -n 5 /tmp/nf-warmup.out; return 1; }
}

# prepare TEMPERATURE: the temperature's file set in $f, laid out on first use; warm: read
# once now; cold: the client's caches dropped now.
prepare() {
	f=$sets/$1.dat
	mib=$(set_mib "$1")
	[ -f "$f" ] || layout "$f" "$mib" || return 1
	if [ "$1" = warm ]; then
		read_once "$f" "$mib" "$(read_direct warm)"
	else
		sync
		echo 3 >/proc/sys/vm/drop_caches
	fi
}

# netstat NAME SIDE: the client's network counters (TCP and its extensions, the NIC's),
# kept beside a read workload's results as net-SIDE: a reply lost on the way shows as
# out-of-order segments and dropped frames here (results.py: "client_net").
netstat() {
	{
		cat /proc/net/snmp /proc/net/netstat
		for nf_c in rx_packets rx_dropped rx_errors rx_over_errors tx_packets; do
			echo "Nic: $nf_c $(cat "/sys/class/net/eth0/statistics/$nf_c" 2>/dev/null || echo 0)"
		done
	} >"/results/$1/net-$2" 2>/dev/null
}

# read_workload NAME RW BS: fio-read-jN-T and fio-randread-jN-T.
read_workload() {
	spec=${1#fio-*read-j}
	jobs=${spec%-*} temp=${spec#*-}
	case $temp in warm | cold) ;; *) nf_die "$1: warm or cold?" ;; esac
	prepare "$temp" || return 1
	direct=$(read_direct "$temp")
	# Warm runs keep the page cache (fio's invalidate=1 drops the file's pages first).
	inval=1
	[ "$temp" = warm ] && inval=0
	per=$(($(set_mib "$temp") * 1024 / jobs))
	mkdir -p "/results/$1"
	netstat "$1" before
	nf_measure "$1" fio --name="$2-$3" --filename="$f" --rw="$2" --bs="$3" --numjobs="$jobs" \
		--size="${per}k" --offset_increment="${per}k" --direct="$direct" --invalidate="$inval" \
		--time_based --runtime="$rt" --fallocate=none --ioengine=psync --group_reporting \
		--output-format=json --output=out.json
	status=$?
	netstat "$1" after
	return $status
}

# mixed_workload NAME: fio-randrw-jN over a fresh warm-sized file in DIR/w (laid out,
# fsynced, read once), so its writes do not move the warm set's blocks.
mixed_workload() {
	jobs=${1#fio-randrw-j}
	f=$dir/w/mixed.dat
	mib=$(set_mib warm)
	direct=$(read_direct warm)
	layout "$f" "$mib" && read_once "$f" "$mib" "$direct" || return 1
	per=$((mib * 1024 / jobs))
	nf_measure "$1" fio --name=randrw-4k --filename="$f" --rw=randrw --rwmixread=70 --bs=4k \
		--fsync=1 --numjobs="$jobs" --size="${per}k" --offset_increment="${per}k" \
		--direct="$direct" --invalidate=0 --time_based --runtime="$rt" --fallocate=none \
		--ioengine=psync --group_reporting --output-format=json --output=out.json
}

failed=0
for wl in "$@"; do
	rm -rf "$dir/w"
	mkdir -p "$dir/w" || nf_die "cannot create $dir/w"
	case $wl in
	fio-write-j*) nf_measure "$wl" fio_fsync write 64k "${wl#fio-write-j}" ;;
	fio-randwrite-j*) nf_measure "$wl" fio_fsync randwrite 4k "${wl#fio-randwrite-j}" ;;
	fio-read-j*) read_workload "$wl" read 1m ;;
	fio-randread-j*) read_workload "$wl" randread 4k ;;
	fio-randrw-j*) mixed_workload "$wl" ;;
	dbench-*)
		nf_measure "$wl" dbench -D "$dir/w" -t "$rt" -c /usr/share/dbench/client.txt \
			"${wl#dbench-}"
		;;
	bonnie)
		mb=${NF_BONNIE_MB:-32}
		nf_measure "$wl" bonnie++ -d "$dir/w" -s "$mb" -r $((mb / 2)) \
			-n "${NF_BONNIE_FILES:-1}" -f -u root -q
		;;
	fsmark)
		nf_measure "$wl" fs_mark -d "$dir/w" -n "${NF_FSMARK_FILES:-200}" \
			-s "${NF_FSMARK_SIZE:-4096}" -t "${NF_FSMARK_THREADS:-1}" -S 1 -L 1
		;;
	*) nf_die "unknown workload $wl" ;;
	esac || failed=$((failed + 1))
done
rm -rf "$dir/w" "$sets"
[ "$failed" = 0 ] || nf_die "$failed workload(s) failed"
