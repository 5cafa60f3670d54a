#!/usr/bin/env python3
"""make bench-load: servers driven from the host by a native 9P load generator.

`make bench` goes through one emulated Linux client, which under TCG is slower than any
server. Here the client is target/release/ninep-load on the host (tests/src/bin/ninep-load.rs:
one thread per connection, Linux's request patterns), so the server is the bottleneck.
Each system gets the same machine: 128 MiB, an emulated NVMe disk of 4 GiB, QEMU user
networking with its 9P port forwarded to the host; the appliance runs once per vCPU count
of --smp, the Linux VMs with --server-cpus (default 1).

Systems:
  ninefold-smpN        the appliance (build/appliance.elf) with N vCPUs (QEMU -smp N,
                       multi-threaded TCG), disk formatted by `ninefold mkfs`; `--system
                       ninefold` is one such system per --smp count
  linux-vm-btrfs-diod  the Linux server guest of `make bench` (tests/guest/job/diod-server.sh):
  linux-vm-ext4-diod   btrfs / ext4 on the NVMe disk, exported by diod
  ceiling              `ninefold serve --model` on the host: an in-memory server with no VM,
                       what the load generator itself can drive

Workloads (ninep-load --help): write64k, write4k (write + fsync), create (walk + lcreate +
write 4 KiB + fsync + clunk), getattr (walk + getattr + clunk), read4k (4 KiB at random
offsets) and read1m (1 MiB sequentially) of one shared file of --file-mib MiB that the
set-up writes and fsyncs once and reads once untimed (warm: the server's cache holds what
it can of it), each at 1, 4, 16 and 64 connections. For every point: ops/s, MiB/s, p50/p99
latency, device flushes and bytes written per fsync (the server's disk counters before and
after: the appliance's `stat` lines, the Linux guest's /sys/block through its control
port), for the reads the device's bytes and requests read per operation over the measured
seconds (and the appliance's own data bytes read and data cache counters, where it has
them) and, over the measured seconds (after the connections' set-up): every appliance
vCPU's busy share (its counters document), the host's busy share over its cores
(/proc/stat) and the CPU seconds per second of the server's process (QEMU, or the
ceiling's) and of ninep-load.

Writes OUT/load.json, OUT/load.md and OUT/load-*.png (default OUT: build/bench).
Options: --quick (3 s per point, 1 and 16 connections), --smp, --system, --workload,
--conns, --seconds, --port (host port of the 9P forward, default 25760; the counters get
the next), --appliance IMAGE, --profile (sample the appliance at every point:
tests/bench/profile.py).
"""

import argparse
import datetime
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "guest"))
sys.path.insert(0, HERE)
import fs as bench_fs  # noqa: E402
import hostcpu  # noqa: E402
import results as guest_results  # noqa: E402
from appliance import STATS_PORT, Appliance  # noqa: E402
from guestvm import JOB_LIB, Disk, Guest, GuestError, Net, wait_listening  # noqa: E402

# The appliance's systems are APPLIANCE-smpN, one per vCPU count.
APPLIANCE = "ninefold"
BTRFS = "linux-vm-btrfs-diod"
PEERS = [BTRFS, "linux-vm-ext4-diod", "ceiling"]
SMP = [1, 2]
# Issue 25's four (its goals are about them), then issue 36's reads.
WRITE_WORKLOADS = ["write64k", "write4k", "create", "getattr"]
READ_WORKLOADS = ["read4k", "read1m"]
WORKLOADS = WRITE_WORKLOADS + READ_WORKLOADS
# How the report names them.
LABELS = {"write64k": "write64k + fsync", "write4k": "write4k + fsync", "create": "create + 4 KiB + fsync",
          "getattr": "getattr", "read4k": "read 4 KiB, random (warm)", "read1m": "read 1 MiB, sequential (warm)"}  # fmt: skip
CONNS = [1, 4, 16, 64]
# Host ports (the project's QEMU tests use others): 9P and the counters/control port.
NINEP_PORT, CTL_PORT_HOST = 25760, 25761
# QEMU's gdbstub for --profile (the port after the counters').
GDB_PORT = 25762
# The Linux guest's control port (ctl.sh).
GUEST_CTL_PORT = 7000
# The appliance's limits are per client address; every connection here comes from
# QEMU's 10.0.2.2, so they are raised to let 64 connections in.
APPLIANCE_APPEND = "max_conns=160 max_conns_per_client=160"
# ninep-load's line on stderr when the set-up is done and the measured seconds begin.
MEASURING = "ninep-load: measuring"
# A CPU (the host's cores together, or a vCPU) busy this much of the time had nothing left.
SATURATED = 0.9
# A vCPU thread that ran less than this share of what its vCPU counted busy waited on the host.
STALLED = 0.8
# Issue 25's goals: SMP=2 over SMP=1, every vCPU serving, and issue 12's ratio over btrfs.
SMP_GAIN, VCPU_BUSY, OVER_BTRFS = 1.5, 0.4, 5


