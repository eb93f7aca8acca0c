#!/usr/bin/env python3
"""Writes the seed corpora under tests/fuzz/corpus/<target>/ (standard library
only; the files are committed, this script is how they were made).

Each target's seeds are a few small valid inputs and a few that are broken in
one place, in the input layouts the fuzz_<target>.c files describe."""
import gzip
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- IDX: [split u16][train|limit<<1][loader] images labels -------------

def idx_images(n, h, w, magic=0x803):
    pix = bytes((i * 37 + 11) % 256 for i in range(n * h * w))
    return struct.pack(">IIII", magic, n, h, w) + pix


def idx_labels(labels, magic=0x801):
    return struct.pack(">II", magic, len(labels)) + bytes(labels)


def idx_seed(name, images, labels, train=1, limit=0, loader=0):
    put("idx", name, struct.pack("<H", len(images)) + bytes([train | limit << 1, loader])
        + images + labels)


def gz(b):
    return gzip.compress(b, compresslevel=9, mtime=0)


def make_idx():
    im, lb = idx_images(3, 4, 4), idx_labels([0, 9, 5])
    idx_seed("valid_3x4x4", im, lb)
    idx_seed("valid_test_limit2", im, lb, train=0, limit=2, loader=0x5d)
    idx_seed("valid_28x28", idx_images(2, 28, 28), idx_labels([1, 2]), loader=0x32)
    idx_seed("valid_1x1x40", idx_images(1, 1, 40), idx_labels([7]), loader=0x3e)
    idx_seed("gzip_both", gz(im), gz(lb), loader=0x41)
    g = bytearray(gz(im))
    g[-5] ^= 0x40  # the trailer's length field
    idx_seed("gzip_bad_trailer", bytes(g), lb)
    idx_seed("gzip_truncated", gz(im)[:-12], lb)
    idx_seed("bad_magic", idx_images(3, 4, 4, magic=0x804), lb)
    idx_seed("labels_bad_magic", im, idx_labels([0, 1, 2], magic=0x803))
    idx_seed("truncated_header", im[:10], lb)
    idx_seed("truncated_images", im[:-5], lb)
    idx_seed("trailing_data", im + b"\0", lb)
    idx_seed("label_out_of_range", im, idx_labels([0, 10, 1]))
    idx_seed("count_mismatch", im, idx_labels([0, 1]))
    idx_seed("zero_dim", struct.pack(">IIII", 0x803, 3, 0, 4), lb)
    idx_seed("huge_claim", struct.pack(">IIII", 0x803, 1 << 20, 64, 16), idx_labels([1] * 4))


# ---- pair: train images/labels headers, test images/labels headers,
# [gzip test|cut train<<1|cut test<<2|test limit<<3][loader] labels ------

def pair_seed(name, train, test, flags=0, loader=0, labels=b""):
    (n1, h1, w1), (n2, h2, w2) = train, test
    put("pair", name, struct.pack(">IIIIII", 0x803, n1, h1, w1, 0x801, n1)
        + struct.pack(">IIIIII", 0x803, n2, h2, w2, 0x801, n2) + bytes([flags, loader]) + labels)


def make_pair():
    pair_seed("same_4x4", (3, 4, 4), (2, 4, 4), loader=0x31)
    pair_seed("same_28x28_limit1", (2, 28, 28), (3, 28, 28), flags=1 << 3, loader=0x46)
    pair_seed("same_gzip_test", (2, 5, 3), (2, 5, 3), flags=1, loader=0x02)
    pair_seed("test_32_train_28", (2, 28, 28), (2, 32, 32))
    pair_seed("test_1000x1000", (1, 28, 28), (1, 1000, 1000))
    pair_seed("test_taller", (2, 4, 4), (2, 5, 4), flags=1)
    pair_seed("test_wider_1x40", (2, 1, 4), (2, 1, 40))
    pair_seed("train_cut", (2, 4, 4), (2, 4, 4), flags=2)
    pair_seed("test_cut_gzip", (2, 4, 4), (2, 4, 4), flags=5)
    pair_seed("label_out_of_range", (2, 4, 4), (2, 4, 4), labels=bytes([3, 12]))


# The checkpoint target's seeds (corpus/checkpoint/from<k>_into<m>) are real
# checkpoint headers, written by the target itself from its own models:
#   AMPC_FUZZ_WRITE_SEEDS=tests/fuzz/corpus/checkpoint build-fuzz/tests/fuzz/fuzz_checkpoint


# ---- CIFAR: [c100|train<<1|limit<<2][loader] file ----------------------

