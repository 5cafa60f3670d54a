#!/usr/bin/env python3
"""Charts of a `make bench` report: charts.py REPORT.json OUTDIR (needs matplotlib).

  fio-write.png   fio write 64k fsync=1 throughput per system, by number of jobs
  fio-read.png    the read workloads per system: sequential 1 MiB reads (MiB/s), random
                  4 KiB reads (IOPS), warm and cold, by number of jobs, and the randrw mix
  ratios.png      ninefold / peer for every workload (log scale; 1x and 5x marked)
  device.png      flushes and KiB written per fsync on the fsync workloads
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

APPLIANCE = "ninefold"
ORDER = [
    APPLIANCE, "linux-vm-btrfs-diod", "linux-vm-ext4-diod", "linux-vm-btrfs-nfs",
    "linux-vm-ext4-nfs", "client-local-btrfs", "client-local-ext4", "ceiling",
]  # fmt: skip
COLORS = dict(zip(ORDER, ["#d62728", "#1f77b4", "#aec7e8", "#9467bd", "#c5b0d5", "#2ca02c",
                          "#98df8a", "#7f7f7f"], strict=True))  # fmt: skip


def systems_in(rows, key="system"):
    return [s for s in ORDER if any(r[key] == s for r in rows)]


def grouped(ax, groups, series, value, ylabel, title, log=False):
    """Bars: one group per x label, one bar per series."""
    width = 0.8 / max(1, len(series))
    for i, s in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ys = [value(label, s) or 0 for label in groups]
        ax.bar(xs, ys, width, label=s, color=COLORS.get(s))
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)


def main():
    report_path, out = sys.argv[1], sys.argv[2]
    with open(report_path) as f:
        report = json.load(f)
    if report.get("kind") == "load":
        load_charts(report, out)
        return
    date = report["meta"]["date"]
    res = report["results"]

    fio = [r for r in res if r["workload"] == "fio-write-64k-fsync"]
    if fio:
        jobs = sorted({r["jobs"] for r in fio})
        val = {(r["jobs"], r["system"]): r["value"] for r in fio}
        fig, ax = plt.subplots(figsize=(9, 4.8))
        grouped(ax, [f"{j} job{'s' if j > 1 else ''}" for j in jobs], systems_in(fio),
                lambda g, s: val.get((int(g.split()[0]), s)), "MiB/s",
                f"fio rw=write bs=64k fsync=1 (TCG, {date})")  # fmt: skip
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "fio-write.png"), dpi=110)

    reads = [r for r in res if r["workload"].startswith(("fio-read-", "fio-randread-", "fio-randrw-"))]
    if reads:
        read_chart(reads, date, os.path.join(out, "fio-read.png"))

    rat = report["ratios"]
    if rat:
        keys = []
        for r in rat:
            k = f"{r['workload']} j{r['jobs']}"
            if k not in keys:
                keys.append(k)
        val = {(f"{r['workload']} j{r['jobs']}", r["peer"]): r["ratio"] for r in rat}
        peers = systems_in(rat, "peer")
        fig, ax = plt.subplots(figsize=(10, 0.45 * len(keys) * max(1, len(peers)) / 2 + 2))
        height = 0.8 / max(1, len(peers))
        for i, p in enumerate(peers):
            ys = [k + (i - (len(peers) - 1) / 2) * height for k in range(len(keys))]
            ax.barh(ys, [val.get((k, p)) or 0 for k in keys], height, label=p, color=COLORS.get(p))
        ax.set_yticks(range(len(keys)), keys, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.axvline(1, color="black", lw=1)
        ax.axvline(5, color="grey", lw=1, ls="--")
        ax.set_xlabel("ninefold / peer (log scale; right of 1 = ninefold better; dashed: 5x)")
        ax.set_title(f"ninefold relative to each peer (TCG, {date})")
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(axis="x", alpha=0.3, which="both")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "ratios.png"), dpi=110)

    dev = [d for d in report["devices"] if d.get("flushes_per_fsync") is not None]
    if dev:
        keys = []
        for d in dev:
            k = f"{d['workload'].replace('-fsync', '')} j{d['jobs']}"
            if k not in keys:
                keys.append(k)
        val = {(f"{d['workload'].replace('-fsync', '')} j{d['jobs']}", d["system"]): d for d in dev}
        systems = systems_in(dev)
        fig, (a1, a2) = plt.subplots(2, 1, figsize=(11, 7.5))
        grouped(a1, keys, systems, lambda k, s: (val.get((k, s)) or {}).get("flushes_per_fsync"),
                "device flushes per fsync", "Device flushes per fsync (server's disk; lower is better)")  # fmt: skip
        grouped(a2, keys, systems, lambda k, s: (val.get((k, s)) or {}).get("kib_written_per_fsync"),
                "KiB written per fsync", "KiB written to the device per fsync (lower is better)", log=True)  # fmt: skip
        for a in (a1, a2):
            a.tick_params(axis="x", labelsize=7, rotation=20)
        a1.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "device.png"), dpi=110)


def read_chart(rows, date, path):
    """fio-read.png: a panel per kind of read (log scale: a page cache and a disk differ by
    orders of magnitude), a group per temperature and job count, a bar per system."""
    panels = [
        ("sequential read, bs=1m", "MiB/s", ("fio-read-1m-warm", "fio-read-1m-cold")),
        ("random read, bs=4k", "IOPS", ("fio-randread-4k-warm", "fio-randread-4k-cold")),
        ("randrw 70% reads, bs=4k, fsync=1", "IOPS (reads + writes)", ("fio-randrw-4k-fsync",)),
    ]
    panels = [p for p in panels if any(r["workload"] in p[2] for r in rows)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.8), squeeze=False)
    val = {(r["workload"], r["jobs"], r["system"]): r["value"] for r in rows}
    for ax, (title, unit, workloads) in zip(axes[0], panels, strict=True):
        mine = [r for r in rows if r["workload"] in workloads]
        groups = []
        for w in workloads:
            for j in sorted({r["jobs"] for r in mine if r["workload"] == w}):
                temp = w.rsplit("-", 1)[-1]
                groups.append((f"{j} job{'s' if j > 1 else ''}" + (f"\n{temp}" if temp in ("warm", "cold") else ""),
                               w, j))  # fmt: skip
        labels = [g[0] for g in groups]
        key = {g[0]: (g[1], g[2]) for g in groups}
        grouped(ax, labels, systems_in(mine), lambda g, s: val.get((*key[g], s)), unit, title, log=True)
        ax.tick_params(axis="x", labelsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"fio reads through the client (TCG, {date}; log scale)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# The appliance's systems in `make bench-load` (ninefold-smp1, ninefold-smp2, ...): reds, in
# the order the run lists them.
APPLIANCE_REDS = ["#d62728", "#ff7f0e", "#8c564b", "#e377c2", "#bcbd22"]


def load_colors(systems):
    """A colour per system of a load report: the peers' own, a red for each appliance."""
    apps = [s for s in systems if s.startswith(APPLIANCE)]
    colors = {s: APPLIANCE_REDS[i % len(APPLIANCE_REDS)] for i, s in enumerate(apps)}
    colors.update((s, COLORS[s]) for s in systems if s in COLORS and s != APPLIANCE)
    return colors


