#!/usr/bin/env python3
"""Compares the tensors of two safetensors files (weights saved by
`ampc train --save`, or checkpoints) without torch.

  mpi_compare.py A B [--tol X] [--exact] [--only PREFIX]

Prints one line: the largest difference over the largest magnitude of each
tensor, the worst tensor, and whether every tensor is bit-identical. Exits 1
when a tensor is missing or of another shape, or (--exact) not
bit-identical, or (--tol) the worst relative difference is above X."""
import json
import math
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = data[a:b]
        dt = t["dtype"]
        if dt == "F32":
            vals = struct.unpack("<%df" % (len(raw) // 4), raw)
        elif dt == "F16":
            vals = struct.unpack("<%de" % (len(raw) // 2), raw)
        elif dt == "BF16":
            vals = [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
        elif dt == "I64":
            vals = struct.unpack("<%dq" % (len(raw) // 8), raw)
        elif dt == "I32":
            vals = struct.unpack("<%di" % (len(raw) // 4), raw)
        else:
            raise SystemExit("%s: tensor %s of unknown dtype %s" % (path, name, dt))
        out[name] = (tuple(t["shape"]), raw, vals)
    return out


def main():
    args = sys.argv[1:]
    tol, exact, only = None, False, ""
    files = []
    i = 0
    while i < len(args):
        if args[i] == "--tol":
            tol = float(args[i + 1])
            i += 2
        elif args[i] == "--exact":
            exact = True
            i += 1
        elif args[i] == "--only":
            only = args[i + 1]
            i += 2
        else:
            files.append(args[i])
            i += 1
    if len(files) != 2:
        raise SystemExit(__doc__)
    a, b = load(files[0]), load(files[1])
    names = sorted(n for n in a if n.startswith(only))
    worst, worst_name, identical = 0.0, "", True
    for n in names:
        if n not in b or a[n][0] != b[n][0]:
            print("tensor %s missing or of another shape in %s" % (n, files[1]))
            return 1
        identical &= a[n][1] == b[n][1]
        va, vb = a[n][2], b[n][2]
        scale = max((abs(x) for x in va), default=0.0) or 1.0
        d = max((abs(x - y) for x, y in zip(va, vb)), default=0.0)
        if not all(math.isfinite(x) for x in vb):
            d = math.inf
        if d / scale > worst or not worst_name:
            worst, worst_name = d / scale, n
    print("%d tensors: max |a - b| / max |a| = %.3g (%s)%s" % (len(names), worst, worst_name, ", bit-identical" if identical else ""))
    if exact and not identical:
        return 1
    if tol is not None and not worst <= tol:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
