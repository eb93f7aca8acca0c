#!/usr/bin/env python3
"""The step-time model of docs/scaling.md: data-parallel ResNet-18 (CIFAR) at
O2 over N ranks, each with its own batch, the f16 gradients averaged by a
ring all-reduce in buckets, and what overlapping them with backward hides.

  scaling_model.py [--compute SECONDS] [--alpha SECONDS] [--check BLOCKING_S]

--compute: one rank's forward + backward + step for its batch (default 1.41 s:
  ResNet-18 O2, batch 64, one core of the machine docs/scaling.md describes);
--alpha: latency of one ring step (default 10 us);
--check: an all-reduce time measured at 2 ranks, to print the bandwidth it
  implies and the model's 2-rank prediction.
Prints the markdown tables of docs/scaling.md."""
import sys

# ResNet-18 for CIFAR-10: 11,173,962 parameters; at O2 the 9,600 batch-norm
# weights and biases stay f32, the rest is f16.
PARAMS, BN = 11173962, 9600
BYTES = 2 * (PARAMS - BN) + 4 * BN  # 22,366,324 bytes all-reduced per step
# The gradients backward finishes, in its order: each stage's share of the
# parameter bytes and of backward's time (the four stages do about equal
# FLOPs: each halves the planes and doubles the channels; the stem, 3 -> 64
# channels, is small).
STAGES = [  # (name, f16 parameters, share of backward time); they sum to PARAMS - BN
    ("linear + layer4", 5130 + 8388608, 0.25),
    ("layer3", 2097152, 0.25),
    ("layer2", 524288, 0.25),
    ("layer1 + stem", 147456 + 1728, 0.25),
]
BW = {"25 Gb/s": 25e9 / 8, "100 Gb/s": 100e9 / 8, "400 Gb/s": 400e9 / 8}


def ring(nbytes, n, bw, alpha):
    """Ring all-reduce of nbytes over n ranks: reduce-scatter and all-gather,
    2(n-1) steps of nbytes/n each."""
    if n < 2:
        return 0.0
    return 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * alpha


def exposed(n, bw, alpha, t_bwd, overlap):
    """Communication the step waits for after backward. Without overlap the
    whole all-reduce (ResNet-18's default buckets: one of 22.3 MB holds 99.8%
    of the bytes and is ready only when backward ends). With small buckets
    and a network that progresses on its own (NCCL, RDMA), each stage's
    buckets go out as soon as backward has finished them, one after another
    on the link; what is left when backward ends is exposed."""
    if not overlap:
        return ring(BYTES, n, bw, alpha)
    link_free, t = 0.0, 0.0
    for _name, p, share in STAGES:
        t += share * t_bwd  # this stage's gradients are final
        link_free = max(link_free, t) + ring(2 * p, n, bw, alpha)
    link_free += ring(4 * BN, n, bw, alpha)  # the f32 batch-norm bucket, last
    return max(0.0, link_free - t_bwd)


def table(compute, alpha, overlap):
    t_bwd = compute * 2 / 3  # backward: two matrix products per forward one
    rows = []
    head = "| ranks | " + " | ".join(BW) + " |"
    rows.append(head)
    rows.append("|" + "---|" * (len(BW) + 1))
    for n in (2, 8, 64, 512):
        cells = []
        for bw in BW.values():
            e = exposed(n, bw, alpha, t_bwd, overlap)
            cells.append("%.1f%% (%.1f ms)" % (100 * compute / (compute + e), 1e3 * e))
        rows.append("| %d | %s |" % (n, " | ".join(cells)))
    return "\n".join(rows)


def main():
    args = sys.argv[1:]
    compute, alpha, check = 1.41, 10e-6, None
    while args:
        k = args.pop(0)
        if k == "--compute":
            compute = float(args.pop(0))
        elif k == "--alpha":
            alpha = float(args.pop(0))
        elif k == "--check":
            check = float(args.pop(0))
        else:
            raise SystemExit(__doc__)
    print("bytes all-reduced per step: %d (%.2f MB)" % (BYTES, BYTES / 1e6))
    for name, bw in BW.items():
        print("ring all-reduce, %s, ranks -> infinity: %.2f ms (+ 2(N-1) x %.0f us latency)" % (name, 2 * BYTES / bw * 1e3, alpha * 1e6))
    for overlap in (False, True):
        print("\ncompute %.3f s a step, %s: scaling efficiency (exposed communication)" %
              (compute, "small buckets overlapped with backward" if overlap else "no overlap"))
        print(table(compute, alpha, overlap))
    if check:
        bw = BYTES / check  # 2(N-1)/N = 1 at N = 2
        print("\nmeasured at 2 ranks: all-reduce %.1f ms -> %.2f GB/s (%.1f Gb/s) of bus bandwidth; the model's 2-rank step: %.3f s "
              "(%.1f%% of one rank's %.3f s)" % (check * 1e3, bw / 1e9, bw * 8 / 1e9, compute + check, 100 * compute / (compute + check), compute))


if __name__ == "__main__":
    main()
