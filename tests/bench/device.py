#!/usr/bin/env python3
"""Device benchmark: the appliance's NVMe and virtio-blk drivers against Linux's, on the
same emulated devices (`make bench-dev`).

1. The appliance boots with `bench=dev` and runs the workloads of the guest's fio job
   (kernel/src/bench/device.rs) on a 4 GiB NVMe disk and a 4 GiB virtio-blk disk.
2. The Linux client guest runs tests/guest/devbench (fio, tests/guest/job/devbench.sh)
   on the same two kinds of disk: same QEMU machine (-M q35 -cpu max, 1 GiB), same
   -drive/-device options, same sparse backing files with cache=writeback.
3. The results are paired: build/bench/device.json holds one record per device and
   workload, {"device", "workload", "appliance", "linux", "unit", "ratio"}, where ratio =
   appliance / linux for throughput and linux / appliance for latency, so higher is
   better everywhere; a table is printed.

Usage: tests/bench/device.py [--runtime SECONDS] [--out DIR] [--linux-results DIR]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
IMAGE = os.path.join(ROOT, "build", "appliance.elf")
DEVBENCH = os.path.join(ROOT, "tests", "guest", "devbench")

# The guest runner's disks (tests/guest/devbench): size, cache mode, serials.
DISK_SIZE = 4 << 30
CACHE = "writeback"
DEVICES = [("nvme", "nvme"), ("virtio-blk", "vblk")]  # (appliance name, guest serial)

# workload -> (unit, appliance metric, how to get Linux's from results.py metrics, latency?)
WORKLOADS = {
    "randwrite-4k-qd1": ("IOPS", "iops", lambda m: m["write_iops"], False),
    "randwrite-4k-qd32": ("IOPS", "iops", lambda m: m["write_iops"], False),
    "write-128k": ("MiB/s", "mib_s", lambda m: m["write_mib_s"], False),
    # fio's iops of a psync job with fdatasync=1 counts write + fdatasync iterations.
    "write-flush-4k": ("us per write+flush", "iteration_us", lambda m: 1e6 / m["write_iops"], True),
}

# The appliance's `bench_result` events (kernel/src/event.rs): one per workload, on its
# event channel (the second serial port, a file here).
RESULT = re.compile(r'^EVENT (\{"event":"bench_result",.*\})$')


def qemu_disk_args(disks):
    """-drive/-device options exactly as tests/guest/guestvm.py builds them."""
    args = []
    for i, (kind, path, serial) in enumerate(disks):
        args += ["-drive", f"file={path},if=none,id=d{i},format=raw,cache={CACHE}"]
        if kind == "nvme":
            args += ["-device", f"nvme,drive=d{i},serial={serial}"]
        else:
            args += ["-device", f"virtio-blk-pci,drive=d{i},serial={serial},disable-legacy=on"]
    return args


def run_appliance(runtime, out, extra_append=""):
    """Boots the appliance with bench=dev; returns {(device, workload): record}."""
    with tempfile.TemporaryDirectory(dir=os.path.join(ROOT, "build")) as tmp:
        disks = []
        for name, serial in DEVICES:
            path = os.path.join(tmp, f"{serial}.img")
            with open(path, "wb") as f:
                f.truncate(DISK_SIZE)
            disks.append(("nvme" if name == "nvme" else "virtio-blk", path, serial))
        limit = 60 + 8 * runtime * len(WORKLOADS) * len(DEVICES)
        os.makedirs(out, exist_ok=True)
        events = os.path.join(out, "appliance-events.log")
        open(events, "w").close()
        cmd = [
            "timeout", str(limit),
            "qemu-system-x86_64", "-nodefaults", "-no-user-config", "-display", "none",
            "-no-reboot", "-accel", "tcg", "-cpu", "max", "-M", "q35", "-m", "1G",
            "-smp", "1", "-serial", "stdio", "-serial", f"file:{events}", "-monitor", "none",
            "-device", "isa-debug-exit,iobase=0xf4,iosize=4",
            "-kernel", IMAGE,
            "-append", f"bench=dev benchtime={runtime} {extra_append}".strip(),
            *qemu_disk_args(disks),
        ]  # fmt: skip
        print("bench-dev: appliance:", " ".join(cmd), flush=True)
        started = time.monotonic()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        log = proc.stdout.decode(errors="replace").replace("\r", "")
    with open(os.path.join(out, "appliance.log"), "w") as f:
        f.write(log)
    print(f"bench-dev: appliance done in {time.monotonic() - started:.0f} s "
          f"(QEMU status {proc.returncode}; log {out}/appliance.log, events {events})", flush=True)
    results = {}
    with open(events, errors="replace") as f:
        event_lines = f.read().replace("\r", "").splitlines()
    for line in event_lines:
        m = RESULT.search(line)
        if m:
            r = json.loads(m.group(1))
            results[(r["device"], r["workload"])] = r
    if proc.returncode != 33 or not results:
        sys.exit(f"bench-dev: the appliance run failed (status {proc.returncode})")
    return results


def run_linux(runtime, out):
    """Runs the guest's device benchmark; returns {(device, workload): metrics}."""
    linux_out = os.path.join(out, "linux")
    shutil.rmtree(linux_out, ignore_errors=True)
    env = dict(os.environ, NF_RUNTIME=str(runtime))
    print(f"bench-dev: Linux guest: {DEVBENCH} {linux_out}", flush=True)
    started = time.monotonic()
    subprocess.run([DEVBENCH, linux_out], env=env, check=True)
    print(f"bench-dev: Linux done in {time.monotonic() - started:.0f} s", flush=True)
    return read_linux(linux_out)