def smp_of(system):
    """The vCPU count of an appliance system (`ninefold-smpN`), else None."""
    prefix = APPLIANCE + "-smp"
    n = system[len(prefix) :] if system.startswith(prefix) else ""
    return int(n) if n.isdigit() and int(n) > 0 else None


def appliance_system(cpus):
    """The name of the appliance's system with `cpus` vCPUs."""
    return f"{APPLIANCE}-smp{cpus}"


def system_arg(name):
    """--system: a peer, `ninefold` (every --smp count) or `ninefold-smpN`."""
    if name == APPLIANCE or name in PEERS or smp_of(name):
        return name
    raise argparse.ArgumentTypeError(f"{name!r}: one of {APPLIANCE}, {APPLIANCE}-smpN, {', '.join(PEERS)}")


def smp_arg(text):
    """--smp: vCPU counts, comma-separated, e.g. `1,2`."""
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: vCPU counts, comma-separated (e.g. 1,2)")
    return list(dict.fromkeys(counts))


def expand_systems(chosen, smp):
    """The systems to run, in order: `ninefold` becomes one appliance system per count."""
    out = []
    for name in chosen or [APPLIANCE, *PEERS]:
        for s in [appliance_system(n) for n in smp] if name == APPLIANCE else [name]:
            if s not in out:
                out.append(s)
    return out


def log(msg):
    print(f"bench-load: {msg}", flush=True)


