#!/bin/sh
# Two tenants of one appliance, through real Linux clients: tenants.sh SERVER PORT A_SRC B_SRC
#
# The appliance exports `a` (quota'd, allowed only from A_SRC) and `b` (allowed only from
# B_SRC). This guest holds both addresses: it mounts `b` from B_SRC (the route's source
# address switched while it connects; a 9P mount keeps its one TCP connection), and
# everything else from A_SRC. Tenant A then runs each attack — disk space and inodes to
# its quota, every lock its share allows, the CPU from eight readers, every connection
# slot — and after each, tenant B's honest work (create, write, fsync, read back, mkdir,
# a lock, a fresh mount) must succeed, each step within NF_TENANT_BOUND seconds (the
# hostile suite's honest-client bound). Prints one "ok"/"not ok" line per check and
# "tenants: N passed, N failed".
set -u
. /job/lib/lib.sh

[ $# = 4 ] || nf_die "usage: tenants.sh SERVER PORT A_SRC B_SRC"
server=$1 port=$2 a_src=$3 b_src=$4
bound=${NF_TENANT_BOUND:-5}
ip addr add "$b_src/24" dev eth0 || nf_die "cannot add $b_src"

# as_b COMMAND...: connect with B's address as the source.
as_b() {
	ip route replace "$server/32" dev eth0 src "$b_src" || return 1
	"$@"
	rc=$?
	ip route del "$server/32" dev eth0 2>/dev/null
	return $rc
}

nf_mount_9p "$server" "$port" a /a
as_b nf_mount_9p "$server" "$port" b /b
# Each of B's steps, bounded: B's service must not wait for A.
b() { timeout "$bound" sh -c "$1"; }
n=0
honest_b() {
	n=$((n + 1))
	nf_check "B after $1: create and write" b "head -c 65536 /dev/urandom >/b/f$n && sync /b/f$n"
	nf_check "B after $1: read back" b "[ \$(stat -c %s /b/f$n) = 65536 ] && cat /b/f$n >/dev/null"
	nf_check "B after $1: mkdir" b "mkdir /b/d$n"
	nf_check "B after $1: setxattr" b "setfattr -n user.t -v $n /b/f$n"
}
honest_b "nothing"

# Disk space: A writes until its quota refuses; B's writes and fsyncs go on.
dd if=/dev/zero of=/a/big bs=65536 count=1024 2>/tmp/dd.err
nf_check "A's writes stop at its quota (EDQUOT)" grep -q "quota exceeded" /tmp/dd.err
nf_check "A's file holds no more than its quota" [ "$(stat -c %s /a/big)" -le $((4 * 1048576)) ]
nf_check "A's df shows its quota" [ "$(df -k /a | awk 'NR == 2 { print $2 }')" -eq 4096 ]
nf_check "B's df shows the filesystem" [ "$(df -k /b | awk 'NR == 2 { print $2 }')" -gt 4096 ]
honest_b "A filled its space"
rm -f /a/big

# Inodes: A creates until refused.
i=0
while touch "/a/i$i" 2>/tmp/touch.err; do
	i=$((i + 1))
	[ $i -gt 200 ] && break
done
nf_check "A's creates stop at its inode quota" grep -q "quota exceeded" /tmp/touch.err
honest_b "A used its inodes"
rm -f /a/i*

# Locks: A holds locks until its share refuses one (ENOLCK); B still locks.
: >/a/locks
i=0 holders=""
while [ $i -lt 200 ]; do
	nf-lock /a/locks hold wr $((i * 2)) 1 >/tmp/lock.$i 2>&1 &
	holders="$holders $!"
	j=0
	until [ -s /tmp/lock.$i ] || [ $j -ge 50 ]; do
		sleep 0.1
		j=$((j + 1))
	done
	grep -q held /tmp/lock.$i || break
	i=$((i + 1))
done
nf_check "A's locks stop at its share ($i held)" grep -q "No locks available" /tmp/lock.$i
: >/b/locks
nf-lock /b/locks hold wr 0 1 >/tmp/block 2>&1 &
bholder=$!
j=0
until [ -s /tmp/block ] || [ $j -ge $((bound * 10)) ]; do
	sleep 0.1
	j=$((j + 1))
done
nf_check "B takes a lock while A holds its share" grep -q held /tmp/block
kill $bholder $holders 2>/dev/null
wait 2>/dev/null
honest_b "A held its locks"

# CPU: eight of A's readers loop over a file while B works.
head -c 1048576 /dev/zero >/a/hot
readers=""
for r in 1 2 3 4 5 6 7 8; do
	(while :; do cat /a/hot >/dev/null || exit; done) &
	readers="$readers $!"
done
sleep 2
honest_b "A's readers started"
honest_b "A's readers ran"
kill $readers 2>/dev/null
wait 2>/dev/null

# Connection slots: A mounts export a again and again (past the appliance's
# max_conns); B's existing mount keeps working and a new one of B's is served.
for m in $(seq 1 "${NF_TENANT_A_MOUNTS:-12}"); do
	mkdir -p "/a$m"
	opts="trans=tcp,port=$port,version=9p2000.L,aname=a"
	timeout 20 mount -t 9p -o "$opts" "$server" "/a$m" 2>/dev/null
done
honest_b "A took every slot"
mkdir -p /b2
nf_check "B mounts again while A holds every slot" \
	as_b timeout "$bound" mount -t 9p -o "trans=tcp,port=$port,version=9p2000.L,aname=b" "$server" /b2
nf_check "B's new mount reads" b "[ -f /b2/f1 ]"

nf_summary tenants
