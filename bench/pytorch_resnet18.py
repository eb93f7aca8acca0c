"""Training steps of the CIFAR ResNet-18 in PyTorch, for the side-by-side
comparison with `ampc bench`: Adam lr 1e-3, random 3x32x32 inputs.

usage: python3 pytorch_resnet18.py THREADS BATCH MODE STEPS [options]
  MODE: fp32, bf16 or f16 -- fp32 throughout, or torch.amp's autocast to
        bf16 / f16 (f16 with a GradScaler, as torch.amp users train)
  --device cpu|cuda   where to run (default cpu)
  --channels-last     NHWC activations and weights (the tensor cores' layout)
  --compile           torch.compile the model (its compile time is part of
                      the warm-up, not of the timing)
  --warmup N          untimed steps first (default 1; 3 with --compile)
Prints one JSON object: images_per_s, seconds_per_step, peak_rss_bytes, and
on cuda peak_gpu_allocated_bytes / peak_gpu_reserved_bytes (over the timed
steps, with everything the model, optimizer and activations hold). On cuda
the timing waits for the GPU (torch.cuda.synchronize) before and after.
"""
import argparse
import contextlib
import json
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(Block(cin, cout, stride), Block(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.linear = nn.Linear(512, classes)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.layer4(self.layer3(self.layer2(self.layer1(y))))
        return self.linear(F.adaptive_avg_pool2d(y, 1).flatten(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("threads", type=int)
    p.add_argument("batch", type=int)
    p.add_argument("mode", choices=("fp32", "bf16", "f16"))
    p.add_argument("steps", type=int)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--warmup", type=int, default=None)
    a = p.parse_args()
    cuda = a.device == "cuda"
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if cuda:
        # the settings a user after speed takes; f32 stays true f32, as ampc's O0
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(a.device)
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = ResNet18().to(dev, memory_format=fmt)
    # on cuda the fused Adam (one kernel for all parameters), as ampc's step
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, **({"fused": True} if cuda else {}))
    x = torch.randn(a.batch, 3, 32, 32, device=dev).to(memory_format=fmt)
    y = torch.randint(0, 10, (a.batch,), device=dev)
    half = {"bf16": torch.bfloat16, "f16": torch.float16}.get(a.mode)
    scaler = None
    if a.mode == "f16":
        scaler = torch.amp.GradScaler(a.device) if hasattr(torch.amp, "GradScaler") else torch.cuda.amp.GradScaler()
    net = torch.compile(model) if a.compile else model

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=half) if half is not None else contextlib.nullcontext():
            loss = F.cross_entropy(net(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    warmup = a.warmup if a.warmup is not None else (3 if a.compile else 1)
    t = time.time()
    for _ in range(warmup):
        step()
    sync()
    warm_s = time.time() - t
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t = time.time()
    for _ in range(a.steps):
        step()
    sync()
    dt = (time.time() - t) / a.steps
    out = {"torch": torch.__version__, "device": a.device, "mode": a.mode, "threads": a.threads, "batch": a.batch,
           "channels_last": a.channels_last, "compile": a.compile, "warmup_seconds": warm_s,
           "seconds_per_step": dt, "images_per_s": a.batch / dt,
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if cuda:
        out["gpu"] = torch.cuda.get_device_name()
        out["peak_gpu_allocated_bytes"] = torch.cuda.max_memory_allocated()
        out["peak_gpu_reserved_bytes"] = torch.cuda.max_memory_reserved()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
