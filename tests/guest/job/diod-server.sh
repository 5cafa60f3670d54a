#!/bin/sh
# Server guest of the linux-vm-{ext4,btrfs}-diod peers: diod-server.sh FS [PORT]
#
# Makes FS (ext4 or btrfs) on the disk with serial "data", mounts it on /srv and exports
# it with diod over 9P2000.L on TCP PORT (default 564). A control port (7000, ctl.sh)
# answers "stat" with the data disk's /sys/block counters and "sync"; "quit" makes this
# script unmount and return, so the guest powers off cleanly.
set -u
. /job/lib/lib.sh

fs=${1:?usage: diod-server.sh FS [PORT]}
port=${2:-564}
nf_mount_local "$fs" /dev/disk/data /srv

export NF_CTL_DEVS=data
nc -ll -p 7000 -e sh /job/lib/ctl.sh &
ctl=$!
# -n: no authentication; the export is reachable only over the private test link.
diod -f -n -l "0.0.0.0:$port" -e /srv -L stderr &
diod=$!
nf_log "diod exporting $fs /srv on port $port ($(awk '/MemTotal/ {print $2}' /proc/meminfo) KiB RAM)"

while [ ! -e /tmp/nf-quit ]; do
	kill -0 "$diod" 2>/dev/null || nf_die "diod exited"
	sleep 1
done
nf_log "quit requested; memory: $(awk '/MemAvailable/ {print $2}' /proc/meminfo) KiB available"
kill "$diod" "$ctl"
wait "$diod"
umount /srv || nf_die "umount /srv failed"
