#!/usr/bin/env python3
"""Parse what the guest's bench.sh / devbench.sh left in a results directory.

Each workload ran in /results/NAME (see nf_measure in job/lib.sh); this module turns
such a directory into one record per workload:

    {"name": "fio-write-j1", "label": "...", "status": 0, "seconds": 15.0,
     "metrics": {"write_mib_s": 5.2, "fsyncs": 1234, ...,
                 "read_mib_s": .., "read_iops": .., "reads": .., "read_clat_mean_us": ..,
                 "read_clat_p99_us": .., "direct": 0},   # fio's read side, when it read
     "devices": {"local data": {"bytes_written": .., "write_ios": .., "flushes": ..,
                                "fua_writes": ..}},
     "per_fsync": {"local data": {"bytes_written": .., "flushes": .., "fua_writes": ..}},
     "per_read": {"local data": {"bytes_read": ..}},   # device bytes per read fio did
     "appliance": {...},   # the appliance's own counters (stat-*.json), as deltas
     "nfsd": {"compounds": .., "writes": .., "commits": .., "write_bytes": .., ...},
                           # an NFS server guest's /proc/net/rpc/nfsd (stat-*.nfsd), deltas
     "client_net": {"tcp_in_segs": .., "tcp_ofo_queued": .., "nic_rx_dropped": .., ...}}
                           # the client's TCP and NIC counters around a read workload

Usage: results.py DIR [DIR..] [--json FILE]   (prints a table; writes JSON if asked)
"""

import argparse
import json
import os
import re
import sys

SECTOR = 512
# /sys/block/DEV/stat fields (Documentation/block/stat.rst), 0-based.
STAT_FIELDS = {
    "read_ios": 0, "read_sectors": 2, "write_ios": 4, "write_sectors": 6,
    "discard_ios": 11, "flushes": 15,
}  # fmt: skip
# The harness appends an 18th field to each stat line: FUA writes (-1: not counted).
FUA_FIELD = 17


def parse_stat_file(path):
    """'SIDE NAME f1..f17' lines -> {"SIDE NAME": [ints]}."""
    out = {}
    with open(path) as f:
        for line in f:
            cols = line.split()
            if len(cols) >= 2 + 17:
                out[f"{cols[0]} {cols[1]}"] = [int(x) for x in cols[2:]]
    return out


def json_deltas(before, after):
    """after - before for every number in two JSON documents of the same shape."""
    if isinstance(after, dict):
        return {
            k: d for k in after if k in before
            for d in [json_deltas(before[k], after[k])] if d is not None
        }  # fmt: skip
    if isinstance(after, list) and isinstance(before, list) and len(after) == len(before):
        return [json_deltas(b, a) for b, a in zip(before, after, strict=True)]
    if isinstance(after, (int, float)) and not isinstance(after, bool):
        return after - before
    return None


def device_deltas(before, after):
    devs = {}
    for key in sorted(set(before) & set(after)):
        if len(after[key]) != len(before[key]):
            continue
        d = [a - b for a, b in zip(after[key], before[key], strict=True)]
        devs[key] = {
            "bytes_written": d[STAT_FIELDS["write_sectors"]] * SECTOR,
            "write_ios": d[STAT_FIELDS["write_ios"]],
            "flushes": d[STAT_FIELDS["flushes"]],
            "bytes_read": d[STAT_FIELDS["read_sectors"]] * SECTOR,
            "read_ios": d[STAT_FIELDS["read_ios"]],
            "discards": d[STAT_FIELDS["discard_ios"]],
        }
        counted = len(after[key]) > FUA_FIELD and min(after[key][FUA_FIELD], before[key][FUA_FIELD]) >= 0
        devs[key]["fua_writes"] = d[FUA_FIELD] if counted else None
    return devs


# NFSv4 operation numbers (RFC 7862) in the proc4ops line of /proc/net/rpc/nfsd.
NFS4_OPS = {
    "accesses": 3, "closes": 4, "commits": 5, "getattrs": 9, "lookups": 15, "opens": 18,
    "reads": 25, "removes": 28, "setattrs": 34, "writes": 38,
}  # fmt: skip


