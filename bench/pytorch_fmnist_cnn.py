"""The Fashion-MNIST CNN trained with Adam in PyTorch, for the side-by-side
comparison with `ampc train --model cnn`: conv(1->32)-BN-ReLU-maxpool,
conv(32->64)-BN-ReLU-maxpool, linear(3136->128)-ReLU-linear(128->10), batch 128.

usage: python3 pytorch_fmnist_cnn.py EPOCHS [DATA_DIR] [SEED]
Prints one JSON object per epoch: epoch, test_acc, seconds (training time of the epoch).
SEED (default 0, the reference's) seeds torch: the initial weights and the batch order.
"""
import gzip
import json
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path, offset):
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def main():
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    d = sys.argv[2] if len(sys.argv) > 2 else "/usr/share/datasets/fashion-mnist"
    torch.set_num_threads(2)
    torch.manual_seed(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    img = lambda f: torch.tensor(read_idx(f"{d}/{f}", 16).reshape(-1, 1, 28, 28).astype(np.float32) / 255.0)
    lab = lambda f: torch.tensor(read_idx(f"{d}/{f}", 8).astype(np.int64))
    xtr, ytr = img("train-images-idx3-ubyte.gz"), lab("train-labels-idx1-ubyte.gz")
    xte, yte = img("t10k-images-idx3-ubyte.gz"), lab("t10k-labels-idx1-ubyte.gz")
    model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    for e in range(epochs):
        t = time.time()
        model.train()
        perm = torch.randperm(len(xtr))
        for i in range(0, len(xtr), 128):
            idx = perm[i:i + 128]
            opt.zero_grad()
            F.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
            opt.step()
        seconds = time.time() - t
        model.eval()
        with torch.no_grad():
            acc = (model(xte).argmax(1) == yte).float().mean().item()
        print(json.dumps({"epoch": e + 1, "test_acc": acc, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