def ctl(port, command, timeout=60):
    """One command to a control port (the appliance's counters service or a Linux server
    guest's ctl.sh): the answer, up to the server closing the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(command.encode() + b"\n")
        chunks = []
        while True:
            b = s.recv(65536)
            if not b:
                break
            chunks.append(b)
    return b"".join(chunks).decode(errors="replace")


def disk_counters(port):
    """{name: [17 /sys/block stat fields + FUA]} from a `stat` answer."""
    out = {}
    for line in ctl(port, "stat").splitlines():
        cols = line.split()
        if len(cols) >= 1 + 17:
            try:
                out[cols[0]] = [int(x) for x in cols[1:]]
            except ValueError:
                continue
    return out


class Server:
    """One system under load: start(), then 9P on 127.0.0.1:NINEP_PORT; counters() for its
    disk (None: no disk), vcpus() (the appliance's CPU time, else None) and `pid`, its
    process on the host (QEMU, or the ceiling's server); stop()."""

    def __init__(self, system, a, work):
        self.system, self.a, self.work = system, a, work
        self.app = self.guest = self.proc = None
        self.pid = None
        self.aname = ""
        # Every load run makes its own directories: runs are numbered.
        self.runs = 0

    def start(self):
        fwd = [f"tcp:127.0.0.1:{NINEP_PORT}-:564"]
        if smp_of(self.system):
            fwd.append(f"tcp:127.0.0.1:{CTL_PORT_HOST}-:{STATS_PORT}")
            self.app = Appliance(
                self.a.appliance, self.a.tool, os.path.join(self.work, "appliance.img"), self.a.disk_size,
                log=os.path.join(self.work, "appliance-console.log"), mem=self.a.server_mem,
                cpus=smp_of(self.system), net=Net.user(*fwd), append=APPLIANCE_APPEND, timeout=7200,
                # Named threads ("CPU 1/TCG"): the CPU table splits QEMU's time by thread.
                qemu_extra=["-name", f"{self.system},debug-threads=on"]
                + (["-gdb", f"tcp:127.0.0.1:{GDB_PORT}"] if self.a.profile else []),
            )  # fmt: skip
            self.app.start()
            self.app.wait_for_event("ready", timeout=120, serving=True)
            self.pid = hostcpu.child_of(self.app.proc.pid)  # QEMU, under timeout(1)
        elif self.system == "ceiling":
            self.proc = subprocess.Popen(
                [self.a.tool, "serve", "--model", "--listen", f"127.0.0.1:{NINEP_PORT}",
                 "--max-connections", "160", "--max-connections-per-client", "160"],
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.work, "ceiling.log"), "w"),
            )  # fmt: skip
            wait_listening(NINEP_PORT, proc=self.proc)
            self.pid = self.proc.pid
        else:
            fs = self.system.split("-")[2]  # linux-vm-FS-diod
            fwd.append(f"tcp:127.0.0.1:{CTL_PORT_HOST}-:{GUEST_CTL_PORT}")
            self.guest = Guest(
                os.path.join(JOB_LIB, "diod-server.sh"), [fs], image="server", name="server",
                mem=self.a.server_mem, cpus=self.a.server_cpus, timeout=7200,
                disks=[Disk(os.path.join(self.work, "server-data.img"), "nvme", "data", self.a.disk_size)],
                net=Net.user(*fwd), log=os.path.join(self.work, "server-console.log"),
            )  # fmt: skip
            self.guest.start()
            self.pid = hostcpu.child_of(self.guest.proc.pid)  # QEMU, under timeout(1)
            self.aname = "/srv"
            self._wait_for_diod()

    def _wait_for_diod(self, timeout=300):
        """QEMU's forward accepts before the guest listens: wait for a 9P answer."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.guest.proc.poll() is not None:
                raise GuestError(f"server guest exited; see {self.guest.log}")
            r = self.load("getattr", 1, 0.2, check=False)
            if r and not r.get("errors"):
                return
            time.sleep(1)
        raise GuestError(f"diod did not answer within {timeout} s; see {self.guest.log}")

    def counters(self):
        if self.system == "ceiling":
            return None
        return disk_counters(CTL_PORT_HOST)

    def vcpus(self):
        """The appliance's clock and every vCPU's idle time, from its counters document:
        {"uptime_ms", "idle_ms": [CPU 0's, CPU 1's, ...], "fs": its filesystem counters};
        else None."""
        if not self.app:
            return None
        doc = json.loads(ctl(CTL_PORT_HOST, "json"))
        cpus = sorted(doc.get("cpus") or [], key=lambda c: int(c["cpu"]))
        # An image from before the per-CPU counters reports its boot CPU only.
        idle = [c["idle_ms"] for c in cpus] or [doc["idle_ms"]]
        return {"uptime_ms": doc["uptime_ms"], "idle_ms": idle, "fs": doc.get("fs") or {}}

    def profiler(self, name, seconds):
        """With --profile, tests/bench/profile.py sampling the appliance while the point runs
        (its report in the system's directory, profile-NAME.txt and .folded)."""
        if not (self.a.profile and self.app):
            return None
        path = os.path.join(self.work, f"profile-{name}")
        cmd = [sys.executable, os.path.join(HERE, "profile.py"), "--port", str(GDB_PORT), "--elf", self.a.appliance,
               "--seconds", str(max(1.0, seconds - 1)), "--folded", path + ".folded"]  # fmt: skip
        return subprocess.Popen(cmd, stdout=open(path + ".txt", "w"), stderr=subprocess.STDOUT)

    def load(self, workload, conns, seconds, check=True, measuring=None):
        """One ninep-load run: its JSON line (None when it failed and not `check`).
        `measuring(pid)` is called when its set-up is done and the measured seconds begin."""
        cmd = [self.a.load, "--port", str(NINEP_PORT), "--workload", workload, "--conns", str(conns),
               "--seconds", str(seconds), "--aname", self.aname, "--tag", f"{self.runs}",
               "--idle", str(self.a.idle if check else 0), "--file-mib", str(self.a.file_mib)]  # fmt: skip
        self.runs += 1
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        watchdog = threading.Timer(seconds + 600, proc.kill)
        watchdog.start()
        try:
            # Its set-up writes nothing else to stderr unless it fails.
            err = []
            for line in proc.stderr:
                if line.startswith(MEASURING):
                    if measuring:
                        measuring(proc.pid)
                    break
                err.append(line)
            out, rest = proc.communicate()
        except BaseException:
            proc.kill()
            proc.communicate()
            raise
        finally:
            watchdog.cancel()
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            if check:
                raise GuestError(f"ninep-load failed ({proc.returncode}): {''.join(err + [rest]).strip()}") from None
            return None

    def stop(self):
        if self.app:
            self.app.stop()
            status, report = self.app.fsck()
            with open(os.path.join(self.work, "fsck.txt"), "w") as f:
                f.write(report)
            if status:
                raise GuestError(f"ninefold fsck found the appliance's image unclean (status {status})")
        if self.guest:
            try:
                ctl(CTL_PORT_HOST, "quit", timeout=10)
            except OSError:
                pass
            self.guest.kill()
            self.guest.cleanup()
        if self.proc:
            self.proc.terminate()
            self.proc.wait(30)


def vcpu_use(before, after, ops_per_s):
    """Every vCPU's busy share between two `Server.vcpus()` readings, CPU 0's part of the
    busy time, and the appliance's CPU time per operation."""
    window = after["uptime_ms"] - before["uptime_ms"]
    if window <= 0:
        return {}
    idle = zip(before["idle_ms"], after["idle_ms"], strict=True)
    busy = [min(1.0, max(0.0, 1 - (i1 - i0) / window)) for i0, i1 in idle]
    total = sum(busy)
    return {
        "vcpu_window_ms": window,
        "vcpu_busy": [round(b, 3) for b in busy],
        # Kept from the reports of one vCPU: the boot CPU's idle share.
        "idle_share": round(1 - busy[0], 3),
        "cpu0_part": round(busy[0] / total, 3) if total else None,
        "vcpu_us_per_op": round(total * 1e6 / ops_per_s, 1) if ops_per_s else None,
    }


def children_cpu_seconds():
    """CPU seconds of this process's children that have ended (ninep-load's, once reaped)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def point(server, workload, conns, seconds):
    """One measurement: the load generator's figures, the server's disk over the whole
    run, and the CPU figures over the measured seconds (from ninep-load's MEASURING line to
    its exit)."""
    before = server.counters()
    start = {}

    def measuring(load_pid):
        start["host"] = hostcpu.Sample([server.pid], threads=[server.pid])
        start["vcpus"] = server.vcpus()
        start["load_cpu_s"] = hostcpu.process_seconds(load_pid)
        if workload in READ_WORKLOADS:
            # Reads are judged over the measured seconds only: the set-up wrote the shared
            # file and read it once.
            start["disk"] = server.counters()

    prof = server.profiler(f"{workload}-x{conns}", seconds)
    children = children_cpu_seconds()
    r = server.load(workload, conns, seconds, measuring=measuring)
    host = hostcpu.Sample([server.pid], threads=[server.pid])
    load_cpu_s = children_cpu_seconds() - children
    vcpus = server.vcpus()
    if prof:
        prof.wait(60)
    after = server.counters()
    if "ops_per_s" not in r:
        raise GuestError(f"ninep-load: {r}")
    row = {k: r[k] for k in ("workload", "conns", "seconds", "ops", "ops_per_s", "fsyncs", "p50_us", "p99_us", "max_us")}
    row.update((k, r[k]) for k in ("bytes", "mib_per_s", "file_bytes", "warm_s") if r.get(k) is not None)
    row["errors"] = r["errors"]
    if workload in READ_WORKLOADS:
        row.update(read_figures(start.get("disk"), after, start.get("vcpus"), vcpus, r["ops"]))
    if before is not None and after is not None:
        devs = guest_results.device_deltas(before, after)
        d = devs.get("data") or next(iter(devs.values()), None)
        if d and r["fsyncs"]:
            row["flushes_per_fsync"] = round(d["flushes"] / r["fsyncs"], 3)
            row["kib_written_per_fsync"] = round(d["bytes_written"] / 1024 / r["fsyncs"], 1)
    if start.get("vcpus") and vcpus:
        row.update(vcpu_use(start["vcpus"], vcpus, r["ops_per_s"]))
    if "host" in start:
        use = hostcpu.cpu_use(start["host"], host)
        row.update(cpu_window_s=use["wall_s"], host_busy=use["host_busy"], host_core_busy=use["host_core_busy"],
                   server_cpu_per_s=use["cpu_per_s"].get(server.pid))  # fmt: skip
        threads = use["threads_per_s"].get(server.pid)
        if threads and threads["vcpus"]:  # only an appliance's QEMU names its vCPU threads
            row.update(qemu_main_cpu_per_s=threads["main"], qemu_vcpu_cpu_per_s=threads["vcpus"])
        if start["load_cpu_s"] is not None and use["wall_s"] > 0:
            row["load_cpu_per_s"] = round((load_cpu_s - start["load_cpu_s"]) / use["wall_s"], 3)
    return row


def read_figures(before, after, app_before, app_after, ops):
    """What the server did per read operation over the measured seconds: its device's
    KiB and requests read, and the appliance's own data bytes read and data cache counters
    (read defensively: an image without a data cache has none)."""
    out = {}
    if before is not None and after is not None and ops:
        devs = guest_results.device_deltas(before, after)
        if devs:
            out["dev_kib_read_per_op"] = round(sum(d["bytes_read"] for d in devs.values()) / 1024 / ops, 2)
            out["dev_reads_per_op"] = round(sum(d["read_ios"] for d in devs.values()) / ops, 3)
    if app_before and app_after and ops:
        fs = guest_results.json_deltas(app_before.get("fs") or {}, app_after.get("fs") or {})
        if fs.get("data_bytes_read") is not None:
            out["fs_kib_read_per_op"] = round(fs["data_bytes_read"] / 1024 / ops, 2)
        cache = fs.get("data_cache")
        if isinstance(cache, dict):
            out["data_cache"] = {k: v for k, v in cache.items() if isinstance(v, (int, float))}
            hits, misses = cache.get("hits"), cache.get("misses")
            if isinstance(hits, (int, float)) and isinstance(misses, (int, float)) and hits + misses:
                out["data_cache_hit_ratio"] = round(hits / (hits + misses), 3)
    return out


def pct(share):
    return "-" if share is None else f"{100 * share:.0f}%"


def host_figures(row):
    """The host's busy share (per core in brackets), e.g. `97% (95%, 99%)`."""
    cores = row.get("host_core_busy") or []
    return pct(row.get("host_busy")) + (f" ({', '.join(pct(c) for c in cores)})" if len(cores) > 1 else "")


def bound(row, system, host_cores):
    """What held a point back, read in its CPU figures: this host's cores, the appliance's
    CPU 0 alone, or every vCPU it has; None when nothing was saturated."""
    host, busy = row.get("host_busy"), row.get("vcpu_busy") or []
    if host is not None and host >= SATURATED:
        text = f"bound by this host's {host_cores} cores: busy {host_figures(row)}"
        server, load = row.get("server_cpu_per_s"), row.get("load_cpu_per_s")
        if server is not None and load is not None:
            rest = host * host_cores - server - load
            text += (f"; {system}'s QEMU {server:.2f} CPU-s/s, ninep-load {load:.2f}, everything else on the "
                     f"host {max(0.0, rest):.2f}")  # fmt: skip
        if busy:
            # A vCPU thread the host cannot run still counts as busy in the guest's clock.
            text += f"; the appliance's vCPUs busy {', '.join(pct(b) for b in busy)}"
        return text
    if busy and min(busy) >= SATURATED:
        if len(busy) == 1:
            return f"the appliance's vCPU was busy {pct(busy[0])} of the time"
        return f"every vCPU of the appliance was busy ({', '.join(pct(b) for b in busy)})"
    if busy and busy[0] >= SATURATED:
        return f"bound by the appliance's CPU 0: busy {pct(busy[0])}, the others {', '.join(pct(b) for b in busy[1:])}"
    ran = row.get("qemu_vcpu_cpu_per_s")
    if busy and ran and sum(ran) < STALLED * sum(busy):
        # The guest counts a vCPU busy while its thread waits on the host: for QEMU's big
        # lock (held by the main loop's network and device emulation) or for a core.
        return (f"the vCPU threads ran {', '.join(f'{t:.2f}' for t in ran)} CPU-s/s while the vCPUs counted "
                f"{', '.join(pct(b) for b in busy)} busy: they waited on the host, for QEMU's lock (its main loop "
                f"{row.get('qemu_main_cpu_per_s', 0):.2f} CPU-s/s) or a core (host busy {host_figures(row)})")
    return None


def ratio(a, b):
    """a / b in ops/s, None without both."""
    return a["ops_per_s"] / b["ops_per_s"] if a and b and b["ops_per_s"] else None


def fmt_ratio(r):
    return "-" if r is None else f"{r:.2f}"


def table(head, rows):
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def markdown(report):
    rows = report["results"]
    m = report["meta"]
    systems = [s for s in m["systems"] if any(r["system"] == s for r in rows)]
    apps = [s for s in systems if smp_of(s)]
    # The SMP ratios: every count over the smallest.
    base = min(apps, key=smp_of) if apps else None
    more = [s for s in apps if s != base]
    short = {s: f"smp{smp_of(s)}" for s in apps}
    val = {(r["workload"], r["conns"], r["system"]): r for r in rows}
    points = [(w, c) for w in m["workloads"] for c in m["conns"]]
    out = [
        "# ninefold load benchmark (make bench-load)", "",
        f"{m['date']} on {m['host']} ({m['cpus']} CPUs, load {m['load']}); {m['seconds_per_point']} s per point; "
        f"servers: {m['server']}; client: ninep-load on the host (one thread per connection"
        + (f", and {m['idle']} more attached and quiet at every point" if m.get("idle") else "") + ").", "",
        "## Throughput", "",
        "ops/s (p99 ms) per system; `smpN` is the appliance with N vCPUs; `x btrfs` = the appliance / "
        f"{BTRFS}, `x ceiling` = the appliance / ceiling.", "",
    ]  # fmt: skip
    head = ["workload", "conns", *systems, *[f"{short[s]} / {short[base]}" for s in more],
            *[f"{short[s]} x btrfs" for s in apps], *[f"{short[s]} x ceiling" for s in apps]]  # fmt: skip
    lines = []
    for w, c in points:
        cells = [LABELS[w], str(c)]
        for s in systems:
            r = val.get((w, c, s))
            cells.append(f"{r['ops_per_s']:.0f} ({r['p99_us'] / 1000:.1f})" if r else "-")
        cells += [fmt_ratio(ratio(val.get((w, c, s)), val.get((w, c, base)))) for s in more]
        for peer in (BTRFS, "ceiling"):
            cells += [fmt_ratio(ratio(val.get((w, c, s)), val.get((w, c, peer)))) for s in apps]
        lines.append(cells)
    out += table(head, lines)

    disks = [s for s in [*apps, BTRFS] if s in systems]
    lines = []
    for w, c in points:
        if not any((val.get((w, c, s)) or {}).get("flushes_per_fsync") is not None for s in disks):
            continue
        cells = [LABELS[w], str(c)]
        for s in disks:
            r = val.get((w, c, s)) or {}
            cells += [bench_fs.fmt(r.get("flushes_per_fsync"), 3), bench_fs.fmt(r.get("kib_written_per_fsync"), 1)]
        lines.append(cells)
    if lines:
        out += ["", "## The disk per fsync", "", "Device flushes and KiB written per fsync: the server disk's "
                "counters over the whole run.", ""]  # fmt: skip
        head = ["workload", "conns"]
        for s in disks:
            head += [f"{short.get(s, 'btrfs')} flush/fsync", f"{short.get(s, 'btrfs')} KiB/fsync"]
        out += table(head, lines)

    out += [
        "", "## CPU", "",
        "Over the measured seconds of each point (after the connections' set-up). vCPUs busy: each of "
        "the appliance's vCPUs' busy share (1 - idle / uptime from its counters document), CPU 0 first; "
        "CPU 0's part: CPU 0's share of the appliance's busy time; vCPU µs/op: the appliance's busy time "
        "(all vCPUs) per operation; host busy: this host's cores (/proc/stat: everything running on it, "
        "in brackets per core); server and ninep-load: CPU seconds per second (/proc/PID/stat, "
        "getrusage) of the server's process on the host (QEMU; the ceiling's server) and of the load "
        "generator; QEMU main loop; vCPU threads: the appliance's QEMU by thread, CPU-s/s (the main loop "
        "runs the user network and device emulation under QEMU's one lock, which a vCPU's device access "
        "and interrupt also take: a vCPU thread that ran less than its vCPU counted busy waited for "
        "that lock or for a core).", "",
    ]  # fmt: skip
    lines = []
    for w, c in points:
        for s in systems:
            r = val.get((w, c, s))
            if not r:
                continue
            busy = r.get("vcpu_busy")
            ran = r.get("qemu_vcpu_cpu_per_s")
            threads = f"{r['qemu_main_cpu_per_s']:.2f}; {', '.join(f'{t:.2f}' for t in ran)}" if ran else "-"
            lines.append([
                LABELS[w], str(c), s, f"{r['ops_per_s']:.0f}", ", ".join(pct(b) for b in busy) if busy else "-",
                pct(r.get("cpu0_part")) if busy and len(busy) > 1 else "-", bench_fs.fmt(r.get("vcpu_us_per_op"), 0),
                host_figures(r), bench_fs.fmt(r.get("server_cpu_per_s")), threads,
                bench_fs.fmt(r.get("load_cpu_per_s")),
            ])  # fmt: skip
    out += table(["workload", "conns", "system", "ops/s", "vCPUs busy", "CPU 0's part", "vCPU µs/op", "host busy",
                  "server CPU-s/s", "QEMU main loop; vCPU threads", "ninep-load CPU-s/s"], lines)  # fmt: skip

    reads = [(w, c) for w, c in points if w in READ_WORKLOADS]
    lines = []
    for w, c in reads:
        for s in systems:
            r = val.get((w, c, s))
            if r:
                lines.append([LABELS[w], str(c), s, f"{r['ops_per_s']:.0f}", bench_fs.fmt(r.get("mib_per_s")),
                              f"{r['p50_us'] / 1000:.2f}", f"{r['p99_us'] / 1000:.2f}",
                              bench_fs.fmt(r.get("dev_kib_read_per_op"), 1), bench_fs.fmt(r.get("dev_reads_per_op"), 3),
                              bench_fs.fmt(r.get("fs_kib_read_per_op"), 1),
                              bench_fs.fmt(r.get("data_cache_hit_ratio"))])  # fmt: skip
    if lines:
        mib = {r.get("file_bytes") for r in rows if r["workload"] in READ_WORKLOADS and r.get("file_bytes")}
        out += ["", "## Reads", "",
                "One shared file (" + ", ".join(f"{b >> 20} MiB" for b in sorted(mib)) + ") written and fsynced "
                "once by the set-up, then read once whole, untimed, so the measured reads show the server's "
                "cache. read4k: one 4 KiB `Tread` at a random offset per operation; read1m: 1 MiB read "
                "sequentially (in `Tread`s of msize - 24: diod's msize is 64 KiB). Per operation, over the "
                "measured seconds: the server's device KiB and requests read (the appliance's `stat` lines, the "
                "Linux guest's /sys/block), the appliance's filesystem data KiB read, and its data cache's hit "
                "ratio where it has one.", ""]  # fmt: skip
        out += table(["workload", "conns", "system", "ops/s", "MiB/s", "p50 ms", "p99 ms", "device KiB read / op",
                      "device reads / op", "fs data KiB / op", "data cache hits"], lines)  # fmt: skip

    out += ["", "## Goals (issue 25)", ""] + goals_issue25(val, apps, base, more, m["cpus"])
    out += ["", "## Goals (issue 12)", ""] + goals_issue12(val, apps, m["cpus"])
    if report["failed"]:
        out += ["", "## Failed", ""] + [f"- {f['system']} {f['workload']} x{f['conns']}: {f['error']}" for f in report["failed"]]
    return "\n".join(out) + "\n"


def over_btrfs_line(val, app, w, c, host_cores):
    """`>= 5x linux-vm-btrfs-diod` for one point of one appliance system: (line, met), or None."""
    a, b = val.get((w, c, app)), val.get((w, c, BTRFS))
    r = ratio(a, b)
    if r is None:
        return None
    met = r >= OVER_BTRFS
    line = f"- {LABELS[w]}, {c} connections: >= {OVER_BTRFS}x {BTRFS}: {app} {r:.2f}x — {'met' if met else 'NOT met'}"
    why = None if met else bound(a, app, host_cores)
    if why:
        line += f" ({why}; at {a['ops_per_s']:.0f} ops/s, {OVER_BTRFS}x would be {OVER_BTRFS * b['ops_per_s']:.0f})"
    return line, met


def goals_issue25(val, apps, base, more, host_cores):
    """Issue 25's done-when, checked against this run."""
    out = []
    for s in more:
        for w in ("getattr", "write4k"):
            for c in (16, 64):
                lo, hi = val.get((w, c, base)), val.get((w, c, s))
                r = ratio(hi, lo)
                if r is None:
                    continue
                met = r >= SMP_GAIN
                line = (f"- {LABELS[w]}, {c} connections: SMP={smp_of(s)} >= {SMP_GAIN}x SMP={smp_of(base)}: "
                        f"{r:.2f}x ({hi['ops_per_s']:.0f} against {lo['ops_per_s']:.0f} ops/s) — "
                        f"{'met' if met else 'NOT met'}")  # fmt: skip
                why = None if met else bound(hi, s, host_cores)
                out.append(line + (f" ({why})" if why else ""))
    for s in more:
        for w in ("getattr", "write4k"):
            r = val.get((w, 16, s))
            if not r or not r.get("vcpu_busy"):
                continue
            busy = r["vcpu_busy"]
            met = min(busy) >= VCPU_BUSY
            line = (f"- {LABELS[w]}, 16 connections: every vCPU of {s} >= {pct(VCPU_BUSY)} busy: "
                    f"{', '.join(pct(b) for b in busy)} — {'met' if met else 'NOT met'}")  # fmt: skip
            if not met and (r.get("host_busy") or 0) >= SATURATED:
                line += f" ({bound(r, s, host_cores)})"
            out.append(line)
    # The 5x goal for the SMP setting that meets it at the most points.
    scored = []
    for s in apps:
        checks = [over_btrfs_line(val, s, w, c, host_cores) for w in WRITE_WORKLOADS for c in (16, 64)]
        checks = [x for x in checks if x]
        if checks:
            scored.append((sum(met for _, met in checks), smp_of(s), s, checks))
    if scored:
        scored.sort(reverse=True)
        met, _, best, checks = scored[0]
        others = "".join(f"; {s}: {m} of {len(ch)}" for m, _, s, ch in scored[1:])
        out.append(f"- >= {OVER_BTRFS}x {BTRFS} at 16 and 64 connections, the best SMP setting: {best} "
                   f"({met} of {len(checks)} points met{others})")  # fmt: skip
        out += ["  " + line for line, _ in checks]
    return out or ["- none checked: they need the appliance at two SMP counts or linux-vm-btrfs-diod, at 16 or 64 "
                   "connections"]  # fmt: skip


def goals_issue12(val, apps, host_cores):
    """Issue 12's: write + fsync at >= 5x linux-vm-btrfs-diod at 16 and 64 connections."""
    out = []
    for s in apps:
        for c in (16, 64):
            for w in ("write64k", "write4k"):
                check = over_btrfs_line(val, s, w, c, host_cores)
                if check:
                    out.append(check[0])
    return out or [f"- none checked: they need the appliance and {BTRFS} at 16 or 64 connections"]


def main():
    global NINEP_PORT, CTL_PORT_HOST, GDB_PORT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--smp", type=smp_arg, default=SMP, metavar="N,N...",
                    help="the appliance's vCPU counts, one system each (default 1,2)")
    ap.add_argument("--system", action="append", type=system_arg,
                    help=f"{APPLIANCE} (one per --smp count), {APPLIANCE}-smpN, {', '.join(PEERS)}; default: all")
    ap.add_argument("--workload", action="append", choices=WORKLOADS, help="default: all")
    ap.add_argument("--conns", action="append", type=int, help="default: 1 4 16 64")
    ap.add_argument("--seconds", type=float, help="per point (default 10; --quick 3)")
    ap.add_argument("--quick", action="store_true", help="3 s per point, 1 and 16 connections")
    ap.add_argument("--out", help="report directory (default build/bench)")
    ap.add_argument("--server-mem", default="128M")
    ap.add_argument("--server-cpus", type=int, default=1, help="the Linux VMs' vCPUs (default 1)")
    ap.add_argument("--disk-size", type=int, default=4 << 30)
    ap.add_argument("--file-mib", type=int, default=12,
                    help="MiB of the read workloads' shared file (default 12: every 128 MiB server's cache holds it)")
    ap.add_argument("--port", type=int, default=NINEP_PORT,
                    help=f"host port of the 9P forward; the counters' is the next one (default {NINEP_PORT})")
    ap.add_argument("--appliance", help="the image to run (default build/appliance.elf)")
    ap.add_argument("--idle", type=int, default=0,
                    help="also keep this many connections attached and quiet at every point (mounted guests "
                    "with nothing to do; default 0)")
    ap.add_argument("--profile", action="store_true",
                    help="sample the appliance with tests/bench/profile.py at every point (an image with frame "
                    "pointers: make image-profile, then --appliance build/appliance-profile.elf)")
    a = ap.parse_args()
    NINEP_PORT, CTL_PORT_HOST, GDB_PORT = a.port, a.port + 1, a.port + 2
    build = os.path.join(REPO, "build")
    a.appliance = a.appliance or os.path.join(build, "appliance.elf")
    a.tool = os.path.join(REPO, "target", "release", "ninefold")
    a.load = os.path.join(REPO, "target", "release", "ninep-load")
    for path in (a.appliance, a.tool, a.load):
        if not os.path.exists(path):
            sys.exit(f"bench-load: {path} missing (make bench-load builds it)")
    systems = expand_systems(a.system, a.smp)
    workloads = a.workload or WORKLOADS
    conns = a.conns or ([1, 16] if a.quick else CONNS)
    seconds = a.seconds or (3 if a.quick else 10)
    out = a.out or os.path.join(build, "bench")
    work = os.path.join(out, "load-runs", datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(work)
    meta = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "host": os.uname().nodename,
        "cpus": os.cpu_count(), "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "seconds_per_point": seconds, "idle": a.idle, "file_mib": a.file_mib, "systems": systems,
        "workloads": workloads, "conns": conns,
        "smp": [smp_of(s) for s in systems if smp_of(s)], "server_cpus": a.server_cpus,
        "server": f"{a.server_mem}, NVMe {a.disk_size >> 30} GiB, QEMU user net (TCG); the appliance with the vCPUs "
                  f"of its name (multi-threaded TCG), the Linux VMs with {a.server_cpus}",
    }  # fmt: skip
    results, failed = [], []
    for system in systems:
        sdir = os.path.join(work, system)
        os.makedirs(sdir)
        server = Server(system, a, sdir)
        log(f"{system}: starting")
        try:
            server.start()
            for w in workloads:
                for c in conns:
                    try:
                        row = point(server, w, c, seconds)
                    except GuestError as e:
                        # A server that fell over at one point (a Linux VM's diod killed
                        # for memory at 64 connections, say) is started afresh for the rest.
                        log(f"{system} {w} x{c}: failed: {e}; restarting {system}")
                        failed.append({"system": system, "workload": w, "conns": c, "error": str(e)})
                        try:
                            server.stop()
                        except GuestError as stop_error:
                            failed.append({"system": system, "workload": "stop", "conns": 0, "error": str(stop_error)})
                        sdir = f"{sdir}-again"
                        os.makedirs(sdir)
                        server = Server(system, a, sdir)
                        server.start()
                        continue
                    row["system"] = system
                    results.append(row)
                    log(f"{system} {w} x{c}: {row['ops_per_s']:.0f} ops/s, p99 {row['p99_us'] / 1000:.1f} ms"
                        + (f", {row['flushes_per_fsync']} flush/fsync" if "flushes_per_fsync" in row else "")
                        + (f", vCPUs busy {' '.join(pct(b) for b in row['vcpu_busy'])}" if "vcpu_busy" in row else "")
                        + f", host busy {host_figures(row)}")  # fmt: skip
                    if row["errors"]:
                        failed.append({"system": system, "workload": w, "conns": c, "error": row["errors"][0]})
        except (GuestError, OSError, subprocess.SubprocessError) as e:
            log(f"{system}: {e}")
            failed.append({"system": system, "workload": "-", "conns": 0, "error": str(e)})
        finally:
            try:
                server.stop()
            except GuestError as e:
                failed.append({"system": system, "workload": "stop", "conns": 0, "error": str(e)})
    report = {"kind": "load", "meta": meta, "results": results, "failed": failed}
    rp = os.path.join(out, "load.json")
    with open(rp, "w") as f:
        json.dump(report, f, indent=1)
    text = markdown(report)
    with open(os.path.join(out, "load.md"), "w") as f:
        f.write(text)
    bench_fs.charts(rp, out)
    print(text)
    log(f"report: {rp}, {os.path.join(out, 'load.md')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
