#!/usr/bin/env python3
"""How far from exact a 3x3 convolution's outputs are in each way of running it
with 16-bit values: ampc O2's (Winograd F(4x4, 3x3) in f32 on f16 or bf16
storage), PyTorch's bf16 autocast (bf16 inputs, exact products summed in f32,
a bf16 output), the bf16 products ampc does not use (F(4x4) or F(2x2) with
the transformed inputs and weights rounded to bf16, as a bf16 dot product
instruction such as vdpbf16ps would take them), and larger tiles in f32 on
f16 storage (F(6x6, 3x3), F(8x8, 3x3): fewer products an output, more
rounding in the transforms).

Two figures for each: the median over the outputs of |y - exact|, and the
root mean square of y - exact, each divided by the exact outputs' root mean
square, where exact is the float64 convolution of the unrounded inputs
(post-ReLU activations, He-initialised weights). The two differ where the
error is heavy-tailed: F(8x8)'s median error is small, but a few of its
tile's outputs (those its output transform scales by up to 128) carry most
of its root mean square. The
larger tiles' matrices are made here by the Toom-Cook construction from
their interpolation points (exact rational arithmetic), and checked against
a direct 1-D correlation. numpy only; seconds on one core.

usage: bench/winograd_error.py [--seed N]
"""
import argparse
from fractions import Fraction

import numpy as np


def to_bf16(a):
    """Rounds float32 values to bf16 (nearest, ties to even), as float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return r.view(np.float32)


def to_f16(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


def keep(a):
    return np.asarray(a, np.float32)


# Lavin and Gray's matrices: F(4x4, 3x3) on the points 0, +-1, +-2, inf; F(2x2, 3x3) on 0, +-1, inf.
BT4 = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float32)
G4 = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
               [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float32)
AT4 = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], np.float32)
BT2 = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float32)
G2 = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], np.float32)
AT2 = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float32)


def toom_cook(m, points):
    """AT (m x n), G (n x 3), BT (n x n) of F(m, 3) on the given finite
    points and infinity (n = m + 2), as float32; the same construction gives
    Lavin and Gray's F(4x4) matrices from 0, 1, -1, 2, -2."""
    p = [Fraction(x) for x in points]
    n = m + 2
    assert len(p) == n - 1

    def mul(a, b):
        r = [Fraction(0)] * (len(a) + len(b) - 1)
        for i, x in enumerate(a):
            for j, y in enumerate(b):
                r[i + j] += x * y
        return r

    AT = [[q ** i for q in p] + [Fraction(int(i == m - 1))] for i in range(m)]
    G = []
    for q in p:
        f = Fraction(1)
        for o in p:
            if o != q:
                f *= q - o
        G.append([q ** k / f for k in range(3)])
    G.append([Fraction(0), Fraction(0), Fraction(1)])
    BT = []
    for q in p:
        row = [Fraction(1)]
        for o in p:
            if o != q:
                row = mul(row, [-o, Fraction(1)])
        BT.append(row + [Fraction(0)])
    full = [Fraction(1)]
    for o in p:
        full = mul(full, [-o, Fraction(1)])
    BT.append(full)
    mats = [np.array([[float(v) for v in row] for row in M]) for M in (AT, G, BT)]
    # check: a 1-D correlation of n inputs with 3 weights, exact in float64
    rng = np.random.default_rng(1)
    d, g = rng.standard_normal(n), rng.standard_normal(3)
    y = mats[0] @ ((mats[1] @ g) * (mats[2] @ d))
    assert np.allclose(y, [d[i:i + 3] @ g for i in range(m)]), "Toom-Cook matrices do not correlate"
    return [M.astype(np.float32) for M in mats]


