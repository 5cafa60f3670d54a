#!/usr/bin/env python3
"""A sampling profiler for the appliance under QEMU, through QEMU's gdbstub.

Under TCG there is no `perf` for the guest, but QEMU's gdbstub (`-gdb tcp:HOST:PORT`)
can stop the vCPU, read its registers and memory, and let it go on. This samples the
appliance that way: every INTERVAL it stops the vCPU, reads rip and rbp, walks the
frame-pointer chain (the image must be built with frame pointers: `make image-profile`),
and continues. At the end it symbolizes every address once with addr2line, inlined
frames included, and prints the self and inclusive shares per function; `--folded`
writes the stacks in the folded format flame-graph tools read.

    tests/bench/profile.py --port 1234 --elf build/appliance-profile.elf --seconds 20

Each sample stops the guest for a few gdbstub round trips (well under a millisecond on
the host): at the default 5 ms interval that costs the guest a few percent. Frames of
functions that keep no frame pointer (the precompiled `core`'s `memcpy`, for one) lose
their caller: the sample is charged to the leaf and the caller's caller.
"""

import argparse
import collections
import re
import socket
import struct
import subprocess
import sys
import time


class GdbStub:
    """Just enough of the GDB remote serial protocol: packets, acks, interrupt."""

    def __init__(self, host, port):
        self.sock = socket.create_connection((host, port), timeout=10)
        # Small packets both ways: without this, Nagle and the delayed ACK add 40 ms a sample.
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.acks = True
        if self.send("QStartNoAckMode") == "OK":
            self.acks = False

    def _read_packet(self):
        while True:
            start = self.buf.find(b"$")
            if start >= 0:
                end = self.buf.find(b"#", start)
                if end >= 0 and len(self.buf) >= end + 3:
                    data = self.buf[start + 1 : end]
                    self.buf = self.buf[end + 3 :]
                    if self.acks:
                        self.sock.sendall(b"+")
                    return data.decode()
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("gdbstub closed the connection")
            self.buf += chunk

    def send(self, data, reply=True):
        csum = sum(data.encode()) & 0xFF
        self.sock.sendall(f"${data}#{csum:02x}".encode())
        return self._read_packet() if reply else None

    def interrupt(self):
        self.sock.sendall(b"\x03")
        return self._read_packet()  # the stop reply

    def cont(self):
        self.send("c", reply=False)

    def registers(self):
        """rip and rbp from the `g` packet (x86-64 order: rax rbx rcx rdx rsi rdi rbp rsp
        r8-r15 rip ..., 8 bytes each, little-endian hex)."""
        regs = bytes.fromhex(self.send("g"))
        rbp = struct.unpack_from("<Q", regs, 6 * 8)[0]
        rip = struct.unpack_from("<Q", regs, 16 * 8)[0]
        return rip, rbp

    def read(self, addr, n):
        r = self.send(f"m{addr:x},{n:x}")
        if r.startswith("E") or len(r) != 2 * n:
            return None
        return bytes.fromhex(r)


def text_range(elf):
    """[start, end) of the image's executable sections, so stray rbp values stop a walk."""
    out = subprocess.run(["readelf", "-SW", elf], capture_output=True, text=True, check=True).stdout
    lo, hi = None, None
    for line in out.splitlines():
        parts = line.replace("[ ", "[").split()
        if len(parts) > 7 and parts[0].startswith("[") and "X" in parts[7]:
            addr, size = int(parts[3], 16), int(parts[5], 16)
            lo = addr if lo is None else min(lo, addr)
            hi = addr + size if hi is None else max(hi, addr + size)
    return lo, hi


def sample(stub, depth, text):
    lo, hi = text
    rip, rbp = stub.registers()
    stack = [rip]
    for _ in range(depth):
        if rbp == 0 or rbp & 7:
            break
        frame = stub.read(rbp, 16)
        if frame is None:
            break
        next_rbp, ret = struct.unpack("<QQ", frame)
        if not lo <= ret < hi:
            break
        stack.append(ret - 1)  # inside the call instruction, for the right line
        if next_rbp <= rbp:
            break
        rbp = next_rbp
    return stack


def symbolize(elf, addrs):
    """address -> [outermost .. innermost function] (inlined frames included)."""
    addrs = sorted(addrs)
    out = subprocess.run(
        ["addr2line", "-f", "-C", "-i", "-e", elf, "-a", *[f"{a:#x}" for a in addrs]],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    names, cur, i = {}, None, 0
    while i < len(out):
        line = out[i]
        if line.startswith("0x"):
            cur = int(line, 16)
            names[cur] = []
            i += 1
            continue
        names[cur].append(short(line))
        i += 2  # the function, then its file:line
    return {a: list(reversed(n)) for a, n in names.items()}


def short(name):
    """Drops generic arguments and the hash, keeps the path's last three segments."""
    depth, out = 0, []
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    # The legacy mangling's hash suffix, not any segment starting with h (kernel::hal).
    name = re.sub(r"::h[0-9a-f]{16}$", "", "".join(out))
    return "::".join(name.split("::")[-3:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True, help="QEMU's -gdb tcp port")
    ap.add_argument("--elf", required=True, help="the image QEMU runs (with frame pointers)")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--interval", type=float, default=0.005, help="seconds between samples")
    ap.add_argument("--depth", type=int, default=64)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--folded", help="write folded stacks here")
    a = ap.parse_args()

    text = text_range(a.elf)
    stub = GdbStub(a.host, a.port)
    stub.interrupt()  # QEMU may or may not stop the guest on attach: stop it for sure
    stacks = collections.Counter()
    deadline = time.monotonic() + a.seconds
    while time.monotonic() < deadline:
        stacks[tuple(sample(stub, a.depth, text))] += 1
        stub.cont()
        time.sleep(a.interval)
        stub.interrupt()
    stub.send("D", reply=True)  # detach: the guest runs on

    names = symbolize(a.elf, {addr for s in stacks for addr in s})
    total = sum(stacks.values())
    self_n, incl_n, folded = collections.Counter(), collections.Counter(), collections.Counter()
    for s, n in stacks.items():
        frames = [f for addr in reversed(s) for f in names.get(addr, [f"{addr:#x}"])]
        self_n[frames[-1]] += n
        for f in set(frames):
            incl_n[f] += n
        folded[";".join(frames)] += n
    print(f"{total} samples over {a.seconds:.0f} s")
    print(f"\n{'self %':>7}  function")
    for f, n in self_n.most_common(a.top):
        print(f"{100 * n / total:7.1f}  {f}")
    print(f"\n{'incl %':>7}  function")
    for f, n in incl_n.most_common(a.top):
        print(f"{100 * n / total:7.1f}  {f}")
    if a.folded:
        with open(a.folded, "w") as out:
            for stack, n in folded.most_common():
                out.write(f"{stack} {n}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