def parse_nfsd_file(path):
    """/proc/net/rpc/nfsd -> {"compounds", "write_bytes", "read_bytes", NFS4_OPS keys}."""
    out = {}
    with open(path) as f:
        for line in f:
            cols = line.split()
            if not cols or not all(c.isdigit() for c in cols[1:]):
                continue
            if cols[0] == "io" and len(cols) >= 3:
                out["read_bytes"], out["write_bytes"] = int(cols[1]), int(cols[2])
            elif cols[0] == "proc4" and len(cols) >= 4:
                out["compounds"] = int(cols[3])
            elif cols[0] == "proc4ops":
                ops = [int(c) for c in cols[2:]]
                out.update((k, ops[i]) for k, i in NFS4_OPS.items() if i < len(ops))
    return out


# The client's network counters kept around read workloads (bench.sh's net-before/after):
# what the report shows of them.
NET_COUNTERS = {
    "tcp_in_segs": ("Tcp", "InSegs"), "tcp_out_segs": ("Tcp", "OutSegs"),
    "tcp_retrans_segs": ("Tcp", "RetransSegs"), "tcp_ofo_queued": ("TcpExt", "TCPOFOQueue"),
    "tcp_dsacks_sent": ("TcpExt", "TCPDSACKOldSent"), "tcp_pure_acks": ("TcpExt", "TCPPureAcks"),
    "tcp_rcv_pruned": ("TcpExt", "PruneCalled"), "nic_rx_packets": ("Nic", "rx_packets"),
    "nic_rx_dropped": ("Nic", "rx_dropped"), "nic_tx_packets": ("Nic", "tx_packets"),
}  # fmt: skip


def parse_net_file(path):
    """/proc/net/snmp + /proc/net/netstat (a header line and a value line per protocol)
    and "Nic: NAME VALUE" lines -> {(protocol, name): int}."""
    out, header = {}, {}
    with open(path) as f:
        for line in f:
            proto, _, rest = line.partition(":")
            cols = rest.split()
            if proto == "Nic" and len(cols) == 2 and cols[1].lstrip("-").isdigit():
                out[(proto, cols[0])] = int(cols[1])
            elif cols and all(c.lstrip("-").isdigit() for c in cols) and proto in header:
                out.update(((proto, k), int(v)) for k, v in zip(header.pop(proto), cols, strict=False))
            elif cols:
                header[proto] = cols
    return out


def fio_metrics(path):
    """Sum over the (group-reported) jobs of fio's JSON output."""
    with open(path) as f:
        text = f.read()
    # fio may print warnings before the JSON document.
    data = json.loads(text[text.index("{") :])
    m = {"write_mib_s": 0.0, "write_iops": 0.0, "fsyncs": 0}
    lat = []
    for job in data["jobs"]:
        w = job["write"]
        m["write_mib_s"] += w["bw_bytes"] / 2**20
        m["write_iops"] += w["iops"]
        m["writes"] = m.get("writes", 0) + w["total_ios"]
        r = job.get("read") or {}
        if r.get("total_ios"):
            m["read_mib_s"] = m.get("read_mib_s", 0.0) + r["bw_bytes"] / 2**20
            m["read_iops"] = m.get("read_iops", 0.0) + r["iops"]
            m["reads"] = m.get("reads", 0) + r["total_ios"]
            m["read_bytes"] = m.get("read_bytes", 0) + r["io_bytes"]
            for key, ns in (("clat", r.get("clat_ns") or {}), ("lat", r.get("lat_ns") or {})):
                if ns.get("mean") is not None:
                    m[f"read_{key}_mean_us"] = ns["mean"] / 1000
                p99 = (ns.get("percentile") or {}).get("99.000000")
                if p99 is not None:
                    m[f"read_{key}_p99_us"] = p99 / 1000
        # What the client did with its page cache: fio's direct= (1: O_DIRECT).
        opts = job.get("job options") or {}
        if "direct" in opts:
            m["direct"] = int(opts["direct"])
        # The file set the jobs went over (size= per job, e.g. "24576k").
        size = re.fullmatch(r"(\d+)([kmg]?)", str(opts.get("size", "")).lower())
        if size and "offset_increment" in opts:
            scale = {"": 1 / 1024, "k": 1, "m": 1024, "g": 1024 * 1024}[size.group(2)]
            m["set_mib"] = round(int(size.group(1)) * scale * int(opts.get("numjobs", 1)) / 1024, 1)
        sync = job.get("sync", {})
        # fio counts fsync calls in total_ios, fdatasync calls only in lat_ns.N.
        n_sync = sync.get("total_ios") or sync.get("lat_ns", {}).get("N", 0)
        m["fsyncs"] += n_sync
        if n_sync:
            lat.append((n_sync, sync["lat_ns"]))
        if w["total_ios"]:
            clat = w["clat_ns"]
            m["write_clat_mean_us"] = clat["mean"] / 1000
            pct = clat.get("percentile", {})
            if "99.000000" in pct:
                m["write_clat_p99_us"] = pct["99.000000"] / 1000
    if lat:
        n = sum(c for c, _ in lat)
        m["fsync_lat_mean_us"] = sum(c * ln["mean"] for c, ln in lat) / n / 1000
        m["fsync_lat_max_us"] = max(ln["max"] for _, ln in lat) / 1000
        p99 = [ln.get("percentile", {}).get("99.000000") for _, ln in lat]
        if all(p99):
            m["fsync_lat_p99_us"] = max(p99) / 1000
    m["write_mib_s"] = round(m["write_mib_s"], 3)
    if "read_mib_s" in m:
        m["read_mib_s"] = round(m["read_mib_s"], 3)
    return m