def read_linux(linux_out):
    with open(os.path.join(linux_out, "results.json")) as f:
        recs = json.load(f)
    serials = {serial: name for name, serial in DEVICES}
    results = {}
    for r in recs:
        serial, _, workload = r["name"].partition("-")
        if serial in serials and workload in WORKLOADS and not r["status"]:
            results[(serials[serial], workload)] = r["metrics"]
    return results


def pair(appliance, linux):
    rows = []
    for device, _ in DEVICES:
        for workload, (unit, key, linux_value, latency) in WORKLOADS.items():
            a = appliance.get((device, workload), {}).get(key)
            m = linux.get((device, workload))
            lv = linux_value(m) if m else None
            ratio = None
            if a and lv:
                ratio = lv / a if latency else a / lv
            rows.append({
                "device": device,
                "workload": workload,
                "appliance": round(a, 1) if a is not None else None,
                "linux": round(lv, 1) if lv is not None else None,
                "unit": unit,
                "ratio": round(ratio, 2) if ratio is not None else None,
            })  # fmt: skip
    return rows


def table(rows):
    lines = [
        f"{'device':<11} {'workload':<18} {'appliance':>10} {'linux':>10}  {'unit':<19} {'ratio':>6}",
    ]
    for r in rows:
        fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(
            f"{r['device']:<11} {r['workload']:<18} {fmt(r['appliance']):>10} "
            f"{fmt(r['linux']):>10}  {r['unit']:<19} {ratio:>6}"
        )
    lines.append("ratio: appliance/linux for IOPS and MiB/s, linux/appliance for latency "
                 "(higher is better everywhere)")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtime", type=int, default=int(os.environ.get("NF_RUNTIME", 10)),
                    help="seconds per workload (default 10, or $NF_RUNTIME)")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench"))
    ap.add_argument("--linux-results", metavar="DIR",
                    help="reuse a devbench results directory instead of running the guest")
    ap.add_argument("--append", default="", help="extra appliance command-line options")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if not os.path.exists(IMAGE):
        sys.exit(f"bench-dev: {IMAGE} missing: run `make image`")
    appliance = run_appliance(a.runtime, a.out, a.append)
    linux = read_linux(a.linux_results) if a.linux_results else run_linux(a.runtime, a.out)
    rows = pair(appliance, linux)
    with open(os.path.join(a.out, "device.json"), "w") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")
    print(table(rows))
    print(f"bench-dev: wrote {os.path.join(a.out, 'device.json')}")
    return 0 if all(r["ratio"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
