#!/usr/bin/env python3
"""Build helpers for the Linux guest (called by build-guest).

Subcommands:
  layer    copy the FILEs of one packages.txt layer from the extracted packages (the
           "sysroot") into a root-filesystem directory, with the shared-library closure
           of every ELF file among them (flattened into /usr/lib/x86_64-linux-gnu)
  vmlinux  extract the uncompressed ELF kernel from Debian's bzImage and check that it
           carries the PVH entry note QEMU's -kernel needs to boot it directly
"""

import argparse
import lzma
import os
import shutil
import subprocess
import sys

# Where the packages put shared libraries; the guest gets them all in one directory,
# which the dynamic loader searches by default (so no ld.so.cache is needed).
LIB_DIRS = [
    "lib/x86_64-linux-gnu",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/x86_64-linux-gnu/ceph",  # librbd's RUNPATH
    "lib",
    "usr/lib",
]
GUEST_LIB_DIR = "usr/lib/x86_64-linux-gnu"
INTERP = "lib64/ld-linux-x86-64.so.2"
# Loaded with dlopen by glibc (thread cancellation / unwinding), so no NEEDED names it.
ALWAYS_LIBS = ["libgcc_s.so.1"]


def die(msg):
    print(f"guestbuild: {msg}", file=sys.stderr)
    sys.exit(1)


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def needed(path):
    """The DT_NEEDED sonames of an ELF file."""
    out = subprocess.run(
        ["readelf", "-dW", path], capture_output=True, text=True, check=True
    ).stdout
    return [
        line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines() if "(NEEDED)" in line
    ]


def find_lib(sysroot, soname):
    for d in LIB_DIRS:
        p = os.path.join(sysroot, d, soname)
        if os.path.lexists(p):
            return p
    return None


def resolve(sysroot, path):
    """Resolve a path inside the sysroot, following absolute symlinks within it."""
    for _ in range(40):
        if not os.path.islink(path):
            return path
        target = os.readlink(path)
        if target.startswith("/"):
            path = os.path.join(sysroot, target.lstrip("/"))
        else:
            path = os.path.join(os.path.dirname(path), target)
    die(f"symlink loop at {path}")


def copy_file(src, dst):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy2(src, dst)


def cmd_layer(args):
    sysroot, out = args.sysroot, args.out
    files = []
    with open(args.packages) as f:
        for line in f:
            cols = line.split("#", 1)[0].split()
            if len(cols) >= 2 and cols[0] == args.layer:
                files += cols[2:]
    skip = set()
    for d in args.skip or []:
        libdir = os.path.join(d, GUEST_LIB_DIR)
        if os.path.isdir(libdir):
            skip.update(os.listdir(libdir))

    elves = []
    for rel in files:
        src = resolve(sysroot, os.path.join(sysroot, rel))
        if not os.path.exists(src):
            die(f"{rel}: not in the extracted packages")
        dst = os.path.join(out, rel)
        copy_file(src, dst)
        if is_elf(src):
            elves.append(src)

    # Shared-library closure, breadth first over DT_NEEDED.
    libs = {name: None for name in ALWAYS_LIBS}
    todo = list(elves) + [find_lib(sysroot, n) for n in ALWAYS_LIBS]
    missing = []
    while todo:
        obj = todo.pop()
        if obj is None:
            continue
        for soname in needed(resolve(sysroot, obj)):
            if soname in libs:
                continue
            p = find_lib(sysroot, soname)
            libs[soname] = p
            if p is None:
                missing.append(f"{soname} (needed by {os.path.relpath(obj, sysroot)})")
            else:
                todo.append(p)
    if missing:
        die("libraries not found in the downloaded packages:\n  " + "\n  ".join(missing))

    copied = 0
    for soname in sorted(libs):
        if soname in skip:
            continue
        src = resolve(sysroot, libs[soname] or find_lib(sysroot, soname))
        if soname == os.path.basename(INTERP):
            copy_file(src, os.path.join(out, INTERP))
        copy_file(src, os.path.join(out, GUEST_LIB_DIR, soname))
        copied += 1
    print(f"layer {args.layer}: {len(files)} files, {copied} libraries")


XEN_ELFNOTE_PHYS32_ENTRY = 0x12


def has_pvh_note(path):
    out = subprocess.run(
        ["readelf", "-nW", path], capture_output=True, text=True, check=True
    ).stdout
    return any(
        line.split()[0] == "Xen" and f"(0x{XEN_ELFNOTE_PHYS32_ENTRY:08x})" in line
        for line in out.splitlines()
        if line.strip()
    )


def cmd_vmlinux(args):
    data = open(args.bzimage, "rb").read()
    # Debian builds with CONFIG_KERNEL_XZ: the payload is one xz stream in the bzImage.
    start = data.find(b"\xfd7zXZ\x00")
    if start < 0:
        die(f"{args.bzimage}: no xz-compressed payload found")
    elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[start:])
    if elf[:4] != b"\x7fELF":
        die(f"{args.bzimage}: payload is not an ELF image")
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(elf)
    if not has_pvh_note(tmp):
        os.unlink(tmp)
        print("vmlinux has no PVH entry note", file=sys.stderr)
        sys.exit(2)
    os.replace(tmp, args.out)
    print(f"vmlinux: {len(elf) // 1024} KiB, PVH entry note present")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("layer")
    p.add_argument("--sysroot", required=True)
    p.add_argument("--packages", required=True)
    p.add_argument("--layer", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--skip", action="append", help="layer dir whose libraries to omit")
    p.set_defaults(fn=cmd_layer)
    p = sub.add_parser("vmlinux")
    p.add_argument("bzimage")
    p.add_argument("out")
    p.set_defaults(fn=cmd_vmlinux)
    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