def cifar_record(label, c100=False, coarse=3, seed=0):
    pix = bytes((i * 13 + seed * 7) % 256 for i in range(3072))
    return (bytes([coarse, label]) if c100 else bytes([label])) + pix


def cifar_seed(name, body, c100=0, train=0, limit=0, loader=0):
    put("cifar", name, bytes([c100 | train << 1 | limit << 2, loader]) + body)


def make_cifar():
    r0, r1 = cifar_record(3), cifar_record(9, seed=1)
    cifar_seed("c10_test_1", r0, loader=0x4d)
    cifar_seed("c10_test_2", r0 + r1, loader=0x3a)
    cifar_seed("c10_train_limit3", r0 + r1, train=1, limit=3, loader=0x46)
    cifar_seed("c100_test_1", cifar_record(42, c100=True), c100=1, loader=0x02)
    cifar_seed("c100_train_1", cifar_record(99, c100=True, coarse=19), c100=1, train=1)
    cifar_seed("c10_partial_record", r0 + r1[:1000])
    cifar_seed("c10_label_out_of_range", cifar_record(10))
    cifar_seed("c100_coarse_out_of_range", cifar_record(5, c100=True, coarse=20), c100=1)
    cifar_seed("c10_empty", b"")


# ---- safetensors: the file itself ---------------------------------------

def st(header, data=b"", pad_to=8, raw_header=None):
    h = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((pad_to - (8 + len(h)) % pad_to) % pad_to)
    return struct.pack("<Q", len(h)) + h + data


def t(dtype, shape, b, e):
    return {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}


def make_safetensors():
    f32 = struct.pack("<6f", 1, -2, 3.5, 0, 1e30, -1e-30)
    put("safetensors", "valid_f32", st({"w": t("F32", [2, 3], 0, 24)}, f32))
    put("safetensors", "valid_mixed", st({
        "__metadata__": {"format": "pt", "model": "cnn"},
        "a.f16": t("F16", [2], 0, 4), "b.bf16": t("BF16", [2], 4, 8),
        "c.f64": t("F64", [1], 8, 16), "d.i64": t("I64", [1], 16, 24),
        "e.i32": t("I32", [], 24, 28), "f.i16": t("I16", [1], 28, 30),
        "g.i8": t("I8", [1], 30, 31), "h.u8": t("U8", [1], 31, 32),
        "i.bool": t("BOOL", [0, 4], 32, 32)},
        struct.pack("<2e", 1.5, -0.25) + b"\x80\x3f\x00\xc0" + struct.pack("<d", 2.5)
        + struct.pack("<q", -7) + struct.pack("<i", 42) + struct.pack("<h", -3) + b"\xfe\x07"))
    put("safetensors", "valid_unordered", st({"b": t("U8", [2], 2, 4), "a": t("U8", [2], 0, 2)},
                                             b"\1\2\3\4"))
    put("safetensors", "valid_metadata_null", st({"__metadata__": None, "x": t("U8", [1], 0, 1)},
                                                 b"\5"))
    put("safetensors", "empty_header", st({}))
    put("safetensors", "f64_too_big", st({"x": t("F64", [1], 0, 8)}, struct.pack("<d", 1e300)))
    put("safetensors", "i64_too_big", st({"x": t("I64", [1], 0, 8)}, struct.pack("<q", 1 << 40)))
    fixture = os.path.join(HERE, "..", "fixtures", "tiny.safetensors")
    if os.path.exists(fixture):
        with open(fixture, "rb") as f:
            put("safetensors", "fixture_tiny", f.read())
    # broken in one place each
    put("safetensors", "header_past_end", struct.pack("<Q", 1000) + b'{"x":1}')
    put("safetensors", "short_file", b"\x02\0\0")
    put("safetensors", "bad_json", st(None, raw_header=b'{"w":{"dtype":"F32",'))
    put("safetensors", "not_object", st([1, 2]))
    put("safetensors", "unknown_dtype", st({"w": t("F33", [1], 0, 4)}, b"\0" * 4))
    put("safetensors", "unsupported_f8", st({"w": t("F8_E4M3", [4], 0, 4)}, b"\0" * 4))
    put("safetensors", "overlap", st({"a": t("F32", [2], 0, 8), "b": t("F32", [2], 4, 12)},
                                     b"\0" * 12))
    put("safetensors", "gap", st({"a": t("F32", [1], 0, 4), "b": t("F32", [1], 8, 12)}, b"\0" * 12))
    put("safetensors", "size_mismatch", st({"a": t("F32", [3], 0, 8)}, b"\0" * 8))
    put("safetensors", "negative_dim", st({"a": t("F32", [-1], 0, 4)}, b"\0" * 4))
    put("safetensors", "nine_dims", st({"a": t("U8", [1] * 9, 0, 1)}, b"\0"))
    put("safetensors", "shape_overflow", st({"a": t("F32", [1 << 62, 4], 0, 4)}, b"\0" * 4))
    put("safetensors", "trailing_bytes", st({"a": t("U8", [1], 0, 1)}, b"\0\0"))
    put("safetensors", "duplicate_name", st(None, raw_header=b'{"a":{"dtype":"U8","shape":[1],'
                                            b'"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],'
                                            b'"data_offsets":[1,2]}}', data=b"\0\0"))
    put("safetensors", "metadata_not_string", st({"__metadata__": {"k": 1}}))
    put("safetensors", "offsets_reversed", st({"a": t("U8", [0], 1, 0)}, b"\0"))
    put("safetensors", "bad_utf8_name", st(None, raw_header=b'{"\xff":{"dtype":"U8","shape":[1],'
                                           b'"data_offsets":[0,1]}}', data=b"\0"))


