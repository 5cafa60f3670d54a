"""The guest-to-guest link on tap devices, as a host with a bridge gives its VMs.

`tests/guest/peers --link tap` runs in a network namespace of its own (`unshare --net`,
so root), where this module makes a bridge and one tap per end, each opened by its QEMU
with the virtio-net header (`guestvm.Net.tap`). Against QEMU's `dgram` link (UDP on
127.0.0.1) this takes the host's socket buffers out of the path: a `dgram` end holds
about a dozen jumbo datagrams (`rmem_default`), and a burst larger than that, sent while
the receiving QEMU is descheduled, is lost (docs/benchmarks.md, "Reads"); a tap queues
500 frames. It also lets each guest's NIC offer what a host bridge offers (checksum
offload, TSO/GSO), to every system alike. A server on this host (the ceiling, diod)
listens on the bridge's own address, so its client crosses the same link; one listening
outside the namespace (`--external`) cannot be reached.
"""

import os
import subprocess
import sys

# Set in the namespace this module made, so the re-executed program does not loop.
ENV = "NF_TAPLINK_NETNS"
BRIDGE = "nf-br"
SERVER_TAP, CLIENT_TAP = "nf-srv", "nf-cli"
# The bridge's own address on the link (the guests are 10.0.3.1 and 10.0.3.2): servers
# run on this host (the ceiling, diod) listen there and are reached over the link.
HOST_IP = "10.0.3.254"


def ip(*args):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"taplink: ip {' '.join(args)}: {r.stderr.strip()}")


def enter(mtu):
    """Re-execute this program in a new network namespace (once), then make the bridge
    and both taps there with room for `mtu`-byte IP packets. Returns only inside it."""
    if os.environ.get(ENV) != "1":
        if os.geteuid() != 0:
            sys.exit("taplink: --link tap needs root (a network namespace of its own); "
                     "use --link dgram")  # fmt: skip
        os.environ[ENV] = "1"
        sys.stdout.flush()
        os.execvp("unshare", ["unshare", "--net", "--", sys.executable, *sys.argv])
    mtu = str(max(mtu or 1500, 1500))
    ip("link", "set", "lo", "up")
    ip("link", "add", BRIDGE, "type", "bridge")
    for tap in (SERVER_TAP, CLIENT_TAP):
        # vnet_hdr: QEMU opens it with the virtio-net header (offloads); the flags must
        # match the ones QEMU asks for.
        ip("tuntap", "add", "dev", tap, "mode", "tap", "vnet_hdr")
        ip("link", "set", tap, "mtu", mtu, "master", BRIDGE, "up")
    ip("link", "set", BRIDGE, "mtu", mtu, "up")
    ip("addr", "add", f"{HOST_IP}/24", "dev", BRIDGE)