def load_charts(report, out):
    """`make bench-load`: load-WORKLOAD.png, ops/s and p99 latency by connections."""
    rows = report["results"]
    systems = [s for s in report["meta"]["systems"] if any(r["system"] == s for r in rows)]
    colors = load_colors(systems)
    for w in report["meta"]["workloads"]:
        mine = [r for r in rows if r["workload"] == w]
        if not mine:
            continue
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for s in systems:
            pts = sorted(((r["conns"], r) for r in mine if r["system"] == s), key=lambda p: p[0])
            if not pts:
                continue
            xs = [c for c, _ in pts]
            a1.plot(xs, [r["ops_per_s"] for _, r in pts], marker="o", label=s, color=colors.get(s))
            a2.plot(xs, [r["p99_us"] / 1000 for _, r in pts], marker="o", label=s, color=colors.get(s))
        for a, label in ((a1, "ops/s"), (a2, "p99 latency, ms")):
            a.set_xscale("log", base=2)
            a.set_yscale("log")
            a.set_xlabel("connections")
            a.set_ylabel(label)
            a.grid(alpha=0.3, which="both")
        a1.set_title(f"{w}: throughput (host load generator, TCG servers)")
        a2.set_title(f"{w}: p99 latency ({report['meta']['date']})")
        a1.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"load-{w}.png"), dpi=110)


if __name__ == "__main__":
    main()
