#!/usr/bin/env python3
"""make bench: the appliance against its peers, with one client, in one run.

Runs tests/guest/peers with the systems below (the appliance is the `ninefold` peer:
same machine, memory, vCPUs, kind of disk and link as the Linux server guest) and the
workloads of tests/guest/job/bench.sh, then writes

  OUT/report.json   {"results": [{workload, jobs, system, value, unit}],
                     "ratios":  [{workload, jobs, peer, ratio}],   # ninefold / peer
                     "devices": [{workload, jobs, system, fsyncs, ..._per_fsync}], ...}
  OUT/report.md     the same as Markdown tables, with the goals checked
  OUT/*.png         charts (matplotlib, installed into a venv under build/ on first use)

Ratios are appliance / peer with higher meaning better for the appliance (every figure
here is higher-is-better). Under TCG on shared cores throughput drifts +-30% between
runs: compare only within one run (docs/benchmarks.md).

Quicker runs: --quick (5 s per workload, fio-write j1/j16 and fs_mark), or choose
--system/--workload/--runtime. --report-only RUN rebuilds the report of an earlier run.
"""

import argparse
import datetime
import json
import os
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
WORKLOADS = [
    "fio-write-j1", "fio-write-j4", "fio-write-j16", "fio-randwrite-j1", "fio-randwrite-j16",
    "dbench-4", "bonnie", "fsmark",
]  # fmt: skip
QUICK_WORKLOADS = ["fio-write-j1", "fio-write-j16", "fsmark"]
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


def build_report(run_dir, systems, meta):
    recs = {}
    for s in systems:
        d = os.path.join(run_dir, s)
        if os.path.isdir(d):
            recs[s] = guest_results.parse_dir(d)
    results, devices, failed = [], [], []
    for s, rs in recs.items():
        for r in rs:
            if r["status"] or "error" in r:
                failed.append({"system": s, "workload": r["name"], "error": r.get("error", f"status {r['status']}")})
            for w, j, v, u in result_rows(r):
                if v is not None:
                    results.append({"workload": w, "jobs": j, "system": s, "value": round(v, 3), "unit": u})
            if r["name"].startswith(("fio-", "dbench", "fsmark")) and not r["status"]:
                wl = result_rows(r)[0] if result_rows(r) else (r["name"], 1, None, "")
                devices.append({"workload": wl[0], "jobs": wl[1], "system": s, **device_row(r, s)})
    ratios = []
    app = {(r["workload"], r["jobs"]): r["value"] for r in results if r["system"] == APPLIANCE}
    for r in results:
        if r["system"] == APPLIANCE or (r["workload"], r["jobs"]) not in app or not r["value"]:
            continue
        ratios.append({
            "workload": r["workload"], "jobs": r["jobs"], "peer": r["system"],
            "ratio": round(app[(r["workload"], r["jobs"])] / r["value"], 3),
        })  # fmt: skip
    return {"meta": meta, "results": results, "ratios": ratios, "devices": devices, "failed": failed}


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


def headroom(report, workload, jobs, peer):
    """ceiling / peer: the largest ratio over `peer` any 9P server can show through this
    client (None without both figures)."""
    val = {(r["workload"], r["jobs"], r["system"]): r["value"] for r in report["results"]}
    c, p = val.get((workload, jobs, "ceiling")), val.get((workload, jobs, peer))
    return round(c / p, 3) if c and p else None


def markdown(report):
    m = report["meta"]
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in report["results"])]
    lines = [
        "# ninefold benchmark report",
        "",
        f"Run {m['date']} on {m['host']} ({m['cpus']} CPUs, load average at start {m['load']}), "
        f"9P link MTU {m.get('mtu', 1500)}, "
        f"QEMU TCG, {m['runtime']} s per fio/dbench workload, client guest "
        f"{m['client']}, server guest and appliance {m['server']}. Compare only within this "
        "run: throughput under TCG on shared cores drifts by +-30% between runs.",
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
    ap.add_argument("--out", help="report directory (default build/bench)")
    ap.add_argument("--report-only", metavar="RUN", help="rebuild the report of the run in RUN")
    ap.add_argument(
        "--mtu", type=int, default=9000,
        help="IP MTU of the 9P link, on the client and every server (default 9000: jumbo frames)",
    )  # fmt: skip
    ap.add_argument("--peers-arg", action="append", default=[], help="passed to tests/guest/peers")
    a = ap.parse_args()
    build = os.environ.get("BUILD", os.path.join(REPO, "build"))
    out = a.out or os.path.join(build, "bench")
    os.makedirs(out, exist_ok=True)
    systems = a.system or SYSTEMS
    workloads = a.workload or (QUICK_WORKLOADS if a.quick else WORKLOADS)
    runtime = a.runtime or (5 if a.quick else 15)
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
            "client": "1 GiB, 2 vCPUs", "server": "128 MiB, 1 vCPU", "mtu": a.mtu,
        }  # fmt: skip
        with open(os.path.join(run_dir, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        log(f"{len(systems)} systems x {len(workloads)} workloads, {runtime} s each; raw results in {run_dir}")
        cmd = [os.path.join(REPO, "tests", "guest", "peers"), "--out", run_dir, "--runtime", str(runtime),
               "--progress", *[f"--peer={s}" for s in systems], *[f"--workload={w}" for w in workloads],
               f"--mtu={a.mtu}", *a.peers_arg]  # fmt: skip
        t0 = time.monotonic()
        status = subprocess.run(cmd).returncode
        meta["seconds"] = round(time.monotonic() - t0)
        with open(os.path.join(run_dir, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        log(f"peers finished with status {status} in {meta['seconds']} s")
    report = build_report(run_dir, meta["systems"], meta)
    rp = os.path.join(out, "report.json")
    with open(rp, "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(markdown(report))
    charts(rp, out)
    print(markdown(report))
    log(f"report: {rp}, {os.path.join(out, 'report.md')}, charts {out}/*.png")
    if not a.report_only and os.path.isdir(run_dir):
        shutil.copy(rp, os.path.join(run_dir, "report.json"))
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
