#!/bin/sh
# Control-port handler of a server guest (run by `nc -ll -e` per connection): reads one
# command from the client guest and answers it.
#   stat   one "NAME f1..f17 FUA" line per disk in NF_CTL_DEVS (after a sync; see
#          nf_devstat)
#   nfsd   /proc/net/rpc/nfsd (knfsd's operation counts; NFS server guests only)
#   sync   write back the page cache; answers "ok"
#   quit   ask the server script to shut down; answers "ok"
. /job/lib/lib.sh
read -r cmd
case $cmd in
stat)
	sync
	for s in $NF_CTL_DEVS; do
		dev=$(nf_dev "$s")
		echo "$s $(cat "/sys/block/$dev/stat") $(nf_fua "$dev")"
	done
	;;
nfsd) cat /proc/net/rpc/nfsd 2>/dev/null || echo "error: no nfsd" ;;
sync) sync && echo ok ;;
quit) touch /tmp/nf-quit && echo ok ;;
*) echo "error: unknown command $cmd" ;;
esac
