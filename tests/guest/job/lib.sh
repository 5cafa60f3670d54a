# Shared shell helpers for scripts running inside the test guest (busybox sh).
# Source it: . /job/lib/lib.sh

nf_log() { echo "[$(hostname) $(cut -d' ' -f1 /proc/uptime)] $*"; }
nf_die() {
	nf_log "error: $*"
	exit 1
}

# nf_check DESCRIPTION COMMAND...: run one check; prints "ok - ..." or "not ok - ...".
nf_pass=0 nf_fail=0
nf_check() {
	nf_desc=$1
	shift
	if "$@"; then
		nf_pass=$((nf_pass + 1))
		echo "ok - $nf_desc"
	else
		nf_fail=$((nf_fail + 1))
		echo "not ok - $nf_desc"
	fi
}

# nf_same GOT WANT: a check command: GOT equals WANT (else says what it got).
nf_same() { [ "$1" = "$2" ] || { echo "  expected '$2', got '$1'"; return 1; }; }

# nf_summary NAME: prints "NAME: N passed, N failed" for the checks so far; fails if any
# failed.
nf_summary() {
	echo "$1: $nf_pass passed, $nf_fail failed"
	[ "$nf_fail" = 0 ]
}

# nf_dev NAME: kernel name (nvme0n1, vdb) of the disk the runner attached with serial NAME.
nf_dev() {
	[ -b "/dev/disk/$1" ] || nf_die "no disk with serial $1 (see /dev/disk/)"
	basename "$(readlink "/dev/disk/$1")"
}

# nf_wait_tcp ADDR PORT [SECONDS]: wait until a TCP port accepts connections.
nf_wait_tcp() {
	i=0
	while ! nc -w 1 "$1" "$2" </dev/null >/dev/null 2>&1; do
		i=$((i + 1))
		[ "$i" -ge "${3:-60}" ] && nf_die "$1:$2 not reachable after ${3:-60} s"
		sleep 1
	done
}

# nf_mount_9p ADDR PORT ANAME MNT [OPTIONS]: mount a 9P2000.L export over TCP, retrying
# while the server comes up (NF_MOUNT_WAIT seconds, default 60).
nf_mount_9p() {
	{ modprobe 9pnet_fd && modprobe 9p; } || nf_die "cannot load the 9p modules"
	mkdir -p "$4"
	opts="trans=tcp,port=$2,version=9p2000.L,msize=${NF_MSIZE:-1048576},aname=$3${5:+,$5}"
	i=0
	until mount -t 9p -o "$opts" "$1" "$4"; do
		i=$((i + 1))
		[ "$i" -ge "${NF_MOUNT_WAIT:-60}" ] && nf_die "mount -t 9p $1 ($opts) failed"
		sleep 1
	done
	nf_log "mounted 9p $1:$2 $3 on $4: $(grep " $4 9p " /proc/mounts | cut -d' ' -f4)"
}

# nf_mount_nfs ADDR PATH MNT [OPTIONS]: mount an NFS export with NFSv4.2 (mount.nfs4 from
# nfs-common, as `mount -t nfs4 -o vers=4.2` runs it), retrying while the server comes up
# (NF_MOUNT_WAIT seconds, default 60). NF_NFS_OPTS adds options.
nf_mount_nfs() {
	modprobe nfsv4 || nf_die "cannot load the nfsv4 module"
	mkdir -p "$3"
	opts="vers=4.2${NF_NFS_OPTS:+,$NF_NFS_OPTS}${4:+,$4}"
	i=0
	until mount.nfs4 "$1:$2" "$3" -o "$opts"; do
		i=$((i + 1))
		[ "$i" -ge "${NF_MOUNT_WAIT:-60}" ] && nf_die "mount -t nfs4 $1:$2 ($opts) failed"
		sleep 1
	done
	nf_log "mounted nfs4 $1:$2 on $3: $(grep " $3 nfs4 " /proc/mounts | cut -d' ' -f4)"
}

# nf_mkfs FS DEV: make an ext4 or btrfs filesystem with default options.
nf_mkfs() {
	case $1 in
	ext4) mkfs.ext4 -q -F "$2" ;;
	btrfs) modprobe btrfs && mkfs.btrfs -q -f "$2" >/dev/null ;;
	*) nf_die "unknown filesystem $1" ;;
	esac || nf_die "mkfs.$1 $2 failed"
}

# nf_trace_start: count block requests per device and kind (rwbs) from now on, with a
# tracefs histogram on block_rq_issue: /sys/block/DEV/stat has no FUA count (nf_fua).
nf_trace_start() {
	nf_tr=/sys/kernel/tracing
	[ -d "$nf_tr/events" ] || mount -t tracefs nodev "$nf_tr" 2>/dev/null
	echo 'hist:keys=dev,rwbs:size=256' >"$nf_tr/events/block/block_rq_issue/trigger" 2>/dev/null ||
		nf_log "warning: no block_rq_issue histogram; FUA writes will not be counted"
}

