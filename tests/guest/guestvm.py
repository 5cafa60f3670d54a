#!/usr/bin/env python3
"""Boot the ninefold Linux test guest under QEMU and run one shell script in it.

Library for test drivers (Python) and the engine of the `run-guest` command line tool.

    from guestvm import Guest, Disk, Net
    g = Guest("job/smoke.sh", args=["10.0.2.2", "25641"], net=Net.user())
    res = g.run()            # boot, run, wait; res.status is the script's exit status

A guest is the Debian kernel (build/guest/out/vmlinux) with one of two initramfs images:
`client` (all tools) or `server` (no benchmark tools, for small server VMs). The script
and the shared guest scripts of tests/guest/job/ travel as a tar through QEMU's fw_cfg
and unpack to /job; the script runs as /job/main with its arguments. The guest's /init
prints "NF-GUEST-EXIT token=T status=N" on the serial console and powers off; the token
is random per run, so nothing else on the console can be mistaken for it. Files the
script leaves under /results come back through a raw disk holding a tar stream.
"""

import dataclasses
import io
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
JOB_LIB = os.path.join(HERE, "job")

# Exit codes of run-guest for failures of the harness itself (the script's own status is
# passed through): 124 like timeout(1), 125 for anything else.
EXIT_TIMEOUT = 124
EXIT_HARNESS = 125

RESULTS_SERIAL = "nf-results"
RESULTS_DISK_SIZE = 256 << 20  # sparse; bounds what a job can leave in /results
MARKER = re.compile(r"NF-GUEST-EXIT token=(\w+) status=(\d+)")


def out_dir():
    build = os.environ.get("BUILD", os.path.join(REPO, "build"))
    if not os.path.isabs(build):
        build = os.path.join(REPO, build)
    return os.path.join(build, "guest", "out")


def parse_size(text):
    """'512M', '2G', '4096' -> bytes."""
    m = re.fullmatch(r"(\d+)([KMGT]?)i?B?", text.strip(), re.I)
    if not m:
        raise ValueError(f"bad size {text!r}")
    return int(m.group(1)) << (10 * " KMGT".index(m.group(2).upper() or " "))


class GuestError(Exception):
    """The harness failed (no marker, timeout, QEMU error); `code` is the exit code."""

    def __init__(self, msg, code=EXIT_HARNESS):
        super().__init__(msg)
        self.code = code


@dataclasses.dataclass
class Disk:
    """A block device for the guest, named /dev/disk/<serial> inside it.

    kind: "nvme" or "virtio-blk". size: when given, `path` is created anew as a sparse
    file of that size (a fresh disk per run); otherwise the file is used as it is.
    cache: QEMU's cache mode; the default "writeback" turns each guest flush into an
    fdatasync of the backing file, so flushes cost what they cost on the host.
    """

    path: str
    kind: str = "nvme"
    serial: str = "data"
    size: int | None = None
    cache: str = "writeback"
    readonly: bool = False

    @staticmethod
    def parse(spec):
        """'nvme:PATH[,size=2G][,serial=data][,cache=none][,ro]' (or virtio-blk:...)."""
        kind, _, rest = spec.partition(":")
        if kind not in ("nvme", "virtio-blk") or not rest:
            raise ValueError(f"bad disk {spec!r}: want nvme:PATH[,opt=..] or virtio-blk:PATH")
        path, *opts = rest.split(",")
        d = Disk(path=path, kind=kind)
        for o in opts:
            k, _, v = o.partition("=")
            if k == "size":
                d.size = parse_size(v)
            elif k in ("serial", "id"):
                d.serial = v
            elif k == "cache":
                d.cache = v
            elif k == "ro":
                d.readonly = True
            else:
                raise ValueError(f"bad disk option {o!r}")
        return d


