#!/bin/sh
# File operations over 9P: fsops.sh ADDR PORT ANAME
#
# Mounts ANAME from ADDR:PORT (9P2000.L over TCP, msize 1 MiB requested) and checks
# create, write, fsync, read-back, stat, rename, truncate, unlink, mkdir/rmdir, readdir,
# symlinks and hard links, set-gid kept or cleared by chmod as another user, and (with
# NF_FSOPS_XATTR=1) user xattrs. Leaves
# DIR/kept.txt holding "ninefold $NF_SMOKE_TOKEN" for the host to check on the server.
# Prints one "ok"/"not ok" line per check and "N passed, N failed"; fails if any failed.
set -u
. /job/lib/lib.sh

[ $# = 3 ] || nf_die "usage: fsops.sh ADDR PORT ANAME"
nf_mount_9p "$1" "$2" "$3" /mnt
m=/mnt/fsops
check() { nf_check "$@"; }
same() { nf_same "$@"; }
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

check "symlink" ln -s some/target "$m/sl"
check "readlink" same "$(readlink "$m/sl")" some/target
check "symlink is a link" test -L "$m/sl"
echo linked >"$m/l1"
check "hard link" ln "$m/l1" "$m/l2"
check "link count 2" same "$(stat -c %h "$m/l1")" 2
check "same inode" same "$(stat -c %i "$m/l2")" "$(stat -c %i "$m/l1")"
check "data through the second name" same "$(cat "$m/l2")" linked
check "unlink the first name" rm "$m/l1"
check "link count 1" same "$(stat -c %h "$m/l2")" 1
check "data after unlinking the first name" same "$(cat "$m/l2")" linked
check "remove links" rm "$m/sl" "$m/l2"
check "links gone" absent "$m/l2"

if [ "${NF_FSOPS_XATTR:-0}" = 1 ]; then
	echo x >"$m/x"
	check "setxattr" setfattr -n user.color -v blue "$m/x"
	check "getxattr" same "$(getfattr --only-values -n user.color "$m/x")" blue
	check "listxattr" sh -c "getfattr -d '$m/x' | grep -qx 'user.color=\"blue\"'"
	check "replace xattr" setfattr -n user.color -v green "$m/x"
	check "replaced value" same "$(getfattr --only-values -n user.color "$m/x")" green
	check "removexattr" setfattr -x user.color "$m/x"
	check "removed xattr gone" sh -c "! getfattr -n user.color '$m/x' >/dev/null 2>&1"
	rm -f "$m/x"
fi

# Set-gid (pjdfstest chmod/12, issue 37): 9P2000.L's Tsetattr carries no caller groups,
# so the client applies the rule (Linux's setattr_prepare) and the server stores what
# it is sent: an owner in the file's group keeps S_ISGID, one outside it sends it
# cleared. User nf (1000, group 1000) exists only in this guest; with access=user its
# requests go on its own attach.
grep -q '^nf:' /etc/passwd || echo 'nf:x:1000:1000::/tmp:/bin/sh' >>/etc/passwd
grep -q '^nf:' /etc/group || echo 'nf:x:1000:' >>/etc/group
as_nf() { su -s /bin/sh nf -c "$1"; }
mkdir "$m/sg" && chown 1000:1000 "$m/sg"
check "set-gid: owner in the file's group" as_nf "touch '$m/sg/in' && chmod 02755 '$m/sg/in'"
check "set-gid: kept" same "$(stat -c %a "$m/sg/in")" 2755
touch "$m/sg/out" && chown 1000:0 "$m/sg/out"
check "set-gid: owner outside the file's group" as_nf "chmod 02755 '$m/sg/out'"
check "set-gid: cleared" same "$(stat -c %a "$m/sg/out")" 755
rm -rf "$m/sg"

echo "ninefold ${NF_SMOKE_TOKEN:-}" >"$m/kept.txt"
check "fsync kept file" sync "$m/kept.txt"
check "umount" umount /mnt

nf_summary fsops
