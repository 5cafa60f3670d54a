#!/bin/sh
# File operations over 9P: fsops.sh ADDR PORT ANAME
#
# Mounts ANAME from ADDR:PORT (9P2000.L over TCP, msize 1 MiB requested) and checks
# create, write, fsync, read-back, stat, rename, unlink, mkdir/rmdir and readdir. Leaves
# DIR/kept.txt holding "ninefold $NF_SMOKE_TOKEN" for the host to check on the server.
# Prints one "ok"/"not ok" line per check and "N passed, N failed"; fails if any failed.
set -u
. /job/lib/lib.sh

[ $# = 3 ] || nf_die "usage: fsops.sh ADDR PORT ANAME"
nf_mount_9p "$1" "$2" "$3" /mnt
m=/mnt/fsops
pass=0 fail=0
check() { # DESCRIPTION COMMAND...
	desc=$1
	shift
	if "$@"; then
		pass=$((pass + 1))
		echo "ok - $desc"
	else
		fail=$((fail + 1))
		echo "not ok - $desc"
	fi
}
same() { [ "$1" = "$2" ] || { echo "  expected '$2', got '$1'"; return 1; }; }
absent() { [ ! -e "$1" ] && [ ! -L "$1" ]; }

rm -rf "$m"
check "mkdir" mkdir "$m"
check "create empty file" touch "$m/a"
check "empty file has size 0" same "$(stat -c %s "$m/a")" 0

# 3 MiB + 1 byte of random data: several 1 MiB (or msize-limited) writes and a tail.
head -c $((3 * 1048576 + 1)) /dev/urandom >/tmp/data
want=$(sha256sum </tmp/data | cut -d' ' -f1)
check "write 3 MiB" cp /tmp/data "$m/a"
check "fsync" sync "$m/a"
check "size after write" same "$(stat -c %s "$m/a")" $((3 * 1048576 + 1))
echo 3 >/proc/sys/vm/drop_caches
check "read back" same "$(sha256sum <"$m/a" | cut -d' ' -f1)" "$want"

check "rename" mv "$m/a" "$m/b"
check "old name gone after rename" absent "$m/a"
check "data intact after rename" same "$(sha256sum <"$m/b" | cut -d' ' -f1)" "$want"
check "overwrite in place" sh -c "printf 'XYZ' | dd of='$m/b' bs=1 seek=10 conv=notrunc 2>/dev/null"
check "overwritten bytes" same "$(dd if="$m/b" bs=1 skip=10 count=3 2>/dev/null)" XYZ
check "truncate" truncate -s 4096 "$m/b"
check "size after truncate" same "$(stat -c %s "$m/b")" 4096
check "unlink" rm "$m/b"
check "unlinked file gone" absent "$m/b"

check "mkdir nested" mkdir -p "$m/d/e"
for i in 1 2 3 4 5; do echo "$i" >"$m/d/f$i"; done
check "readdir" same "$(ls "$m/d" | tr '\n' ' ')" "e f1 f2 f3 f4 f5 "
check "rename across directories" mv "$m/d/f1" "$m/d/e/g"
check "file content after move" same "$(cat "$m/d/e/g")" 1
check "rmdir non-empty fails" sh -c "! rmdir '$m/d/e' 2>/dev/null"
rm -f "$m"/d/e/g "$m"/d/f*
check "rmdir" rmdir "$m/d/e" "$m/d"
check "rmdir'ed directory gone" absent "$m/d"

echo "ninefold ${NF_SMOKE_TOKEN:-}" >"$m/kept.txt"
check "fsync kept file" sync "$m/kept.txt"
check "umount" umount /mnt

echo "fsops: $pass passed, $fail failed"
[ "$fail" = 0 ]