@dataclasses.dataclass
class Net:
    """The guest's one network interface (eth0).

    mode "user": QEMU user-mode NAT; the host is 10.0.2.2 (its 127.0.0.1), the guest
    10.0.2.15; `hostfwd` entries like "tcp:127.0.0.1:25642-:564" reach guest ports.
    mode "listen"/"connect": a point-to-point link to another guest over a TCP socket on
    the host (QEMU -netdev stream); start the listening guest first.
    mode "dgram": the same link over UDP (QEMU -netdev dgram): each side sends its frames
    to the other's `peer_port` and receives on its own `port`; no start order. Unlike
    stream, it adds no latency of its own (QEMU's stream socket keeps Nagle's algorithm,
    which costs each small frame up to a delayed-ACK period on the host; docs/benchmarks.md).
    mode "tap": a tap device `ifname` that already exists (made with `vnet_hdr`, on a bridge:
    `tests/guest/taplink.py`), opened with the virtio-net header, so the device offers
    checksum offload and TSO/GSO as on a host with a bridge; no start order.
    """

    mode: str = "none"
    host: str = "127.0.0.1"
    port: int = 0
    hostfwd: list = dataclasses.field(default_factory=list)
    ip: str | None = None
    gw: str | None = None
    mac: str | None = None
    peer_port: int = 0
    # IP MTU of the guest's interface (None: the kernel's default, 1500).
    mtu: int | None = None
    # mode "tap": the tap device's name.
    ifname: str | None = None

    @staticmethod
    def user(*hostfwd, ip="10.0.2.15/24", gw="10.0.2.2"):
        return Net("user", hostfwd=list(hostfwd), ip=ip, gw=gw)

    @staticmethod
    def listen(port, ip, host="127.0.0.1"):
        return Net("listen", host=host, port=port, ip=ip)

    @staticmethod
    def connect(port, ip, host="127.0.0.1"):
        return Net("connect", host=host, port=port, ip=ip)

    @staticmethod
    def dgram(port, peer_port, ip, host="127.0.0.1"):
        return Net("dgram", host=host, port=port, peer_port=peer_port, ip=ip)

    @staticmethod
    def tap(ifname, ip):
        return Net("tap", ifname=ifname, ip=ip)

    @staticmethod
    def parse(spec):
        """'none' | 'user[:FWD[;FWD..]]' | 'listen:[HOST:]PORT' | 'connect:[HOST:]PORT' |
        'dgram:PORT:PEER_PORT'."""
        mode, _, rest = spec.partition(":")
        if mode == "none":
            return Net()
        if mode == "user":
            return Net.user(*[f for f in rest.split(";") if f])
        if mode == "dgram" and rest.count(":") == 1:
            port, peer = rest.split(":")
            return Net("dgram", port=int(port), peer_port=int(peer))
        if mode in ("listen", "connect") and rest:
            host, _, port = rest.rpartition(":")
            return Net(mode, host=host or "127.0.0.1", port=int(port))
        raise ValueError(f"bad net {spec!r}")

    def qemu_args(self, default_mac):
        if self.mode == "none":
            return []
        if self.mode == "user":
            nd = "user,id=n0" + "".join(f",hostfwd={f}" for f in self.hostfwd)
        elif self.mode == "tap":
            nd = f"tap,id=n0,ifname={self.ifname},script=no,downscript=no,vhost=off,vnet_hdr=on"
        elif self.mode == "dgram":
            nd = (
                f"dgram,id=n0,local.type=inet,local.host={self.host},local.port={self.port},"
                f"remote.type=inet,remote.host={self.host},remote.port={self.peer_port}"
            )
        else:
            server = "on" if self.mode == "listen" else "off"
            nd = (
                f"stream,id=n0,server={server},addr.type=inet,"
                f"addr.host={self.host},addr.port={self.port}"
            )
        mac = self.mac or default_mac
        return ["-netdev", nd, "-device", f"virtio-net-pci,netdev=n0,mac={mac},romfile="]


@dataclasses.dataclass
class Result:
    status: int  # the script's exit status
    log: str  # path of the console log
    results: str | None  # directory with what the script left in /results
    seconds: float  # wall time from QEMU start to power-off