# nf_fua DEV: FUA writes issued to block device DEV (e.g. nvme0n1) since nf_trace_start,
# or -1 if not counted. rwbs is [F]OP[F][A][S][M]...: a leading F is a preflush, an F
# after the operation FUA.
nf_fua() {
	nf_hist=/sys/kernel/tracing/events/block/block_rq_issue/hist
	if ! grep -q "Hits:" "$nf_hist" 2>/dev/null; then
		echo -1
		return
	fi
	awk -v want="$(awk -F: '{print $1 * 1048576 + $2}' "/sys/block/$1/dev")" '
		/hitcount:/ {
			dev = $0; sub(/.*dev: */, "", dev); sub(/[^0-9].*/, "", dev)
			rwbs = $0; sub(/.*rwbs: */, "", rwbs); sub(/[ }].*/, "", rwbs)
			n = $0; sub(/.*hitcount: */, "", n)
			if (dev != want) next
			if (length(rwbs) > 1 && substr(rwbs, 1, 1) == "F" && index("WRDNF", substr(rwbs, 2, 1))) rwbs = substr(rwbs, 2)
			if (substr(rwbs, 1, 1) == "W" && index(substr(rwbs, 2), "F")) fua += n
		}
		END { print fua + 0 }' "$nf_hist"
}

# nf_mount_local FS DEV MNT: mkfs and mount a local disk.
nf_mount_local() {
	nf_mkfs "$1" "$2"
	nf_trace_start
	modprobe "$1" 2>/dev/null
	mkdir -p "$3"
	mount -t "$1" "$2" "$3" || nf_die "mount -t $1 $2 $3 failed"
	nf_log "mounted $1 $2 on $3: $(grep " $3 $1 " /proc/mounts | cut -d' ' -f4)"
}

# nf_ctl ADDR:PORT COMMAND: one request to a server guest's control port (ctl.sh).
nf_ctl() {
	echo "$2" | nc "${1%:*}" "${1##*:}"
}

# nf_devstat FILE: snapshot the block-device counters the workload is judged by.
#   NF_STAT_DEVS     local disks, by serial (e.g. "data")
#   NF_STAT_REMOTE   ADDR:PORT of a server's control port (a server guest's ctl.sh, or
#                    the appliance's counters service), which reports its disks
#   NF_STAT_JSON     ADDR:PORT of the appliance's counters service: its whole JSON
#                    snapshot goes to FILE.json too
#   NF_STAT_NFSD     ADDR:PORT of an NFS server guest's control port: its
#                    /proc/net/rpc/nfsd goes to FILE.nfsd too
# Each line: "SIDE NAME" + the 17 fields of /sys/block/DEV/stat (Linux >= 5.5; fields 16
# and 17 count flushes) + an 18th: FUA writes (nf_fua; -1 if not counted). The page
# cache is written back first (sync, here and on a server guest), so deferred writeback
# is charged to the workload that caused it.
nf_devstat() {
	sync
	: >"$1"
	for nf_s in ${NF_STAT_DEVS:-}; do
		nf_blk=$(nf_dev "$nf_s")
		echo "local $nf_s $(cat "/sys/block/$nf_blk/stat") $(nf_fua "$nf_blk")" >>"$1"
	done
	if [ -n "${NF_STAT_REMOTE:-}" ]; then
		nf_ctl "$NF_STAT_REMOTE" stat | sed 's/^/remote /' >>"$1"
	fi
	if [ -n "${NF_STAT_JSON:-}" ]; then
		nf_ctl "$NF_STAT_JSON" json >"$1.json"
	fi
	if [ -n "${NF_STAT_NFSD:-}" ]; then
		nf_ctl "$NF_STAT_NFSD" nfsd >"$1.nfsd"
	fi
}

# nf_measure NAME COMMAND...: run one workload with its output under /results/NAME:
#   cmd          the command line          out       its stdout and stderr
#   stat-before  nf_devstat before          stat-after  and after (incl. writeback)
#   meta         key=value: name, label, status, started, seconds, kernel, cpus, memory,
#                write cache mode of each disk
# The command runs in /results/NAME (so tools can write e.g. out.json there). Returns
# the command's status.
nf_measure() {
	name=$1
	shift
	d=/results/$name
	mkdir -p "$d"
	echo "$*" >"$d/cmd"
	nf_devstat "$d/stat-before"
	t0=$(cut -d" " -f1 /proc/uptime)
	nf_log "run $name: $*"
	(cd "$d" && "$@") >"$d/out" 2>&1
	status=$?
	t1=$(cut -d" " -f1 /proc/uptime)
	nf_devstat "$d/stat-after"
	{
		echo "name=$name"
		echo "label=${NF_LABEL:-}"
		echo "status=$status"
		echo "started=$t0" # guest uptime, orders the runs of one guest
		echo "seconds=$(echo "$t0 $t1" | awk '{printf "%.3f", $2 - $1}')"
		echo "kernel=$(uname -r)"
		echo "cpus=$(grep -c ^processor /proc/cpuinfo)"
		echo "mem_kib=$(awk '/MemTotal/ {print $2}' /proc/meminfo)"
		for s in ${NF_STAT_DEVS:-}; do
			echo "write_cache_$s=$(cat "/sys/block/$(nf_dev "$s")/queue/write_cache")"
		done
	} >"$d/meta"
	[ "$status" = 0 ] || { nf_log "$name failed (status $status):"; tail -n 20 "$d/out"; }
	return "$status"
}