DBENCH_TPUT = re.compile(r"Throughput ([\d.]+) MB/sec\s+(\d+) clients")
DBENCH_OP = re.compile(r"^\s*(\w+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s*$")


def dbench_metrics(text):
    m = DBENCH_TPUT.search(text)
    if not m:
        raise ValueError("no dbench throughput line")
    ops = {o.group(1): int(o.group(2)) for o in map(DBENCH_OP.match, text.splitlines()) if o}
    # dbench's "Flush" operations are fsync(2) calls in its file-system backend.
    return {"mb_s": float(m.group(1)), "clients": int(m.group(2)), "fsyncs": ops.get("Flush", 0)}


# bonnie++ 2.00 CSV (format 1.98): column index of each figure we report.
BONNIE_CSV = {
    "put_block_kib_s": 11, "rewrite_kib_s": 13, "get_block_kib_s": 17, "seeks_s": 19,
    "seq_create_s": 26, "seq_delete_s": 30, "ran_create_s": 32, "ran_delete_s": 36,
}  # fmt: skip


def bonnie_metrics(text):
    for line in text.splitlines():
        cols = line.split(",")
        if len(cols) > 36 and cols[0].startswith("1.9"):
            # "+++++" means too fast to measure; blank means skipped.
            return {
                k: (float(cols[i]) if re.fullmatch(r"[\d.]+", cols[i]) else None)
                for k, i in BONNIE_CSV.items()
            }
    raise ValueError("no bonnie++ CSV line")


def fsmark_metrics(text):
    rows = [
        line.split()
        for line in text.splitlines()
        if re.match(r"^\s*\d+\s+\d+\s+\d+\s+[\d.]+\s+\d+\s*$", line)
    ]
    if not rows:
        raise ValueError("no fs_mark result row")
    files = sum(int(r[1]) for r in rows)
    return {
        "files_s": sum(float(r[3]) for r in rows) / len(rows),
        "files": files,
        "fsyncs": files,  # -S 1: one fsync per file
    }