# ---- CLI: argv[1..] joined by NUL bytes ---------------------------------

def make_cli():
    seeds = {
        "defaults": [],
        "typical": ["--model", "cnn", "--epochs", "2", "--opt-level", "O2", "--lr", "0.01",
                    "--batch-size", "64", "--train-limit", "100"],
        "equals": ["--epochs=3", "--half=bf16", "--loss-scale=dynamic", "--seed=7"],
        "sgd_step": ["--optimizer", "sgd", "--momentum", "0.9", "--nesterov", "--lr-schedule",
                     "step", "--step-size", "2", "--gamma", "0.5", "--warmup", "1"],
        "cosine": ["--optimizer", "adamw", "--lr-schedule", "cosine", "--eta-min", "1e-5",
                   "--weight-decay", "0.05", "--amsgrad", "--beta1", "0.8"],
        "amp_overrides": ["--opt-level", "O1", "--loss-scale", "128", "--min-loss-scale", "1",
                          "--max-loss-scale", "65536", "--scale-window", "100",
                          "--hysteresis", "2", "--keep-batchnorm-fp32", "on"],
        "o3_master": ["--opt-level", "O3", "--master-weights", "on", "--stochastic-rounding"],
        "onoff": ["--augment", "off", "--normalize", "1", "--quiet", "--amp-report",
                  "--grad-accum", "4", "--clip-grad-norm", "1.0"],
        "checkpoints": ["--checkpoint-dir", "ck", "--save-every", "10", "--keep", "2",
                        "--on-nonfinite", "skip", "--resume", "ck"],
        "help": ["--help"],
        "bad_int": ["--epochs", "abc"],
        "negative": ["--epochs", "-1"],
        "missing_value": ["--lr"],
        "unknown": ["--nosuch", "1"],
        "positional": ["train"],
        "flag_value": ["--quiet=1"],
        "empty_string": ["--model", ""],
        "bad_level": ["--opt-level", "O5", "--half", "f8"],
        "huge": ["--batch-size", "99999999999999999999", "--lr", "1e999"],
    }
    for name, args in seeds.items():
        put("cli", name, b"\0".join(a.encode() for a in args))


# ---- report: one metrics file, or two separated by a form feed -----------

def make_report():
    # a real run's records (ampc train --metrics --log-every 2, 2 epochs)
    with open(os.path.join(HERE, "seed_report_run.jsonl"), "rb") as f:
        run = f.read()
    lines = run.splitlines(keepends=True)
    put("report", "run", run)
    put("report", "two_runs", run + b"\f" + b"".join(lines[:3]))
    put("report", "resumed", run + b"".join(lines[2:]))
    put("report", "steps_only", b"".join(l for l in lines if l.startswith(b'{"step"')))
    put("report", "epoch_min", b'{"epoch":1,"train_loss":1e308,"test_acc":-0.0}\n{"epoch":9223372036854775807}\n')
    put("report", "bad_json", lines[0][:40] + b"\n")
    put("report", "not_object", b"[1,2]\n")
    put("report", "nul", b'{"epoch":1}\0\n')
    put("report", "bad_types", b'{"epoch":"1","loss":null}\n{"step":-3,"loss":"x"}\n')
    put("report", "memory", b'{"epoch":1,"memory":{"parameters":{"f16":10,"total":10},"x":[1],"total":1e300}}\n')


def main():
    make_report()
    make_idx()
    make_cifar()
    make_safetensors()
    make_cli()
    make_pair()
    for target in sorted(os.listdir(OUT)):
        d = os.path.join(OUT, target)
        total = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print(f"corpus/{target}: {len(os.listdir(d))} files, {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
