"""Checks files written by `ampc export` against the checkpoint they came from,
and loads them into the PyTorch reference model with strict=True.

usage: python3 export_check.py MODEL CHECKPOINT EXPORT_F32 EXPORT_F16 EXPORT_BF16 [AMPC_EVAL_ACC TEST_LIMIT]
  MODEL: cnn or resnet18
  AMPC_EVAL_ACC, TEST_LIMIT (cnn): `ampc eval`'s accuracy on the first TEST_LIMIT
      Fashion-MNIST test images with the exported weights; PyTorch, fed the
      images as the export's "preprocessing" metadata says, must agree.
Without torch (ImportError) only the file checks run, and the script says so.
Prints one line per check; exits 1 if any failed.
"""
import gzip
import json
import os
import struct
import sys

import numpy as np

failures = 0


def check(cond, what):
    global failures
    print(("ok   " if cond else "FAIL ") + what)
    failures += not cond


def read(path):
    """{name: (dtype, shape, numpy array as stored; bf16 as uint16)}, metadata"""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    kinds = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64, "I32": np.int32}
    out = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], np.frombuffer(raw[8 + n + a:8 + n + b], kinds[t["dtype"]]).reshape(t["shape"]))
    return out, meta


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(f):  # round to nearest even, as ampc and torch do (finite values)
    u = f.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main():
    model_name, ckpt_path, f32_path, f16_path, bf16_path = sys.argv[1:6]
    ckpt, cmeta = read(ckpt_path)
    model_keys = [k for k in ckpt if not k.startswith(("master.", "optim."))]
    exports = {}
    for dt, path in (("F32", f32_path), ("F16", f16_path), ("BF16", bf16_path)):
        t, meta = read(path)
        exports[dt] = (t, meta)
        check(sorted(t) == sorted(model_keys), f"{dt}: exactly the model's {len(model_keys)} tensors, no master./optim. entries")
        ok_types, ok_values = True, True
        for k in model_keys:
            src = ckpt.get("master." + k, ckpt[k])
            if src[0] == "I64":
                ok_types &= t[k][0] == "I64"
                ok_values &= np.array_equal(t[k][2], src[2])
                continue
            ok_types &= t[k][0] == dt
            f = bf16_to_f32(src[2]) if src[0] == "BF16" else src[2].astype(np.float32)
            want = {"F32": f, "F16": f.astype(np.float16), "BF16": f32_to_bf16(f)}[dt]
            ok_values &= np.array_equal(t[k][2], want) and t[k][1] == src[1]
        masters = sum(1 for k in model_keys if "master." + k in ckpt)
        check(ok_types, f"{dt}: floating-point tensors in {dt}, integer buffers stay I64")
        check(ok_values, f"{dt}: values = the checkpoint's ({masters} parameters from their f32 masters) rounded to {dt}")
        pre = json.loads(meta.get("preprocessing", "{}"))
        info = json.loads(meta.get("ampc", "{}"))
        check(meta.get("format") == "pt" and meta.get("model") == model_name and info.get("dtype") == dt.lower(),
              f"{dt}: metadata format pt, model {model_name}, dtype {info.get('dtype')}, from {info.get('source_format')} at step {info.get('step')}")
        want_pre = {"cnn": ("fashion-mnist", [1, 28, 28], [0.286], [0.353]),
                    "resnet18": ("cifar10", [3, 32, 32], [0.4914, 0.4822, 0.4465], [0.247, 0.2435, 0.2616])}[model_name]
        got_pre = (pre.get("dataset"), pre.get("shape"), pre.get("mean"), pre.get("std"))
        check(got_pre == want_pre and pre.get("normalize") is True, f"{dt}: preprocessing {pre}")

    try:
        import torch
    except ImportError:
        print("skipped: no PyTorch (apt-get install python3-torch): the exports were not loaded into the model")
        return
    import torch.nn as nn
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
    if model_name == "resnet18":
        from pytorch_resnet18 import ResNet18
        make = ResNet18
    else:
        def make():
            return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    models = {}
    for dt, (t, _) in exports.items():
        sd = {}
        for k, (kind, shape, arr) in t.items():
            if kind == "BF16":  # numpy has no bf16: the bits through int16
                sd[k] = torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
            else:
                sd[k] = torch.from_numpy(arr.copy())
        m = make()
        try:
            m.load_state_dict(sd, strict=True)
            check(True, f"{dt}: torch {torch.__version__} load_state_dict(strict=True) takes the export "
                        f"({', '.join(sorted({str(v.dtype).replace('torch.', '') for v in sd.values()}))})")
        except RuntimeError as e:
            check(False, f"{dt}: load_state_dict(strict=True): {str(e).splitlines()[0]}")
        models[dt] = m

    if model_name == "cnn" and len(sys.argv) > 7:
        # PyTorch on the same test images, preprocessed as the metadata says
        ampc_acc, limit = float(sys.argv[6]), int(sys.argv[7])
        pre = json.loads(exports["F32"][1]["preprocessing"])
        d = "/usr/share/datasets/fashion-mnist"
        x = np.frombuffer(gzip.open(f"{d}/t10k-images-idx3-ubyte.gz").read(), np.uint8, offset=16)[:limit * 784]
        y = np.frombuffer(gzip.open(f"{d}/t10k-labels-idx1-ubyte.gz").read(), np.uint8, offset=8)[:limit].astype(np.int64)
        x = x.reshape([limit] + pre["shape"]).astype(np.float32) / 255.0
        mean = np.array(pre["mean"], np.float32).reshape(-1, 1, 1)
        std = np.array(pre["std"], np.float32).reshape(-1, 1, 1)
        x = (x - mean) / std
        m = models["F32"].eval()
        with torch.no_grad():
            acc = (m(torch.from_numpy(x)).argmax(1) == torch.from_numpy(y)).float().mean().item()
        check(abs(acc - ampc_acc) <= 2.0 / limit,
              f"PyTorch's test accuracy with the metadata's preprocessing {acc:.4f} = ampc eval's {ampc_acc:.4f} (on {limit} images)")


if __name__ == "__main__":
    main()
    sys.exit(1 if failures else 0)