def parse_workload(d):
    meta = {}
    with open(os.path.join(d, "meta")) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("=")
            meta[k] = v
    rec = {
        "name": meta.get("name", os.path.basename(d)),
        "label": meta.get("label", ""),
        "status": int(meta.get("status", -1)),
        "seconds": float(meta.get("seconds", 0)),
        "meta": meta,
        "metrics": {},
    }
    out = open(os.path.join(d, "out"), errors="replace").read()
    name = rec["name"]
    try:
        if os.path.exists(os.path.join(d, "out.json")):
            rec["metrics"] = fio_metrics(os.path.join(d, "out.json"))
        elif name.startswith("dbench"):
            rec["metrics"] = dbench_metrics(out)
        elif name.startswith("bonnie"):
            rec["metrics"] = bonnie_metrics(out)
        elif name.startswith("fsmark"):
            rec["metrics"] = fsmark_metrics(out)
    except (ValueError, KeyError, json.JSONDecodeError) as e:
        rec["error"] = f"cannot parse output: {e}"
    sb, sa = os.path.join(d, "stat-before"), os.path.join(d, "stat-after")
    if os.path.exists(sb) and os.path.exists(sa):
        rec["devices"] = device_deltas(parse_stat_file(sb), parse_stat_file(sa))
        fsyncs = rec["metrics"].get("fsyncs")
        if fsyncs:
            rec["per_fsync"] = {
                dev: {
                    k: (None if dd.get(k) is None else round(dd[k] / fsyncs, 2))
                    for k in ("bytes_written", "flushes", "fua_writes")
                }
                for dev, dd in rec["devices"].items()
            }
        reads = rec["metrics"].get("reads")
        if reads:
            rec["per_read"] = {
                dev: {"bytes_read": round(dd["bytes_read"] / reads, 1)} for dev, dd in rec["devices"].items()
            }
    jb, ja = sb + ".json", sa + ".json"
    if os.path.exists(jb) and os.path.exists(ja):
        try:
            with open(jb) as fb, open(ja) as fa:
                rec["appliance"] = json_deltas(json.load(fb), json.load(fa))
        except (ValueError, KeyError) as e:
            rec["error"] = f"cannot parse the appliance's counters: {e}"
    netb, neta = os.path.join(d, "net-before"), os.path.join(d, "net-after")
    if os.path.exists(netb) and os.path.exists(neta):
        b, a = parse_net_file(netb), parse_net_file(neta)
        rec["client_net"] = {k: a[key] - b[key] for k, key in NET_COUNTERS.items() if key in a and key in b}
    nb, na = sb + ".nfsd", sa + ".nfsd"
    if os.path.exists(nb) and os.path.exists(na):
        b, a = parse_nfsd_file(nb), parse_nfsd_file(na)
        rec["nfsd"] = {k: a[k] - b[k] for k in a if k in b}
    return rec


def parse_dir(root):
    """All workload records under a results directory, in run order."""
    recs = []
    for name in os.listdir(root):
        d = os.path.join(root, name)
        if os.path.isfile(os.path.join(d, "meta")):
            recs.append(parse_workload(d))
    return sorted(recs, key=lambda r: (float(r["meta"].get("started", 0)), r["name"]))


def headline(rec):
    """The figure a workload is compared by, as (value, unit)."""
    m = rec["metrics"]
    if m.get("reads") and m.get("writes"):
        # A mixed workload (fio randrw): reads and writes together.
        return m.get("read_iops", 0) + m.get("write_iops", 0), "IOPS"
    if m.get("reads"):
        # A read workload: MiB/s for sequential reads, IOPS for random ones.
        if "randread" in rec["name"]:
            return m.get("read_iops"), "IOPS"
        return m.get("read_mib_s"), "MiB/s"
    for key, unit in (
        ("write_mib_s", "MiB/s"),
        ("mb_s", "MB/s"),
        ("files_s", "files/s"),
        ("put_block_kib_s", "KiB/s"),
    ):
        if m.get(key) is not None:
            return m[key], unit
    return None, ""


def table(recs):
    """A plain-text table: one row per workload and device."""
    lines = [
        f"{'label':<20} {'workload':<24} {'result':>14} {'fsyncs':>7} {'fsync ms':>8}  "
        f"{'device':<12} {'KiB/fsync':>9} {'flush/fsync':>11} {'KiB read/read':>13}"
    ]
    for r in recs:
        v, unit = headline(r)
        m = r["metrics"]
        res = "FAILED" if r["status"] else ("-" if v is None else f"{v:.2f} {unit}")
        lat = f"{m['fsync_lat_mean_us'] / 1000:.2f}" if "fsync_lat_mean_us" in m else "-"
        left = f"{r['label']:<20} {r['name']:<24} {res:>14} {m.get('fsyncs', '-'):>7} {lat:>8}"
        devs = r.get("per_fsync") or {k: None for k in r.get("devices", {})} or {"-": None}
        per_read = r.get("per_read") or {}
        for dev, pf in devs.items():
            kib = f"{pf['bytes_written'] / 1024:.1f}" if pf else "-"
            fl = f"{pf['flushes']:.2f}" if pf else "-"
            rd = f"{per_read[dev]['bytes_read'] / 1024:.1f}" if dev in per_read else "-"
            lines.append(f"{left}  {dev:<12} {kib:>9} {fl:>11} {rd:>13}")
            left = " " * len(left)
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--json", help="write all records to this file")
    a = ap.parse_args()
    recs = [r for d in a.dirs for r in parse_dir(d)]
    print(table(recs))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(recs, f, indent=1)
    return 1 if any(r["status"] or "error" in r for r in recs) else 0


if __name__ == "__main__":
    sys.exit(main())