def winograd(x, w, m, product_rounding, mats=None):
    """Stride 1, pad 1, in float32 throughout; the transformed inputs and
    weights pass through product_rounding before the products. mats: (AT,
    G, BT) of F(m, 3), else Lavin and Gray's F(4x4) or F(2x2)."""
    if mats is not None:
        AT, G, BT = mats
    else:
        BT, G, AT = (BT4, G4, AT4) if m == 4 else (BT2, G2, AT2)
    N, C, H, W = x.shape
    a = m + 2
    th, tw = -(-H // m), -(-W // m)
    xp = np.zeros((N, C, th * m + 2, tw * m + 2), np.float32)
    xp[:, :, 1:H + 1, 1:W + 1] = x
    # every tile at once: (N, C, th, tw, a, a)
    s = xp.strides
    tiles = np.lib.stride_tricks.as_strided(xp, (N, C, th, tw, a, a), (s[0], s[1], m * s[2], m * s[3], s[2], s[3]))
    V = product_rounding(np.einsum('ij,nctujk,lk->ntuilc', BT, tiles, BT, optimize=True))
    U = product_rounding(np.einsum('ij,ocjk,lk->ilco', G, w.astype(np.float32), G, optimize=True))
    M = np.einsum('ntuilc,ilco->ntuilo', V, U, optimize=True).astype(np.float32)  # summed in f32
    Y = np.einsum('ij,ntujko,lk->notiul', AT, M, AT, optimize=True)
    return Y.reshape(N, -1, th * m, tw * m)[:, :, :H, :W]


def direct(x, w, dtype):
    """The convolution as a sum of 9C products per output, in dtype."""
    N, C, H, W = x.shape
    xp = np.zeros((N, C, H + 2, W + 2), dtype)
    xp[:, :, 1:H + 1, 1:W + 1] = x
    y = np.zeros((N, w.shape[0], H, W), dtype)
    for ky in range(3):
        for kx in range(3):
            y += np.einsum('nchw,oc->nohw', xp[:, :, ky:ky + H, kx:kx + W], w[:, :, ky, kx].astype(dtype), optimize=True)
    return y


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    global F6, F8
    F6 = toom_cook(6, [0, 1, -1, 2, -2, Fraction(1, 2), Fraction(-1, 2)])
    F8 = toom_cook(8, [0, 1, -1, 2, -2, Fraction(1, 2), Fraction(-1, 2), Fraction(1, 4), Fraction(-1, 4)])
    ways = [
        ("ampc O2, f16 (F(4x4) in f32)", to_f16, lambda x, w: winograd(x, w, 4, keep), to_f16),
        ("ampc O2 --half bf16 (F(4x4) in f32)", to_bf16, lambda x, w: winograd(x, w, 4, keep), to_bf16),
        ("PyTorch bf16 autocast (exact products)", to_bf16, lambda x, w: direct(x, w, np.float64), to_bf16),
        ("F(4x4), bf16 products, f16 storage", to_f16, lambda x, w: winograd(x, w, 4, to_bf16), to_f16),
        ("F(4x4), bf16 products, bf16 storage", to_bf16, lambda x, w: winograd(x, w, 4, to_bf16), to_bf16),
        ("F(2x2), bf16 products, bf16 storage", to_bf16, lambda x, w: winograd(x, w, 2, to_bf16), to_bf16),
        ("F(6x6) in f32, f16 (0 +-1 +-2 +-1/2)", to_f16, lambda x, w: winograd(x, w, 6, keep, F6), to_f16),
        ("F(8x8) in f32, f16 (0 +-1 +-2 +-1/2 +-1/4)", to_f16, lambda x, w: winograd(x, w, 8, keep, F8), to_f16),
        ("F(8x8) in f32, f16, before the f16 output", to_f16, lambda x, w: winograd(x, w, 8, keep, F8), keep),
    ]
    print("a 3x3 convolution's outputs against float64: median |error| and rms error, over rms(exact);")
    print("in brackets, as multiples of ampc O2's")
    for (N, C, H, O) in [(8, 32, 14, 64), (8, 64, 32, 64), (8, 128, 16, 128), (8, 256, 8, 256), (8, 512, 4, 512)]:
        x = np.maximum(rng.standard_normal((N, C, H, H)), 0)
        w = rng.standard_normal((O, C, 3, 3)) * np.sqrt(2.0 / (9 * C))
        exact = direct(x, w, np.float64)
        rms = np.sqrt(np.mean(exact ** 2))
        print(f"{C} -> {O} channels, {H}x{H}, batch {N}:")
        base = None
        for name, store, conv, out in ways:
            y = out(conv(store(x), store(w)))
            e = float(np.median(np.abs(y - exact)) / rms)
            r = float(np.sqrt(np.mean((y - exact) ** 2)) / rms)
            base = (e, r) if base is None else base
            print(f"  {name:44s} median {e:.2e} ({e / base[0]:5.2f}x)  rms {r:.2e} ({r / base[1]:5.2f}x)")


if __name__ == "__main__":
    main()
