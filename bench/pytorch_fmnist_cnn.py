"""The Fashion-MNIST CNN trained with Adam in PyTorch, for the side-by-side
comparison with `ampc train --model cnn`: conv(1->32)-BN-ReLU-maxpool,
conv(32->64)-BN-ReLU-maxpool, linear(3136->128)-ReLU-linear(128->10), batch 128.

usage: python3 pytorch_fmnist_cnn.py EPOCHS [DATA_DIR] [SEED] [CONFIG] [MAX_EPOCH_SECONDS]
Prints one JSON object per epoch: epoch, test_acc, seconds (training time of the epoch),
config. SEED (default 0, the reference's) seeds torch: the initial weights and the batch order.
CONFIG is one of PyTorch's CPU configurations:
  nchw         float32, NCHW (the default)
  cl           float32, channels_last
  cl_compile   float32, channels_last, the model under torch.compile; the compilation
               (two warm-up steps on a copy of the model and optimizer, so the timed
               training starts from the same weights) is not counted in the epoch time
  bf16         bf16 autocast (torch.autocast("cpu", torch.bfloat16) around the forward
               pass and the loss, as PyTorch's mixed precision on a CPU runs; the weights
               and Adam stay float32), NCHW
  cl_bf16      bf16 autocast, channels_last
Where torch.compile is unavailable or fails, prints {"config": ..., "skipped": reason}.
MAX_EPOCH_SECONDS: where the first 10 steps of an epoch predict a longer one (bf16
autocast on a CPU without bf16 arithmetic runs many times slower than float32), the run
stops there and prints {"config": ..., "skipped": reason, "predicted_seconds": ...}.
"""
import gzip
import json
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = ("nchw", "cl", "cl_compile", "bf16", "cl_bf16")
PROBE_STEPS = 10  # steps timed before MAX_EPOCH_SECONDS is checked


def read_idx(path, offset):
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def main():
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    d = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else "/usr/share/datasets/fashion-mnist"
    config = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else "nchw"
    if config not in CONFIGS:
        sys.exit(f"pytorch_fmnist_cnn.py: CONFIG must be one of {', '.join(CONFIGS)}, not {config!r}")
    max_epoch = None
    if len(sys.argv) > 5:
        try:
            max_epoch = float(sys.argv[5])
        except ValueError:
            max_epoch = -1.0
        if not max_epoch > 0 or max_epoch == float("inf"):
            sys.exit(f"pytorch_fmnist_cnn.py: MAX_EPOCH_SECONDS must be a positive number of seconds, not {sys.argv[5]!r}")
    bf16 = config.endswith("bf16")
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
    torch.set_num_threads(2)
    torch.manual_seed(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    img = lambda f: torch.tensor(read_idx(f"{d}/{f}", 16).reshape(-1, 1, 28, 28).astype(np.float32) / 255.0)
    lab = lambda f: torch.tensor(read_idx(f"{d}/{f}", 8).astype(np.int64))
    xtr, ytr = img("train-images-idx3-ubyte.gz"), lab("train-labels-idx1-ubyte.gz")
    xte, yte = img("t10k-images-idx3-ubyte.gz"), lab("t10k-labels-idx1-ubyte.gz")
    model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    fmt = torch.channels_last if config.startswith("cl") else torch.contiguous_format
    model = model.to(memory_format=fmt)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    run = model
    if config.endswith("compile"):
        import copy
        if not hasattr(torch, "compile"):
            print(json.dumps({"config": config, "skipped": f"torch.compile needs PyTorch 2 (this is {torch.__version__})"}))
            return
        try:
            run = torch.compile(model)
            # warm-up on copies: the compiled graphs are reused, the weights and
            # the optimizer state of the timed run are left as they started
            saved = copy.deepcopy(model.state_dict())
            wopt = torch.optim.Adam(model.parameters(), 1e-3)
            for i in range(2):
                x = xtr[i * 128:(i + 1) * 128].contiguous(memory_format=fmt)
                wopt.zero_grad()
                F.cross_entropy(run(x), ytr[i * 128:(i + 1) * 128]).backward()
                wopt.step()
            model.load_state_dict(saved)
            opt.zero_grad()
        except Exception as e:  # an unusable compiler tool chain
            print(json.dumps({"config": config, "skipped": f"torch.compile failed: {type(e).__name__}"}))
            return
    for e in range(epochs):
        t = time.time()
        model.train()
        perm = torch.randperm(len(xtr))
        steps = (len(xtr) + 127) // 128
        for s, i in enumerate(range(0, len(xtr), 128)):
            idx = perm[i:i + 128]
            opt.zero_grad()
            with autocast():
                loss = F.cross_entropy(run(xtr[idx].contiguous(memory_format=fmt)), ytr[idx])
            loss.backward()
            opt.step()
            if max_epoch is not None and s + 1 == PROBE_STEPS:
                predicted = (time.time() - t) * steps / PROBE_STEPS
                if predicted > max_epoch:
                    print(json.dumps({"config": config, "predicted_seconds": predicted,
                                      "skipped": f"its first {PROBE_STEPS} steps predict a {predicted:.0f} s epoch, "
                                                 f"over the {max_epoch:g} s limit"}), flush=True)
                    return
        seconds = time.time() - t
        model.eval()
        with torch.no_grad(), autocast():
            acc = (model(xte.contiguous(memory_format=fmt)).argmax(1) == yte).float().mean().item()
        print(json.dumps({"epoch": e + 1, "test_acc": acc, "seconds": seconds, "config": config}), flush=True)


if __name__ == "__main__":
    main()
