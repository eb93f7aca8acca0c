# Replays an ampc run of the Fashion-MNIST cnn in PyTorch from the same start:
# the initial weights of an ampc checkpoint (safetensors, PyTorch names; f32
# master.* tensors preferred) and ampc's own batch order (build/bench/loader-order).
# From the same start and batches the two frameworks differ only in rounding,
# so comparing them shows what a seed decides and what the framework does.
#
# usage: python3 bench/pytorch_same_start.py CHECKPOINT ORDER_FILE [EPOCHS] [THREADS] [--normalize on|off]
#   CHECKPOINT: e.g. from build/ampc train --model cnn --epochs 1 --train-limit 128 --lr 0 --checkpoint-dir D
#               (lr 0: the weights are still the initial ones; running statistics are reset here)
#   ORDER_FILE: build/bench/loader-order --seed S --epochs N > ORDER_FILE (the same --seed)
import gzip, json, struct, sys, time
import numpy as np
import torch, torch.nn as nn, torch.nn.functional as F

args = [a for a in sys.argv[1:] if not a.startswith("--")]
norm = "--normalize" not in sys.argv or sys.argv[sys.argv.index("--normalize") + 1] == "on"
if "--normalize" in sys.argv:
    args.remove(sys.argv[sys.argv.index("--normalize") + 1])
if len(args) < 2:
    sys.exit("usage: pytorch_same_start.py CHECKPOINT ORDER_FILE [EPOCHS] [THREADS] [--normalize on|off]")
ckpt, order_file = args[0], args[1]
epochs = int(args[2]) if len(args) > 2 else 3
torch.set_num_threads(int(args[3]) if len(args) > 3 else 2)
D = "/usr/share/datasets/fashion-mnist/"

def images(f):
    x = np.frombuffer(gzip.open(D + f).read(), np.uint8, offset=16).reshape(-1, 1, 28, 28).astype(np.float32) / 255.0
    if norm:  # ampc's default: the published Fashion-MNIST mean and std
        x = (x - np.float32(0.2860)) / np.float32(0.3530)
    return torch.tensor(x)

def labels(f):
    return torch.tensor(np.frombuffer(gzip.open(D + f).read(), np.uint8, offset=8).astype(np.int64))

xtr, ytr = images("train-images-idx3-ubyte.gz"), labels("train-labels-idx1-ubyte.gz")
xte, yte = images("t10k-images-idx3-ubyte.gz"), labels("t10k-labels-idx1-ubyte.gz")
m = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                  nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                  nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))

raw = open(ckpt, "rb").read()
hlen = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + hlen])
kinds = {"F32": np.float32, "F16": np.float16}
state = m.state_dict()
for name in state:
    if "running" in name or "num_batches" in name:
        continue  # the fresh module's: running mean 0, variance 1
    e = header.get("master." + name, header[name])
    a, b = e["data_offsets"]
    if e["dtype"] == "BF16":
        u = np.frombuffer(raw[8 + hlen + a:8 + hlen + b], np.uint16).astype(np.uint32) << 16
        v = u.view(np.float32)
    else:
        v = np.frombuffer(raw[8 + hlen + a:8 + hlen + b], kinds[e["dtype"]]).astype(np.float32)
    state[name] = torch.tensor(v.reshape(e["shape"]))
m.load_state_dict(state)

order = np.loadtxt(order_file, dtype=np.int64)
n = xtr.shape[0]
if order.size < epochs * n:
    sys.exit(f"{order_file}: {order.size} indices, {epochs} epochs of {n} need {epochs * n}")
order = order[:epochs * n].reshape(epochs, n)
opt = torch.optim.Adam(m.parameters(), 1e-3)
t = time.time()
for e in range(epochs):
    m.train()
    p = torch.tensor(order[e])
    total, batches = 0.0, 0
    for i in range(0, n, 128):
        idx = p[i:i + 128]
        opt.zero_grad()
        loss = F.cross_entropy(m(xtr[idx]), ytr[idx])
        loss.backward()
        opt.step()
        total += loss.item()
        batches += 1
    m.eval()
    with torch.no_grad():
        out = m(xte)
        acc = (out.argmax(1) == yte).float().mean().item()
        test_loss = F.cross_entropy(out, yte).item()
    print(f"epoch {e + 1} train_loss={total / batches:.4f} test_loss={test_loss:.4f} test_acc={acc:.4f} "
          f"elapsed={time.time() - t:.1f}s", flush=True)