class Guest:
    """One guest run: configure, then run() (or start() ... wait() for several at once)."""

    def __init__(
        self,
        script,
        args=(),
        *,
        image="client",
        mem="1G",
        cpus=2,
        disks=(),
        net=None,
        env=None,
        files=(),
        name="guest",
        log=None,
        results=None,
        timeout=600,
        tee=False,
        accel=None,
        qemu_extra=(),
    ):
        self.script, self.args = script, list(args)
        self.image, self.mem, self.cpus = image, mem, cpus
        self.disks, self.net = list(disks), net or Net()
        self.env, self.files = dict(env or {}), list(files)
        self.name, self.timeout, self.tee = name, timeout, tee
        self.accel = accel or os.environ.get("NF_GUEST_ACCEL", "tcg")
        self.qemu_extra = list(qemu_extra)
        self.tmp = tempfile.mkdtemp(prefix=f"nf-{name}-")
        self.log = log or os.path.join(self.tmp, "console.log")
        self.results = results
        self.token = secrets.token_hex(8)
        self.proc = None

    # --- assembling the VM -----------------------------------------------------------
    def _job_tar(self):
        """The job: /job/main (the script), /job/run.sh, /job/env, /job/lib/*, files."""
        path = os.path.join(self.tmp, "job.tar")
        env = {
            "NF_HOSTNAME": self.name,
            "NF_DISKS": " ".join(d.serial for d in self._all_disks()),
            **({"NF_IP": self.net.ip} if self.net.ip else {}),
            **({"NF_GW": self.net.gw} if self.net.gw else {}),
            **({"NF_MTU": self.net.mtu} if self.net.mtu else {}),
            **self.env,
        }
        for k in env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise GuestError(f"bad environment variable name {k!r}")
        env_text = "".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in env.items())
        run_text = "#!/bin/sh\nexec sh /job/main " + " ".join(map(shlex.quote, self.args)) + "\n"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:

            def add_bytes(name, data, mode=0o644):
                ti = tarfile.TarInfo(name)
                ti.size, ti.mode, ti.mtime = len(data), mode, int(time.time())
                tar.addfile(ti, io.BytesIO(data))

            add_bytes("env", env_text.encode())
            add_bytes("run.sh", run_text.encode(), 0o755)
            if self.script:
                tar.add(self.script, "main")
            tar.add(JOB_LIB, "lib")
            for src, dest in self.files:
                tar.add(src, dest)
        return path

    def _all_disks(self):
        disks = list(self.disks)
        if self.results:
            disks.append(
                Disk(
                    os.path.join(self.tmp, "results.img"),
                    "virtio-blk",
                    RESULTS_SERIAL,
                    RESULTS_DISK_SIZE,
                )
            )
        return disks

    def qemu_cmd(self, interactive=False):
        """The QEMU command line. interactive: console on stdio and a shell after the
        job's set-up instead of running it (the job is still unpacked in /job)."""
        out = out_dir()
        if not shutil.which("qemu-system-x86_64"):
            raise GuestError("qemu-system-x86_64 is missing: apt-get install -y qemu-system-x86")
        try:
            kernel = open(os.path.join(out, "kernel")).read().strip()
        except FileNotFoundError:
            raise GuestError(
                f"no guest in {out}: run `make guest` (tests/guest/build-guest)"
            ) from None
        initrd = os.path.join(out, f"{self.image}.cpio")
        if not os.path.exists(initrd):
            raise GuestError(f"no initramfs {initrd}")
        append = f"console=ttyS0 no_timer_check quiet panic=-1 nf.token={self.token}"
        serial = ["-chardev", f"file,id=con,path={self.log}", "-serial", "chardev:con"]
        if interactive:
            append += " nf.shell=1"
            serial = ["-serial", "mon:stdio"]
        cmd = [
            "qemu-system-x86_64",
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-accel", self.accel, "-cpu", "max" if self.accel == "tcg" else "host",
            "-M", "q35", "-m", str(self.mem), "-smp", str(self.cpus),
            "-kernel", os.path.join(out, kernel), "-initrd", initrd, "-append", append,
            *serial,
            "-fw_cfg", f"name=opt/ninefold/job.tar,file={self._job_tar()}",
        ]  # fmt: skip
        for i, d in enumerate(self._all_disks()):
            if d.size is not None:
                with open(d.path, "wb") as f:
                    f.truncate(d.size)
            elif not os.path.exists(d.path):
                raise GuestError(f"disk file {d.path} does not exist (give size= to create it)")
            ro = ",readonly=on" if d.readonly else ""
            cmd += ["-drive", f"file={d.path},if=none,id=d{i},format=raw,cache={d.cache}{ro}"]
            if d.kind == "nvme":
                cmd += ["-device", f"nvme,drive=d{i},serial={d.serial}"]
            else:
                cmd += ["-device", f"virtio-blk-pci,drive=d{i},serial={d.serial},disable-legacy=on"]
        mac = "52:54:00:%02x:%02x:%02x" % tuple(secrets.token_bytes(3))
        cmd += self.net.qemu_args(mac)
        return cmd + self.qemu_extra

    # --- running -----------------------------------------------------------------------
    def start(self):
        cmd = self.qemu_cmd()
        os.makedirs(os.path.dirname(os.path.abspath(self.log)), exist_ok=True)
        open(self.log, "w").close()
        with open(os.path.join(self.tmp, "qemu.cmd"), "w") as f:
            f.write(shlex.join(cmd) + "\n")
        # timeout(1) is a second line of defence should this process die unexpectedly.
        full = ["timeout", "-k", "5", str(int(self.timeout) + 10)] + cmd
        self.stderr_path = os.path.join(self.tmp, "qemu.stderr")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            full, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(self.stderr_path, "w"),
        )  # fmt: skip
        if self.tee:
            self._stop_tee = threading.Event()
            self._tee = threading.Thread(target=self._tee_log, daemon=True)
            self._tee.start()
        return self

    def _tee_log(self):
        """Echo the console log as it grows, prefixed with the guest's name."""
        with open(self.log, errors="replace") as f:
            buf = ""
            while True:
                chunk = f.read()
                if chunk:
                    buf += chunk
                    *lines, buf = buf.split("\n")
                    for line in lines:
                        # tee may be a pattern: echo only the matching lines (progress).
                        if self.tee is True or re.search(self.tee, line):
                            print(f"[{self.name}] {line.rstrip()}", flush=True)
                elif self._stop_tee.is_set():
                    return
                else:
                    time.sleep(0.2)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, lines=30):
        try:
            with open(self.log, errors="replace") as f:
                text = f.read().splitlines()[-lines:]
        except FileNotFoundError:
            text = []
        try:
            err = open(self.stderr_path).read().strip()
        except (AttributeError, FileNotFoundError):
            err = ""
        tail = "\n".join(f"  | {line}" for line in text)
        return tail + (f"\n  qemu stderr: {err}" if err else "")

    def wait(self):
        """Wait for power-off; return a Result or raise GuestError."""
        try:
            self.proc.wait(self.timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise GuestError(
                f"{self.name}: timed out after {self.timeout} s (console log {self.log}), "
                f"last lines:\n{self.log_tail()}",
                EXIT_TIMEOUT,
            ) from None
        finally:
            if self.tee:
                self._stop_tee.set()
                self._tee.join()
        seconds = time.monotonic() - self.t0
        with open(self.log, errors="replace") as f:
            found = [m for m in MARKER.finditer(f.read()) if m.group(1) == self.token]
        if not found:
            raise GuestError(
                f"{self.name}: QEMU exited ({self.proc.returncode}) without an exit marker "
                f"(console log {self.log}), last lines:\n{self.log_tail()}"
            )
        status = int(found[-1].group(2))
        if self.results:
            self._collect_results()
        return Result(status, self.log, self.results, seconds)

    def _collect_results(self):
        os.makedirs(self.results, exist_ok=True)
        img = os.path.join(self.tmp, "results.img")
        try:
            with tarfile.open(img, "r:") as tar:
                try:
                    tar.extractall(self.results, filter="data")
                except TypeError:  # Python < 3.11.4: no extraction filters
                    tar.extractall(self.results)
        except tarfile.ReadError as e:
            raise GuestError(f"{self.name}: results disk holds no tar ({e})") from e

    def run(self):
        self.start()
        try:
            return self.wait()
        finally:
            self.kill()

    def cleanup(self):
        """Remove the temporary directory (job tar, disks created there, default log)."""
        shutil.rmtree(self.tmp, ignore_errors=True)


def tcp_listening(port, host="127.0.0.1"):
    """Whether something on this machine listens on host:port (read from /proc, so the
    check opens no connection a one-shot listener like QEMU's stream netdev would take)."""
    want = f"{''.join(reversed([f'{int(x):02X}' for x in host.split('.')]))}:{port:04X}"
    with open("/proc/net/tcp") as f:
        return any(
            line.split()[1] == want and line.split()[3] == "0A" for line in f.readlines()[1:]
        )


def wait_listening(port, host="127.0.0.1", timeout=20, proc=None):
    deadline = time.monotonic() + timeout
    while not tcp_listening(port, host):
        if proc is not None and proc.poll() is not None:
            raise GuestError(f"process exited before listening on {host}:{port}")
        if time.monotonic() > deadline:
            raise GuestError(f"nothing listens on {host}:{port} after {timeout} s")
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit("guestvm.py is a library; use tests/guest/run-guest")
