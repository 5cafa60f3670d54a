"""The host's own CPU use over a measurement, from Linux's /proc.

Under TCG every vCPU of a VM is a host thread, so a VM with N vCPUs can only be as fast
as N of the host's cores are free. What the host's cores did during a point says whether
the figure is the server's or the host's:

    before = Sample([qemu_pid, load_pid])
    ...                                   # the measurement
    after = Sample([qemu_pid])            # a process that has exited is left out
    use = cpu_use(before, after)          # {"host_busy": 0.97, "host_core_busy": [...],
                                          #  "cpu_per_s": {qemu_pid: 1.62}, "wall_s": 10.0}

`Sample(pids, threads=[qemu_pid])` also splits a QEMU process by thread
(`threads_per_s`: its main loop, each vCPU, the rest). QEMU names its threads only with
`-name NAME,debug-threads=on` ("CPU 1/TCG"); the main loop is the thread whose id is the
process's. Under TCG the main loop runs the user-mode network (slirp) and every device's
emulation under QEMU's one big lock, which a vCPU's device access and interrupt also take:
a vCPU thread that ran much less than its vCPU counted busy was waiting for that lock or
for a core.
"""

import os
import re
import time

# /proc/PID/stat counts CPU time in clock ticks.
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid):
    """/proc/PID/stat after the command name (which may hold spaces and parentheses):
    [state, ppid, ...], field 3 of proc(5) first."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def process_seconds(pid):
    """CPU seconds (user + system, every thread) `pid` has used; None once it is gone."""
    try:
        fields = _stat_fields(pid)
    except OSError:
        return None
    # utime and stime: fields 14 and 15 of proc(5).
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_seconds(pid):
    """CPU seconds of a process's threads by role: {"main": s, "vcpus": {index: s},
    "other": s}; None once the process is gone."""
    out = {"main": 0.0, "vcpus": {}, "other": 0.0}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                raw = f.read()
        except OSError:
            continue  # the thread ended between the listing and the read
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw.rsplit(")", 1)[1].split()
        seconds = (int(fields[11]) + int(fields[12])) / CLK_TCK
        vcpu = re.fullmatch(r"CPU (\d+)/\w+", comm)
        if int(tid) == pid:
            out["main"] += seconds
        elif vcpu:
            out["vcpus"][int(vcpu.group(1))] = seconds
        else:
            out["other"] += seconds
    return out


def child_of(pid):
    """The first process whose parent is `pid` (QEMU under timeout(1)), else None."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if int(_stat_fields(int(entry))[1]) == pid:
                return int(entry)
        except (OSError, IndexError, ValueError):
            continue
    return None


def _cores():
    """{"cpu": (busy, total), "cpu0": ..., ...} in clock ticks from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu"):
                break
            name, *ticks = line.split()
            # user nice system idle iowait irq softirq steal (guest time is inside user).
            ticks = [int(t) for t in ticks[:8]]
            total = sum(ticks)
            out[name] = (total - ticks[3] - ticks[4], total)
    return out


class Sample:
    """The host's cores and the CPU time of some processes, at one moment."""

    def __init__(self, pids=(), threads=()):
        self.at = time.monotonic()
        self.cores = _cores()
        self.processes = {pid: process_seconds(pid) for pid in pids if pid}
        self.threads = {pid: thread_seconds(pid) for pid in threads if pid}


def _busy(before, after):
    busy, total = after[0] - before[0], after[1] - before[1]
    return round(busy / total, 3) if total > 0 else None


def cpu_use(before, after):
    """What the host's cores and the sampled processes did between two samples: the
    busy share over all cores and per core, and each process's CPU seconds per wall
    second (processes present in both samples), and the same by thread role for the
    processes sampled by thread (`threads_per_s`: {pid: {"main", "vcpus": [...], "other"}},
    vCPUs in index order)."""
    wall = after.at - before.at
    per_core = sorted((n for n in after.cores if n != "cpu" and n in before.cores), key=lambda n: int(n[3:]))
    cpu_per_s = {}
    for pid, t0 in before.processes.items():
        t1 = after.processes.get(pid)
        if t0 is not None and t1 is not None and wall > 0:
            cpu_per_s[pid] = round((t1 - t0) / wall, 3)
    threads_per_s = {}
    for pid, t0 in before.threads.items():
        t1 = after.threads.get(pid)
        if t0 is None or t1 is None or wall <= 0:
            continue
        threads_per_s[pid] = {
            "main": round((t1["main"] - t0["main"]) / wall, 3),
            "vcpus": [round((t1["vcpus"][i] - t0["vcpus"].get(i, 0.0)) / wall, 3) for i in sorted(t1["vcpus"])],
            "other": round((t1["other"] - t0["other"]) / wall, 3),
        }
    return {
        "wall_s": round(wall, 3),
        "threads_per_s": threads_per_s,
        "host_busy": _busy(before.cores["cpu"], after.cores["cpu"]),
        "host_core_busy": [_busy(before.cores[n], after.cores[n]) for n in per_core],
        "cpu_per_s": cpu_per_s,
    }
