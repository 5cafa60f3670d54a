#!/bin/sh
# POSIX locks over 9P, as applications see them: locks.sh ADDR PORT
#
# Mounts the export twice, as two 9P connections (so two lock owners the server must
# tell apart, as for two clients), and checks with fcntl(F_GETLK) (nf-lock) that:
# - on a file nobody locked, F_GETLK says F_UNLCK;
# - while a process holds a write lock through the other mount, F_GETLK through this
#   one reports it: type, range and pid (Linux reports a remote holder's pid negated);
# - once that process exits, the file is free again.
# Then sqlite3 in journal_mode=persist: its hot-journal check is an F_GETLK.
# Prints one "ok"/"not ok" line per check and "locks: N passed, N failed".
set -u
. /job/lib/lib.sh

[ $# = 2 ] || nf_die "usage: locks.sh ADDR PORT"
nf_mount_9p "$1" "$2" / /mnt
nf_mount_9p "$1" "$2" / /mnt2
mkdir -p /mnt/locks
: >/mnt/locks/f

nf_check "F_GETLK on a free file: F_UNLCK" nf_same "$(nf-lock /mnt/locks/f test wr 0 0)" unlck
nf-lock /mnt2/locks/f hold wr 10 20 >/tmp/holder &
holder=$!
i=0
until grep -q held /tmp/holder || [ $i -ge 50 ]; do
	sleep 0.1
	i=$((i + 1))
done
nf_check "lock taken through the second mount" nf_same "$(cat /tmp/holder)" "held $holder"
nf_check "F_GETLK(F_WRLCK) sees it" \
	nf_same "$(nf-lock /mnt/locks/f test wr 0 0)" "wrlck 10 20 -$holder"
nf_check "F_GETLK(F_RDLCK) sees it" \
	nf_same "$(nf-lock /mnt/locks/f test rd 25 100)" "wrlck 10 20 -$holder"
nf_check "F_GETLK past it: F_UNLCK" nf_same "$(nf-lock /mnt/locks/f test wr 30 0)" unlck
kill "$holder"
wait "$holder" 2>/dev/null
nf_check "free again after the holder exits" \
	nf_same "$(nf-lock /mnt/locks/f test wr 0 0)" unlck

db=/mnt/locks/persist.db
sql() { sqlite3 "$db" "PRAGMA journal_mode=persist; $1" 2>&1 | tr '\n' ' '; }
nf_check "sqlite3 journal_mode=persist: create" \
	nf_same "$(sql "CREATE TABLE t(x); INSERT INTO t VALUES(1);")" "persist "
nf_check "sqlite3: the persisted journal is left" test -e "$db-journal"
nf_check "sqlite3: a transaction past the hot-journal check" \
	nf_same "$(sql "INSERT INTO t VALUES(2); SELECT count(*) FROM t;")" "persist 2 "

rm -rf /mnt/locks
umount /mnt2
nf_check "umount" umount /mnt
nf_summary locks
