"""The ninefold appliance in QEMU, as a peer of the Linux guests (tests/guest/peers).

It gets what the Linux server guest gets: the same QEMU machine (q35, TCG, -cpu max),
memory, vCPUs (each a host thread: multi-threaded TCG), an emulated NVMe disk of the
same size with the same cache mode (formatted fresh by `ninefold mkfs`), and the
listening end of the same guest-to-guest link (-netdev stream) with a static address.
Its serial console goes to a log file, its structured events (the second serial port)
to another beside it (`LOG` without `.log`, then `.events.log`). There is no clean
shutdown: `stop` kills QEMU, after which `fsck` checks the image.

    app = Appliance(elf, tool, disk, disk_size, log, mem="128M", cpus=1,
                    net=Net.listen(25650, "10.0.3.1/24"))
    app.start(); app.wait_for_event("ready", serving=True)
    ...
    app.stop(); status, report = app.fsck()

With `legs=2` it gets a second disk of the same kind and size (`DISK.leg1`), both made one
mirrored volume by `ninefold mkfs A B` and served with `disk=nvme0,nvme1`.
"""

import json
import os
import signal
import subprocess
import time

from guestvm import GuestError, Net

# The appliance's counters service port (its stats= default).
STATS_PORT = 5641
# The prefix of the appliance's structured events on its event channel, the second serial
# port (kernel/src/event.rs).
EVENT_PREFIX = "EVENT "


class Appliance:
    def __init__(self, elf, tool, disk, disk_size, log, mem="128M", cpus=1, net=None,
                 append="", timeout=3600, qemu_extra=(), legs=1):  # fmt: skip
        self.elf, self.tool, self.disk, self.disk_size = elf, tool, disk, disk_size
        # The images of a mirrored volume's legs (one: a single device).
        self.disks = [disk] + [f"{disk}.leg{i}" for i in range(1, legs)]
        # More QEMU arguments, e.g. `-gdb tcp:...` for tests/bench/profile.py.
        self.qemu_extra = list(qemu_extra)
        self.log, self.mem, self.cpus, self.append = log, mem, cpus, append
        # The event channel (COM2): the `EVENT {json}` lines.
        self.events = log.removesuffix(".log") + ".events.log"
        self.net = net or Net()
        self.timeout = timeout
        self.proc = None

    def qemu_cmd(self):
        append = self.append
        if self.net.ip:
            append = f"ip={self.net.ip} {append}".strip()
        if self.net.mtu:
            append = f"mtu={self.net.mtu} {append}".strip()
        if len(self.disks) > 1:
            nvme = ",".join(f"nvme{i}" for i in range(len(self.disks)))
            append = f"disk={nvme} {append}".strip()
        drives = []
        for i, disk in enumerate(self.disks):
            serial = "data" if i == 0 else f"data{i}"
            drives += [
                "-drive", f"file={disk},if=none,id=d{i},format=raw,cache=writeback",
                "-device", f"nvme,drive=d{i},serial={serial}",
            ]  # fmt: skip
        netargs = self.net.qemu_args("52:54:00:9f:00:01")
        if netargs:
            # The appliance drives the modern virtio-net device only.
            netargs[-1] += ",disable-legacy=on"
        return [
            "qemu-system-x86_64",
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            # MTTCG (QEMU's default for x86-64 on an x86-64 host), stated: with one thread
            # for all vCPUs an -smp N appliance could not use more than one host core.
            "-accel", "tcg,thread=multi", "-cpu", "max", "-M", "q35",
            "-m", str(self.mem), "-smp", str(self.cpus),
            "-kernel", self.elf, "-append", append,
            "-serial", f"file:{self.log}", "-serial", f"file:{self.events}",
            "-device", "isa-debug-exit,iobase=0xf4,iosize=4",
            *drives,
            *netargs,
            *self.qemu_extra,
        ]  # fmt: skip

    def mkfs(self):
        """A fresh image: `ninefold mkfs` on a new sparse file."""
        for disk in self.disks:
            if os.path.exists(disk):
                os.unlink(disk)
        out = subprocess.run(
            [self.tool, "mkfs", *self.disks, "--size", str(self.disk_size), "--label", "bench"],
            capture_output=True, text=True,
        )  # fmt: skip
        if out.returncode:
            raise GuestError(f"ninefold mkfs failed: {out.stdout}{out.stderr}")

    def start(self):
        self.mkfs()
        os.makedirs(os.path.dirname(os.path.abspath(self.log)), exist_ok=True)
        open(self.log, "w").close()
        open(self.events, "w").close()
        cmd = ["timeout", "-k", "5", str(int(self.timeout))] + self.qemu_cmd()
        with open(self.log + ".cmd", "w") as f:
            f.write(" ".join(cmd) + "\n")
        # Its own process group, so that a kill reaches QEMU and not only timeout(1).
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(self.log + ".stderr", "w"), start_new_session=True,
        )  # fmt: skip
        return self

    def console(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def wait_for(self, text, timeout=60):
        """Waits for a console line containing `text`; returns the line."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.console().splitlines():
                if text in line:
                    return line
            if self.proc.poll() is not None:
                raise GuestError(f"appliance exited ({self.proc.returncode}) before {text!r}; see {self.log}")
            if time.monotonic() > deadline:
                raise GuestError(f"appliance: no {text!r} after {timeout} s; see {self.log}")
            time.sleep(0.1)

    def event_log(self):
        """The event channel's lines, then the console's: images built before the event
        channel (2026-11-29) wrote their `EVENT` lines on the console, and an A/B against
        one (`make bench`'s --baseline) runs it with today's harness."""
        text = ""
        for path in (self.events, self.log):
            with open(path, errors="replace") as f:
                text += f.read()
        return text

    def wait_for_event(self, kind, timeout=60, **fields):
        """Waits for the appliance's structured event `kind` (a line `EVENT {json}` on its
        event channel, docs/testing.md "Events") whose fields include `fields`; returns its
        object."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.event_log().splitlines():
                _, sep, body = line.partition(EVENT_PREFIX)
                if not sep:
                    continue
                try:
                    event = json.loads(body)
                except ValueError:
                    continue
                if event.get("event") == kind and all(event.get(k) == v for k, v in fields.items()):
                    return event
            if self.proc.poll() is not None:
                raise GuestError(f"appliance exited ({self.proc.returncode}) before event {kind}; see {self.log}, {self.events}")
            if time.monotonic() > deadline:
                raise GuestError(f"appliance: no event {kind} {fields} after {timeout} s; see {self.log}, {self.events}")
            time.sleep(0.1)

    def stop(self):
        """Kills QEMU (SIGKILL: the appliance has no shutdown; every stop is a crash)."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def fsck(self):
        """`ninefold fsck` on the (stopped) image: (exit status, report)."""
        out = subprocess.run([self.tool, "fsck", *self.disks], capture_output=True, text=True)
        return out.returncode, out.stdout + out.stderr
