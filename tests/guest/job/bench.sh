#!/bin/sh
# File-system workloads: bench.sh DIR WORKLOAD...
#
# Runs each workload in an empty DIR through nf_measure (results under /results/WORKLOAD,
# parsed on the host by tests/guest/results.py). Workloads:
#   fio-write-jN      fio rw=write bs=64k fsync=1, N jobs (time based)
#   fio-randwrite-jN  fio rw=randwrite bs=4k fsync=1, N jobs (time based)
#   dbench-N          dbench with N clients and Debian's client.txt load file
#   bonnie            bonnie++ -f (no per-character I/O; small file size and count)
#   fsmark            fs_mark: small files, fsync before each close
# Knobs (environment): NF_RUNTIME seconds per fio/dbench run (15), NF_FIO_SIZE file size
# per fio job (64m), NF_BONNIE_MB (32), NF_BONNIE_FILES (x1024, 1), NF_FSMARK_FILES
# (200), NF_FSMARK_SIZE bytes (4096), NF_FSMARK_THREADS (1).
set -u
. /job/lib/lib.sh

[ $# -ge 2 ] || nf_die "usage: bench.sh DIR WORKLOAD..."
dir=$1
shift
rt=${NF_RUNTIME:-15}

fio_fsync() { # RW BS JOBS
	fio --name="$1-$2" --directory="$dir/w" --rw="$1" --bs="$2" --fsync=1 --numjobs="$3" \
		--size="${NF_FIO_SIZE:-64m}" --time_based --runtime="$rt" --fallocate=none \
		--ioengine=psync --group_reporting --output-format=json --output=out.json
}

failed=0
for wl in "$@"; do
	rm -rf "$dir/w"
	mkdir -p "$dir/w" || nf_die "cannot create $dir/w"
	case $wl in
	fio-write-j*) nf_measure "$wl" fio_fsync write 64k "${wl#fio-write-j}" ;;
	fio-randwrite-j*) nf_measure "$wl" fio_fsync randwrite 4k "${wl#fio-randwrite-j}" ;;
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
rm -rf "$dir/w"
[ "$failed" = 0 ] || nf_die "$failed workload(s) failed"
