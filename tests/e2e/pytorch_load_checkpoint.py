"""Loads an ampc checkpoint of resnet18 into the PyTorch model and compares the
logits on a batch with the ones ampc computed (both in training mode, batch
statistics). Reads safetensors with the `safetensors` package when it is
installed, and with a few lines of its own otherwise (the format is a JSON
header and raw little-endian data).

usage: python3 pytorch_load_checkpoint.py CHECKPOINT BATCH AMPC_GRAD_OUTPUT
Exits 0 when the logits agree within fp32 tolerance.
"""
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from pytorch_resnet18 import ResNet18  # noqa: E402

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8}


def read_safetensors(path):
    try:
        from safetensors.torch import load_file
        return {k: v for k, v in load_file(path).items()}, "safetensors package"
    except ImportError:
        pass
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = data[a:b]
        if t["dtype"] == "BF16":
            arr = np.frombuffer(raw, np.uint16).astype(np.uint32) << 16
            arr = arr.view(np.float32)
        else:
            arr = np.frombuffer(raw, DTYPES[t["dtype"]])
        out[name] = torch.from_numpy(arr.copy().reshape(t["shape"]))
    return out, "own reader"


def main():
    ckpt, names = read_safetensors(sys.argv[1])
    batch, _ = read_safetensors(sys.argv[2])
    ref, _ = read_safetensors(sys.argv[3])
    theirs = ref["logits"].float()
    model_state = {k: v for k, v in ckpt.items() if not k.startswith(("master.", "optim."))}
    # 1. the model's own tensors, in their stored type (f16/bf16 at O2): a strict load
    #    works, and the logits agree to the half type's rounding of the weights
    # 2. with the f32 master copies (the exact weights) the logits agree to fp32 tolerance
    masters = {k: ckpt.get("master." + k, v) for k, v in model_state.items()}
    ok = True
    for what, state, tol in (("stored", model_state, 3e-2), ("master", masters, 1e-4)):
        model = ResNet18()
        model.load_state_dict({k: (v.float() if v.is_floating_point() else v) for k, v in state.items()}, strict=True)
        model.train()
        with torch.no_grad():
            logits = model(batch["x"].float())
        err = (logits - theirs).abs().max().item() / max(theirs.abs().max().item(), 1e-12)
        dtypes = sorted({str(v.dtype).replace("torch.", "") for v in state.values()})
        print(f"{what} weights ({', '.join(dtypes)}; {len(state)} tensors, {names}): "
              f"max |logits - ampc's| / max |ampc's| = {err:.2e} (limit {tol:g})")
        ok = ok and err < tol
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
