#!/usr/bin/env python3
"""make bench: the appliance against its peers, with one client, in one run.

Runs tests/guest/peers with the systems below (the appliance is the `ninefold` peer:
same machine, memory, vCPUs, kind of disk and link as the Linux server guest) and the
workloads of tests/guest/job/bench.sh, then writes

  OUT/report.json   {"results": [{workload, jobs, system, value, unit}],
                     "ratios":  [{workload, jobs, peer, ratio}],   # ninefold / peer
                     "devices": [{workload, jobs, system, fsyncs, ..._per_fsync}],
                     "reads":   [{workload, jobs, system, reads, clat_mean_ms, clat_p99_ms,
                                  dev_kib_read_per_read, ...}], ...}
  OUT/report.md     the same as Markdown tables, with the goals checked
  OUT/*.png         charts (matplotlib, installed into a venv under build/ on first use)

Ratios are appliance / peer with higher meaning better for the appliance (every figure
here is higher-is-better). Under TCG on shared cores throughput drifts +-30% between
runs: compare only within one run (docs/benchmarks.md).

Reads (issue 36): fio sequential 1 MiB and random 4 KiB reads over a warm set (the
server's cache holds it) and a cold one (twice the server's memory), and a random
read/write mix with fsync=1; tests/guest/job/bench.sh says how each is prepared.
--baseline REPORT.json compares the appliance's write figures with an earlier report's.

Quicker runs: --quick (5 s per workload: fio-write j1/j16, fs_mark, warm random reads
at 1 and 16 jobs), --reads (the read workloads only), --writes (the write workloads
only), or choose --system/--workload/--runtime. --report-only RUN rebuilds the report of
an earlier run.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "guest"))
import results as guest_results  # noqa: E402

APPLIANCE = "ninefold"
# The appliance over a mirrored volume of two devices of the same kind (issue 27's cost).
MIRROR = "ninefold-mirror"
PEERS = [
    "linux-vm-btrfs-diod", "linux-vm-ext4-diod", "linux-vm-btrfs-nfs", "linux-vm-ext4-nfs",
    "client-local-btrfs", "client-local-ext4", "ceiling", "ninefold-mirror",
]  # fmt: skip
SYSTEMS = [APPLIANCE, *PEERS]
# The guest-to-guest link of a run, as the report names it (older reports: dgram).
LINKS = {
    "tap": "taps on a bridge, offloads offered",
    "dgram": "QEMU dgram: UDP on 127.0.0.1",
    "stream": "QEMU stream: TCP on 127.0.0.1",
}
WRITE_WORKLOADS = [
    "fio-write-j1", "fio-write-j4", "fio-write-j16", "fio-randwrite-j1", "fio-randwrite-j16",
    "dbench-4", "bonnie", "fsmark",
]  # fmt: skip
# Issue 36: reads. Warm ones first (the warm set is laid out and read before each), then
# cold (the cold set laid out once, the client's caches dropped before each), then the mix.
READ_WORKLOADS = [
    "fio-read-j1-warm", "fio-read-j4-warm", "fio-randread-j1-warm", "fio-randread-j16-warm",
    "fio-read-j1-cold", "fio-read-j4-cold", "fio-randread-j1-cold", "fio-randread-j16-cold",
    "fio-randrw-j1", "fio-randrw-j16",
]  # fmt: skip
WORKLOADS = WRITE_WORKLOADS + READ_WORKLOADS
QUICK_WORKLOADS = ["fio-write-j1", "fio-write-j16", "fsmark", "fio-randread-j1-warm", "fio-randread-j16-warm"]
# The report's names of the read workloads (result rows), and what each measures.
READ_RESULTS = {
    "fio-read-1m-warm": "fio rw=read bs=1m, warm set", "fio-read-1m-cold": "fio rw=read bs=1m, cold set",
    "fio-randread-4k-warm": "fio rw=randread bs=4k, warm set", "fio-randread-4k-cold": "fio rw=randread bs=4k, cold set",
    "fio-randrw-4k-fsync": "fio rw=randrw rwmixread=70 bs=4k fsync=1 (reads + writes)",
}  # fmt: skip
# Issue 36's goals: the appliance over btrfs + diod on warm 4 KiB random reads, and over
# every Linux VM peer on every other read workload; writes no worse than a baseline.
WARM_RANDREAD, WARM_RANDREAD_GOAL, READ_GOAL, WRITE_SLACK = "fio-randread-4k-warm", 2.0, 1.0, 0.05
# bonnie++ figures reported, with their unit conversion.
BONNIE = [
    ("bonnie-write", "put_block_kib_s", 1 / 1024, "MiB/s"),
    ("bonnie-rewrite", "rewrite_kib_s", 1 / 1024, "MiB/s"),
    ("bonnie-read", "get_block_kib_s", 1 / 1024, "MiB/s"),
    ("bonnie-create", "seq_create_s", 1, "files/s"),
    ("bonnie-delete", "seq_delete_s", 1, "files/s"),
]


def log(msg):
    print(f"bench: {msg}", flush=True)


def result_rows(rec):
    """(workload, jobs, value, unit) for one parsed workload record."""
    name, m = rec["name"], rec["metrics"]
    if rec["status"] or "error" in rec:
        return []
    if name.startswith("fio-write-j"):
        return [("fio-write-64k-fsync", int(name[11:]), m.get("write_mib_s"), "MiB/s")]
    if name.startswith("fio-randwrite-j"):
        return [("fio-randwrite-4k-fsync", int(name[15:]), m.get("write_iops"), "IOPS")]
    read = re.fullmatch(r"fio-(read|randread)-j(\d+)-(warm|cold)", name)
    if read:
        kind, jobs, temp = read.group(1), int(read.group(2)), read.group(3)
        if kind == "read":
            return [(f"fio-read-1m-{temp}", jobs, m.get("read_mib_s"), "MiB/s")]
        return [(f"fio-randread-4k-{temp}", jobs, m.get("read_iops"), "IOPS")]
    if name.startswith("fio-randrw-j"):
        iops = None if m.get("read_iops") is None else m["read_iops"] + m.get("write_iops", 0)
        return [("fio-randrw-4k-fsync", int(name[12:]), iops, "IOPS")]
    if name.startswith("dbench-"):
        return [("dbench", int(name[7:]), m.get("mb_s"), "MB/s")]
    if name == "bonnie":
        return [(w, 1, None if m.get(k) is None else m[k] * f, u) for w, k, f, u in BONNIE]
    if name == "fsmark":
        return [("fsmark-4k-fsync", 1, m.get("files_s"), "files/s")]
    return []


def device_row(rec, system):
    """Device counters per fsync of one workload on one system (the server's disk for
    9P systems, the client's own disk for client-local ones)."""
    m = rec["metrics"]
    fsyncs = m.get("fsyncs")
    devs = rec.get("devices", {})
    side = "local" if system.startswith("client-local") else "remote"
    dev = next((d for d in devs if d.startswith(side + " ")), None)
    row = {"fsyncs": fsyncs, "fsync_ms": None}
    if "fsync_lat_mean_us" in m:
        row["fsync_ms"] = round(m["fsync_lat_mean_us"] / 1000, 2)
    if dev is None or not fsyncs:
        return row
    d = devs[dev]
    row.update(
        bytes_written=d["bytes_written"],
        flushes=d["flushes"],
        fua_writes=d.get("fua_writes"),
        kib_written_per_fsync=round(d["bytes_written"] / 1024 / fsyncs, 1),
        flushes_per_fsync=round(d["flushes"] / fsyncs, 3),
        fua_writes_per_fsync=None if d.get("fua_writes") is None else round(d["fua_writes"] / fsyncs, 3),
    )  # fmt: skip
    nfsd = rec.get("nfsd")
    if nfsd:
        row.update(
            nfs_writes_per_fsync=round(nfsd.get("writes", 0) / fsyncs, 3),
            nfs_commits_per_fsync=round(nfsd.get("commits", 0) / fsyncs, 3),
            nfs_compounds_per_fsync=round(nfsd.get("compounds", 0) / fsyncs, 3),
        )
    app = rec.get("appliance")
    if app:
        fs = app.get("fs") or {}
        cps = sum((fs.get("checkpoints") or {}).values())
        nodes = sum(v.get("writes", 0) for v in (fs.get("node_writes") or {}).values())
        counters = ((app.get("devices") or [{}])[0] or {}).get("counters") or {}
        if counters.get("flushes"):
            row["flush_ms"] = round(counters.get("flush_ns", 0) / counters["flushes"] / 1e6, 2)
        row.update(
            server_fsyncs=(app.get("9p") or {}).get("fsyncs"),
            checkpoints_per_fsync=round(cps / fsyncs, 3),
            node_writes_per_fsync=round(nodes / fsyncs, 3),
            log_commits_per_fsync=round((fs.get("log") or {}).get("commits", 0) / fsyncs, 3),
            checkpoints=fs.get("checkpoints"),
        )
    return row


def is_read(name):
    """A read workload of bench.sh (fio-read-*, fio-randread-*, fio-randrw-*)."""
    return name.startswith(("fio-read-", "fio-randread-", "fio-randrw-"))


def per(value, ops, scale=1, digits=3):
    return None if value is None or not ops else round(value / scale / ops, digits)


def read_row(rec, system):
    """The read side of one read workload: fio's figures, and what the server did per
    read: its device (bytes and requests read: the server's disk for 9P and NFS systems,
    the client's own for client-local ones), knfsd's READs, the appliance's own counters
    (data bytes read by the filesystem, btree nodes loaded, 9P Treads and the time it spent
    in them, and a data cache's counters when the image has one)."""
    m = rec["metrics"]
    reads = m.get("reads")
    row = {
        "reads": reads, "read_mib_s": m.get("read_mib_s"), "read_iops": m.get("read_iops"),
        "clat_mean_ms": per(m.get("read_clat_mean_us"), 1, 1000), "clat_p99_ms": per(m.get("read_clat_p99_us"), 1, 1000),
        "direct": m.get("direct"), "set_mib": m.get("set_mib"),
    }  # fmt: skip
    if m.get("writes"):
        row.update(writes=m["writes"], write_iops=m.get("write_iops"), fsyncs=m.get("fsyncs"),
                   write_clat_mean_ms=per(m.get("write_clat_mean_us"), 1, 1000),
                   fsync_ms=per(m.get("fsync_lat_mean_us"), 1, 1000))  # fmt: skip
    side = "local" if system.startswith("client-local") else "remote"
    devs = [d for k, d in (rec.get("devices") or {}).items() if k.startswith(side + " ")]
    if devs and reads:
        # Every device of the side: a mirror's reads may go to either leg.
        row["dev_kib_read_per_read"] = per(sum(d["bytes_read"] for d in devs), reads, 1024, 2)
        row["dev_bytes_read"] = sum(d["bytes_read"] for d in devs)
    if rec.get("client_net"):
        # Replies lost between the server and the client show as segments the client
        # queued out of order and duplicates it reported (DSACK) while retransmissions came.
        row["client_net"] = rec["client_net"]
    nfsd = rec.get("nfsd")
    if nfsd and reads:
        row["nfs_reads_per_read"] = per(nfsd.get("reads"), reads)
        row["nfs_kib_per_nfs_read"] = per(nfsd.get("read_bytes"), nfsd.get("reads"), 1024, 1)
        if m.get("writes"):
            row["nfs_writes_per_write"] = per(nfsd.get("writes"), m["writes"])
            row["nfs_commits_per_fsync"] = per(nfsd.get("commits"), m.get("fsyncs"))
    app = rec.get("appliance")
    if app and reads:
        fs = app.get("fs") or {}
        ninep = app.get("9p") or {}
        treads = (ninep.get("requests_by_type") or {}).get("Tread")
        row.update(
            data_kib_read_per_read=per(fs.get("data_bytes_read"), reads, 1024, 2),
            node_loads_per_read=per(fs.get("node_loads"), reads),
            treads_per_read=per(treads, reads),
            tread_ms=per(ninep.get("read_ns"), treads, 1e6, 3),
        )  # fmt: skip
        # A data cache (issue 36) reports under fs.data_cache; read whatever it has.
        cache = fs.get("data_cache")
        if isinstance(cache, dict):
            row["data_cache"] = {k: v for k, v in cache.items() if isinstance(v, (int, float))}
            hits, misses = cache.get("hits"), cache.get("misses")
            if isinstance(hits, (int, float)) and isinstance(misses, (int, float)) and hits + misses:
                row["data_cache_hit_ratio"] = round(hits / (hits + misses), 3)
    return row


def server_memory(run_dir, system):
    """What a Linux server guest had left at the end (MemAvailable, KiB, from its console's
    quit line), or None."""
    path = os.path.join(run_dir, system, "server-console.log")
    try:
        with open(path, errors="replace") as f:
            found = re.findall(r"memory: (\d+) KiB available", f.read())
    except OSError:
        return None
    return int(found[-1]) if found else None


def build_report(run_dir, systems, meta):
    recs = {}
    for s in systems:
        d = os.path.join(run_dir, s)
        if os.path.isdir(d):
            recs[s] = guest_results.parse_dir(d)
    results, devices, reads, failed = [], [], [], []
    for s, rs in recs.items():
        for r in rs:
            if r["status"] or "error" in r:
                failed.append({"system": s, "workload": r["name"], "error": r.get("error", f"status {r['status']}")})
            for w, j, v, u in result_rows(r):
                if v is not None:
                    results.append({"workload": w, "jobs": j, "system": s, "value": round(v, 3), "unit": u})
            wl = result_rows(r)[0] if result_rows(r) else (r["name"], 1, None, "")
            if r["name"].startswith(("fio-", "dbench", "fsmark")) and not r["status"] and (
                not is_read(r["name"]) or r["metrics"].get("fsyncs")
            ):
                devices.append({"workload": wl[0], "jobs": wl[1], "system": s, **device_row(r, s)})
            if is_read(r["name"]) and not r["status"] and "error" not in r:
                reads.append({"workload": wl[0], "jobs": wl[1], "system": s, **read_row(r, s)})
    ratios = []
    app = {(r["workload"], r["jobs"]): r["value"] for r in results if r["system"] == APPLIANCE}
    for r in results:
        if r["system"] == APPLIANCE or (r["workload"], r["jobs"]) not in app or not r["value"]:
            continue
        ratios.append({
            "workload": r["workload"], "jobs": r["jobs"], "peer": r["system"],
            "ratio": round(app[(r["workload"], r["jobs"])] / r["value"], 3),
        })  # fmt: skip
    memory = {s: kib for s in recs for kib in [server_memory(run_dir, s)] if kib is not None}
    return {"meta": meta, "results": results, "ratios": ratios, "devices": devices, "reads": reads,
            "server_mem_available_kib": memory, "failed": failed}  # fmt: skip


def fmt(v, digits=2):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


VM_PEERS = ["linux-vm-btrfs-diod", "linux-vm-ext4-diod", "linux-vm-btrfs-nfs", "linux-vm-ext4-nfs"]
GOAL_WORKLOAD = "fio-write-64k-fsync"


def goals(report):
    """The done-when goals of issue 12, checked against this run: (text, met or None).

    A ratio over a peer above the ceiling's own ratio over that peer is impossible with
    this client; where a goal asks for more than that, the text says so."""
    ratio = {(r["workload"], r["jobs"], r["peer"]): r["ratio"] for r in report["ratios"]}
    dev = {(d["workload"], d["jobs"], d["system"]): d for d in report["devices"]}
    out = []
    for j in (1, 4, 16):
        r = ratio.get((GOAL_WORKLOAD, j, "ceiling"))
        if r is not None:
            text = f"fio write 64k fsync=1, {j} job(s): >= 0.9x ceiling: {r:.2f}x"
            d = dev.get((GOAL_WORKLOAD, j, APPLIANCE)) or {}
            if r < 0.9 and d.get("fsync_ms") and d.get("flush_ms"):
                text += (f" (the appliance's fsync takes {d['fsync_ms']:.2f} ms, of which its device "
                         f"FLUSH {d['flush_ms']:.2f} ms; the ceiling has no device)")
            out.append((text, r >= 0.9))
        for peer in VM_PEERS:
            r = ratio.get((GOAL_WORKLOAD, j, peer))
            if r is None:
                continue
            text = f"fio write 64k fsync=1, {j} job(s): >= 1x {peer}: {r:.2f}x"
            bound = headroom(report, GOAL_WORKLOAD, j, peer)
            if r < 1 and bound is not None and bound < 1:
                text += f" (impossible with this client: the ceiling itself reaches {bound:.2f}x)"
            out.append((text, r >= 1))
    val = {(r["workload"], r["jobs"], r["system"]): r["value"] for r in report["results"]}
    for j in (1, 16):
        one, two = val.get((GOAL_WORKLOAD, j, APPLIANCE)), val.get((GOAL_WORKLOAD, j, MIRROR))
        if one and two:
            # Issue 27: a mirror costs at most 15% of fsync throughput at 16 jobs.
            text = f"mirror (two NVMe legs) vs one device, fio write 64k fsync=1, {j} job(s): {two / one:.2f}x"
            out.append((text + (" (>= 0.85)" if j == 16 else ""), two / one >= 0.85 if j == 16 else None))
    d = dev.get((GOAL_WORKLOAD, 1, APPLIANCE))
    if d and d.get("flushes_per_fsync") is not None:
        out.append((f"device flushes per fsync, 1 job: <= 1: {d['flushes_per_fsync']:.2f}", d["flushes_per_fsync"] <= 1.0))
    d = dev.get((GOAL_WORKLOAD, 16, APPLIANCE))
    if d and d.get("flushes_per_fsync") is not None:
        text = f"device flushes per fsync, 16 jobs: <= 0.25: {d['flushes_per_fsync']:.2f}"
        runtime = (report.get("meta") or {}).get("runtime")
        if d["flushes_per_fsync"] > 0.25 and d.get("fsyncs") and d.get("flush_ms") and runtime:
            # A commit takes the fsyncs that arrived while the one before it was in flight.
            gap = runtime * 1000 / d["fsyncs"]
            natural = 1 / (1 + d["flush_ms"] / gap)
            text += (f" (the client's fsyncs arrive every {gap:.1f} ms and a commit's FLUSH takes "
                     f"{d['flush_ms']:.2f} ms, so a commit finds ~{1 / natural:.1f} waiting: "
                     f"~{natural:.2f} flushes per fsync; 0.25 needs each commit to wait for "
                     f"~{4 - 1 / natural:.1f} more arrivals, ~{(4 - 1 / natural) * gap:.0f} ms added to "
                     f"every fsync: docs/benchmarks.md, \"A group-commit window\")")
        out.append((text, d["flushes_per_fsync"] <= 0.25))
    return out


def goals_reads(report):
    """Issue 36's goals, checked against this run: (text, met or None)."""
    ratio = {(r["workload"], r["jobs"], r["peer"]): r["ratio"] for r in report["ratios"]}
    keys = []
    for r in report["results"]:
        k = (r["workload"], r["jobs"])
        if r["workload"] in READ_RESULTS and r["system"] == APPLIANCE and k not in keys:
            keys.append(k)
    out = []
    for w, j in keys:
        if w == WARM_RANDREAD:
            r = ratio.get((w, j, "linux-vm-btrfs-diod"))
            if r is not None:
                text = f"{w}, {j} job(s): >= {WARM_RANDREAD_GOAL:g}x linux-vm-btrfs-diod: {r:.2f}x"
                bound = headroom(report, w, j, "linux-vm-btrfs-diod")
                if r < WARM_RANDREAD_GOAL and bound is not None and bound < WARM_RANDREAD_GOAL:
                    text += f" (impossible with this client: the ceiling itself reaches {bound:.2f}x)"
                out.append((text + not_warm(report, w, j, "linux-vm-btrfs-diod"), r >= WARM_RANDREAD_GOAL))
        # Every Linux VM peer at >= 1x (for the warm random reads, besides the 2x above).
        got = [(p, ratio[(w, j, p)]) for p in VM_PEERS if (w, j, p) in ratio]
        if got:
            low = [p for p, r in got if r < READ_GOAL]
            text = f"{w}, {j} job(s): >= {READ_GOAL:g}x every Linux VM peer: " + ", ".join(
                f"{p} {r:.2f}x" for p, r in got
            )  # fmt: skip
            if low:
                text += f" (below: {', '.join(low)})"
            if w.endswith("-warm"):
                text += "".join(not_warm(report, w, j, p) for p, _ in got)
            out.append((text, not low))
    return out


def not_warm(report, workload, jobs, system):
    """A note when a system's cache did not hold a warm set: its device read more than a
    tenth of what the client read."""
    for d in report.get("reads") or []:
        if (d["workload"], d["jobs"], d["system"]) != (workload, jobs, system):
            continue
        kib = d.get("dev_kib_read_per_read")
        asked = (d.get("read_mib_s") or 0) * 1024 / d["read_iops"] if d.get("read_iops") else None
        if kib is not None and asked and kib > asked / 10:
            return (f" ({system} read {kib:.1f} KiB from its device per {asked:.0f} KiB read: its cache did not "
                    f"hold the warm set)")  # fmt: skip
    return ""


def write_figures(report):
    """The appliance's write figures {(workload, jobs): value}: every result that is not
    a read (bonnie++'s block read is one too)."""
    return {
        (r["workload"], r["jobs"]): r["value"] for r in report["results"]
        if r["system"] == APPLIANCE and r["workload"] not in READ_RESULTS and r["workload"] != "bonnie-read"
    }  # fmt: skip


def baseline_rows(report, baseline):
    """The appliance's write figures against a baseline report's: [(workload, jobs, unit,
    baseline, now, now / baseline)] for every workload both have."""
    if not baseline:
        return []
    base, now = write_figures(baseline), write_figures(report)
    units = {(r["workload"], r["jobs"]): r["unit"] for r in report["results"]}
    return [(w, j, units.get((w, j), ""), base[(w, j)], v, round(v / base[(w, j)], 3))
            for (w, j), v in now.items() if base.get((w, j))]  # fmt: skip


def goals_baseline(report, baseline):
    """No write workload more than WRITE_SLACK below the baseline's figure."""
    if not baseline:
        return [("writes against a baseline: none given (--baseline REPORT.json)", None)]
    rows = baseline_rows(report, baseline)
    if not rows:
        return [("writes against the baseline: no write workload in both runs", None)]
    when = (baseline.get("meta") or {}).get("date", "?")
    return [(f"{w}, {j} job(s): >= {1 - WRITE_SLACK:.2f}x the baseline ({when}): {b:.4g} -> {v:.4g} {u}, {r:.2f}x",
             r >= 1 - WRITE_SLACK) for w, j, u, b, v, r in rows]  # fmt: skip


def headroom(report, workload, jobs, peer):
    """ceiling / peer: the largest ratio over `peer` any 9P server can show through this
    client (None without both figures)."""
    val = {(r["workload"], r["jobs"], r["system"]): r["value"] for r in report["results"]}
    c, p = val.get((workload, jobs, "ceiling")), val.get((workload, jobs, peer))
    return round(c / p, 3) if c and p else None


def reads_markdown(report):
    """The read workloads' own section: latency and what the server did per read."""
    rows = report.get("reads") or []
    if not rows:
        return []
    m = report["meta"]
    order = list(READ_RESULTS)
    rows = sorted(rows, key=lambda d: (order.index(d["workload"]) if d["workload"] in order else 99, d["jobs"],
                                       SYSTEMS.index(d["system"]) if d["system"] in SYSTEMS else 99))  # fmt: skip
    kind = {"warm": "warm", "cold": "cold"}
    sets = sorted({(kind.get(d["workload"].rsplit("-", 1)[-1], "the mix"), d.get("set_mib"))
                   for d in rows if d.get("set_mib")})  # fmt: skip
    out = [
        "",
        "## Reads",
        "",
        "fio through the client guest: sequential reads of 1 MiB (MiB/s) and random reads of 4 KiB (IOPS), each "
        "job over its own slice of one file. Warm: the file set was laid out, fsynced and read once, untimed, "
        "right before the measured run, so the server's cache may hold it; cold: a set twice the server's "
        "memory, the client's caches dropped before the run. The client never serves reads from its own page "
        "cache for a remote system: 9P mounts are cache=none, NFS runs O_DIRECT (O_DIRECT = 1 below); on "
        "client-local disks warm reads come from the client's own page cache and cold ones run O_DIRECT. "
        "Sets: " + (", ".join(f"{t} {mib:g} MiB" for t, mib in sets) or "-") + ".",
        "",
        "Per read (fio's reads): the server's device (KiB and, for Linux, from /sys/block; the appliance's own "
        "counters), knfsd's READ operations (and KiB per READ: its rsize), the appliance's filesystem (data KiB "
        "read from the device, btree nodes loaded), its 9P Treads and the mean time it spent serving one. "
        "Client TCP: segments the client queued out of order and duplicate segments it reported (DSACK) over "
        "the run: replies that lost frames on the way and were sent again.",
        "",
        "| workload | jobs | system | MiB/s | IOPS | read ms mean | read ms p99 | O_DIRECT | device KiB / read "
        "| NFS READs / read (KiB each) | fs data KiB / read | node loads / read | Treads / read | ms / Tread "
        "| data cache hits | client TCP out of order / DSACKs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in rows:
        net = d.get("client_net") or {}
        tcp = f"{net['tcp_ofo_queued']} / {net.get('tcp_dsacks_sent', 0)}" if "tcp_ofo_queued" in net else "-"
        nfs = "-"
        if d.get("nfs_reads_per_read") is not None:
            nfs = f"{d['nfs_reads_per_read']:.2f} ({fmt(d.get('nfs_kib_per_nfs_read'), 1)})"
        out.append(
            f"| {d['workload']} | {d['jobs']} | {d['system']} | {fmt(d.get('read_mib_s'))} | "
            f"{fmt(d.get('read_iops'), 0)} | {fmt(d.get('clat_mean_ms'))} | {fmt(d.get('clat_p99_ms'))} | "
            f"{fmt(d.get('direct'))} | {fmt(d.get('dev_kib_read_per_read'), 1)} | {nfs} | "
            f"{fmt(d.get('data_kib_read_per_read'), 1)} | {fmt(d.get('node_loads_per_read'))} | "
            f"{fmt(d.get('treads_per_read'))} | {fmt(d.get('tread_ms'))} | "
            f"{fmt(d.get('data_cache_hit_ratio'))} | {tcp} |"
        )
    mixed = [d for d in rows if d.get("writes")]
    if mixed:
        out += [
            "",
            "### The mix: randrw rwmixread=70 bs=4k fsync=1",
            "",
            "fio 3.33 (the guest's) issues fsync=1's fsync whenever the count of writes issued is a multiple of 1, "
            "without looking at what came last: once the first write is out, an fsync follows every I/O, read or "
            "write, so ~70% of the fsyncs have nothing new to make durable (a 2024 patch, axboe/fio pull request "
            "1777 \"io_u: ensure fsync only after write(s)\", syncs only after writes). NFS runs it O_DIRECT: "
            "each 4 KiB write goes out as one stable WRITE and the fsync finds "
            "nothing to COMMIT.",
            "",
            "| jobs | system | read IOPS | write IOPS | read ms | write ms | fsync ms | fsyncs / I/O | NFS WRITEs / write "
            "| NFS COMMITs / fsync |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for d in mixed:
            io = (d.get("reads") or 0) + (d.get("writes") or 0)
            out.append(
                f"| {d['jobs']} | {d['system']} | {fmt(d.get('read_iops'), 0)} | {fmt(d.get('write_iops'), 0)} | "
                f"{fmt(d.get('clat_mean_ms'))} | {fmt(d.get('write_clat_mean_ms'))} | {fmt(d.get('fsync_ms'))} | "
                f"{fmt(per(d.get('fsyncs'), io), 2)} | {fmt(d.get('nfs_writes_per_write'))} | "
                f"{fmt(d.get('nfs_commits_per_fsync'))} |"
            )
    mem = report.get("server_mem_available_kib") or {}
    if mem:
        out += ["", "What each Linux server guest had available at its end (MemAvailable; its root file system "
                "lives in its RAM, an initramfs): " + ", ".join(f"{s} {kib / 1024:.1f} MiB" for s, kib in mem.items())
                + f"; the server's memory: {m.get('server', '?')}."]  # fmt: skip
    return out


def markdown(report, baseline=None):
    m = report["meta"]
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in report["results"])]
    lines = [
        "# ninefold benchmark report",
        "",
        f"Run {m['date']} on {m['host']} ({m['cpus']} CPUs, load average at start {m['load']}), "
        f"9P link MTU {m.get('mtu', 1500)} ({LINKS[m.get('link', 'dgram')]}), "
        f"QEMU TCG, {m['runtime']} s per fio/dbench workload, client guest "
        f"{m['client']}, server guest and appliance {m['server']}. Compare only within this "
        "run: throughput under TCG on shared cores drifts by +-30% between runs."
        + (f" Took {m['seconds'] / 60:.0f} min" if m.get("seconds") else "")
        + (" (" + ", ".join(f"{s} {t / 60:.1f}" for s, t in m["system_seconds"].items()) + ")."
           if m.get("system_seconds") else "." if m.get("seconds") else ""),
        "",
        "## Results (higher is better)",
        "",
        "| workload | jobs | " + " | ".join(systems) + " | unit |",
        "|---|---|" + "---|" * len(systems) + "---|",
    ]
    keys = []
    for r in report["results"]:
        k = (r["workload"], r["jobs"])
        if k not in keys:
            keys.append(k)
    val = {(r["workload"], r["jobs"], r["system"]): r for r in report["results"]}
    for w, j in keys:
        unit = next(r["unit"] for r in report["results"] if (r["workload"], r["jobs"]) == (w, j))
        cells = [fmt(val[(w, j, s)]["value"]) if (w, j, s) in val else "-" for s in systems]
        lines.append(f"| {w} | {j} | " + " | ".join(cells) + f" | {unit} |")
    peers = [s for s in systems if s != APPLIANCE]
    lines += [
        "",
        f"## Ratios: {APPLIANCE} / peer (above 1: the appliance is better)",
        "",
        "| workload | jobs | " + " | ".join(peers) + " |",
        "|---|---|" + "---|" * len(peers),
    ]
    rat = {(r["workload"], r["jobs"], r["peer"]): r["ratio"] for r in report["ratios"]}
    for w, j in keys:
        cells = [fmt(rat.get((w, j, p))) for p in peers]
        lines.append(f"| {w} | {j} | " + " | ".join(cells) + " |")
    vm_peers = [p for p in peers if p != "ceiling"]
    if "ceiling" in systems:
        lines += [
            "",
            "## Headroom: ceiling / peer",
            "",
            "The ceiling answers at once, so through this client no 9P server can show a larger "
            f"ratio over a peer than the ceiling's own: a {APPLIANCE} / peer ratio above the "
            "figure here is impossible, and a goal above it cannot be met in this setup.",
            "",
            "| workload | jobs | " + " | ".join(vm_peers) + " |",
            "|---|---|" + "---|" * len(vm_peers),
        ]
        for w, j in keys:
            cells = [fmt(headroom(report, w, j, p)) for p in vm_peers]
            lines.append(f"| {w} | {j} | " + " | ".join(cells) + " |")
    lines += ["", "## Goals", ""]
    for text, ok in goals(report):
        lines.append(f"- {'measured' if ok is None else 'met' if ok else 'NOT met'}: {text}")
    if not goals(report):
        lines.append(f"- none checked: issue 12's and 27's goals need {GOAL_WORKLOAD} (fio-write-jN)")
    read_goals = goals_reads(report)
    if read_goals or baseline:
        lines += [
            "",
            "## Goals: reads (issue 36)",
            "",
            f"The appliance >= {WARM_RANDREAD_GOAL:g}x linux-vm-btrfs-diod on warm 4 KiB random reads at 1 and 16 "
            f"jobs; >= {READ_GOAL:g}x every Linux VM peer on every read workload; no write workload more than "
            f"{WRITE_SLACK:.0%} below a baseline report (--baseline). Throughput drifts +-30% between runs, so "
            "the baseline comparison means something only for runs back to back on a quiet machine.",
            "",
        ]
        for text, ok in read_goals + goals_baseline(report, baseline):
            lines.append(f"- {'measured' if ok is None else 'met' if ok else 'NOT met'}: {text}")
    rows = baseline_rows(report, baseline)
    if rows:
        lines += [
            "",
            f"### Writes against the baseline ({(baseline.get('meta') or {}).get('date', '?')})",
            "",
            f"{APPLIANCE}'s write figures, this run against the baseline report's.",
            "",
            "| workload | jobs | baseline | this run | this run / baseline | unit |",
            "|---|---|---|---|---|---|",
        ]
        lines += [f"| {w} | {j} | {fmt(b)} | {fmt(v)} | {r:.2f} | {u} |" for w, j, u, b, v, r in rows]
    lines += reads_markdown(report)
    if not report["devices"]:
        return finish_markdown(lines, report)
    lines += [
        "",
        "## Device counters per fsync",
        "",
        "The server's disk for 9P systems, the client's own disk for client-local ones; "
        "fsyncs as the client counted them. Flushes: /sys/block/DEV/stat (Linux) and the "
        "appliance's own counters; FUA writes: a block_rq_issue histogram (Linux) and the "
        "appliance's counters. Bytes include deferred writeback (the harness syncs the "
        "server before reading its counters); the appliance's figures exclude btree nodes "
        "still dirty in memory at the end (the next checkpoint writes them). NFS WRITEs and "
        "COMMITs: the NFS server's operation counts (/proc/net/rpc/nfsd). Device FLUSH ms: "
        "the appliance's mean FLUSH latency from its own counters.",
        "",
        "| workload | jobs | system | fsyncs | fsync ms | device FLUSH ms | KiB written / fsync | flushes / fsync | FUA writes / fsync | checkpoints / fsync | NFS WRITEs / fsync | NFS COMMITs / fsync |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in sorted(report["devices"], key=lambda d: (keys.index((d["workload"], d["jobs"])) if (d["workload"], d["jobs"]) in keys else 99, SYSTEMS.index(d["system"]))):
        lines.append(
            f"| {d['workload']} | {d['jobs']} | {d['system']} | {fmt(d.get('fsyncs'))} | {fmt(d.get('fsync_ms'))} | {fmt(d.get('flush_ms'))} | "
            f"{fmt(d.get('kib_written_per_fsync'), 1)} | {fmt(d.get('flushes_per_fsync'))} | "
            f"{fmt(d.get('fua_writes_per_fsync'))} | {fmt(d.get('checkpoints_per_fsync'))} | "
            f"{fmt(d.get('nfs_writes_per_fsync'))} | {fmt(d.get('nfs_commits_per_fsync'))} |"
        )
    return finish_markdown(lines, report)


def finish_markdown(lines, report):
    if report["failed"]:
        lines += ["", "## Failed", ""]
        lines += [f"- {f['system']} {f['workload']}: {f['error']}" for f in report["failed"]]
    return "\n".join(lines) + "\n"


def venv_python():
    """A Python with matplotlib: a venv under build/ (created on first use)."""
    venv = os.path.join(os.environ.get("BUILD", os.path.join(REPO, "build")), "bench", "venv")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        log(f"creating {venv} with matplotlib (once)")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    if subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode:
        subprocess.run([py, "-m", "pip", "install", "-q", "matplotlib"], check=True)
    return py


def charts(report_path, out_dir):
    try:
        py = venv_python()
    except (subprocess.CalledProcessError, OSError) as e:
        log(f"no charts: cannot set up matplotlib ({e})")
        return
    r = subprocess.run([py, os.path.join(HERE, "charts.py"), report_path, out_dir])
    if r.returncode:
        log("charts failed")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--system", action="append", choices=SYSTEMS, help="default: all")
    ap.add_argument("--workload", action="append", help=f"default: {' '.join(WORKLOADS)}")
    ap.add_argument("--runtime", type=int, help="seconds per fio/dbench workload (default 15)")
    ap.add_argument("--quick", action="store_true", help=f"5 s each: {' '.join(QUICK_WORKLOADS)}")
    ap.add_argument("--reads", action="store_true", help=f"the read workloads only: {' '.join(READ_WORKLOADS)}")
    ap.add_argument("--writes", action="store_true", help="the write workloads only (make bench before issue 36)")
    ap.add_argument("--read-warm-mib", type=int, help="MiB of the warm read set (default 12 at 128 MiB servers)")
    ap.add_argument("--read-cold-mib", type=int, help="MiB of the cold read set (default 256: twice the servers')")
    ap.add_argument("--baseline", metavar="REPORT.json",
                    help="an earlier report: compare the appliance's write figures with it (issue 36's goal)")
    ap.add_argument("--out", help="report directory (default build/bench)")
    ap.add_argument("--report-only", metavar="RUN", help="rebuild the report of the run in RUN")
    ap.add_argument(
        "--mtu", type=int, default=9000,
        help="IP MTU of the 9P link, on the client and every server (default 9000: jumbo frames)",
    )  # fmt: skip
    ap.add_argument(
        "--link", choices=["tap", "dgram", "stream"], default="tap" if os.geteuid() == 0 else "dgram",
        help="the guest-to-guest link (tests/guest/peers --link): taps on a bridge in a network namespace "
        "of the run's own (the default as root: no host socket buffers in the way, offloads as on a host's "
        "bridge) or QEMU's UDP or TCP socket link",
    )  # fmt: skip
    ap.add_argument("--peers-arg", action="append", default=[], help="passed to tests/guest/peers")
    a = ap.parse_args()
    build = os.environ.get("BUILD", os.path.join(REPO, "build"))
    out = a.out or os.path.join(build, "bench")
    os.makedirs(out, exist_ok=True)
    systems = a.system or SYSTEMS
    if a.workload:
        workloads = a.workload
    elif a.reads or a.writes:
        workloads = (WRITE_WORKLOADS if a.writes else []) + (READ_WORKLOADS if a.reads else [])
    else:
        workloads = QUICK_WORKLOADS if a.quick else WORKLOADS
    runtime = a.runtime or (5 if a.quick else 15)
    baseline = None
    if a.baseline:
        with open(a.baseline) as f:
            baseline = json.load(f)
    if a.report_only:
        run_dir = a.report_only
        with open(os.path.join(run_dir, "meta.json")) as f:
            meta = json.load(f)
    else:
        run_dir = os.path.join(out, "runs", datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
        os.makedirs(run_dir)
        meta = {
            "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "host": os.uname().nodename, "cpus": os.cpu_count(),
            "load": " ".join(f"{x:.1f}" for x in os.getloadavg()), "runtime": runtime,
            "systems": systems, "workloads": workloads,
            "client": "1 GiB, 2 vCPUs", "server": "128 MiB, 1 vCPU", "mtu": a.mtu, "link": a.link,
        }  # fmt: skip
        with open(os.path.join(run_dir, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        log(f"{len(systems)} systems x {len(workloads)} workloads, {runtime} s each; raw results in {run_dir}")
        cmd = [os.path.join(REPO, "tests", "guest", "peers"), "--out", run_dir, "--runtime", str(runtime),
               "--progress", *[f"--peer={s}" for s in systems], *[f"--workload={w}" for w in workloads],
               f"--mtu={a.mtu}", f"--link={a.link}", *a.peers_arg]  # fmt: skip
        for flag in ("read_warm_mib", "read_cold_mib"):
            if getattr(a, flag):
                cmd.append(f"--{flag.replace('_', '-')}={getattr(a, flag)}")
        t0 = time.monotonic()
        # peers' output, passed on, with each system's time kept for the report.
        meta["system_seconds"] = {}
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1) as proc:
            for line in proc.stdout:
                print(line, end="", flush=True)
                done = re.match(r"peers: (\S+): status \d+ in (\d+) s", line)
                if done:
                    meta["system_seconds"][done.group(1)] = int(done.group(2))
        status = proc.returncode
        meta["seconds"] = round(time.monotonic() - t0)
        with open(os.path.join(run_dir, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        log(f"peers finished with status {status} in {meta['seconds']} s")
    report = build_report(run_dir, meta["systems"], meta)
    rp = os.path.join(out, "report.json")
    if baseline:
        report["baseline"] = {"path": a.baseline, "date": (baseline.get("meta") or {}).get("date"),
                              "writes": [dict(zip(("workload", "jobs", "unit", "baseline", "value", "ratio"), row,
                                                  strict=True)) for row in baseline_rows(report, baseline)]}  # fmt: skip
    with open(rp, "w") as f:
        json.dump(report, f, indent=1)
    text = markdown(report, baseline)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    charts(rp, out)
    print(text)
    log(f"report: {rp}, {os.path.join(out, 'report.md')}, charts {out}/*.png")
    if not a.report_only and os.path.isdir(run_dir):
        shutil.copy(rp, os.path.join(run_dir, "report.json"))
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
