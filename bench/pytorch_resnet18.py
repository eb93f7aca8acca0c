"""Training steps of the CIFAR ResNet-18 in PyTorch, for the side-by-side
comparison with `ampc bench`: Adam lr 1e-3, random 3x32x32 inputs, in one of
PyTorch's CPU configurations.

usage: python3 pytorch_resnet18.py THREADS BATCH VARIANT STEPS [MAX_STEP_SECONDS]

VARIANT:
  fp32 (or nchw)  float32, NCHW memory format (PyTorch's default)
  cl              float32, channels_last
  cl_compile      float32, channels_last, the model under torch.compile (PyTorch 2 or later;
                  the compilation happens in the warm-up steps, which are not timed)
  bf16            bfloat16 autocast, NCHW
  cl_bf16         bfloat16 autocast, channels_last

Warm-up steps (one; two with torch.compile, whose first steps compile forward
and backward) run before STEPS timed ones. With MAX_STEP_SECONDS, a variant
that is not compiled first runs one step on 8 images; when that predicts a
full step longer than MAX_STEP_SECONDS (bf16 autocast on a CPU without bf16
arithmetic is 30-150x slower than fp32), it is not timed further and reports
the prediction instead, so one hopeless configuration does not hold up a
comparison for many minutes.

Prints one JSON object: torch, variant, images_per_s, seconds_per_step,
warmup_s, peak_rss_bytes; or, for a variant that cannot run here (torch.compile
before PyTorch 2, or a compiler error), "skipped" with the reason.
"""
import json
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VARIANTS = ("fp32", "nchw", "cl", "cl_compile", "bf16", "cl_bf16")
PROBE = 8  # images in the probe step of MAX_STEP_SECONDS


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


def report(**kw):
    out = {"torch": torch.__version__}
    out.update(kw)
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(out), flush=True)


def main():
    if len(sys.argv) not in (5, 6) or sys.argv[3] not in VARIANTS:
        sys.exit("usage: pytorch_resnet18.py THREADS BATCH %s STEPS [MAX_STEP_SECONDS]" % "|".join(VARIANTS))
    threads, batch, variant, steps = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    max_step = float(sys.argv[5]) if len(sys.argv) > 5 else None
    variant = "fp32" if variant == "nchw" else variant
    base = dict(variant=variant, threads=threads, batch=batch)
    channels_last, compiled, bf16 = variant.startswith("cl"), "compile" in variant, "bf16" in variant
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = ResNet18()
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    fwd = model
    if compiled:
        if not hasattr(torch, "compile"):
            report(skipped="torch.compile is not in PyTorch %s (it came with 2.0)" % torch.__version__, **base)
            return
        fwd = torch.compile(model)

    def step(xb, yb):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(fwd(xb), yb)
        loss.backward()
        opt.step()

    if max_step is not None and not compiled:
        step(x[:PROBE], y[:PROBE])  # first call: allocations, kernel selection
        t = time.time()
        step(x[:PROBE], y[:PROBE])
        predicted = (time.time() - t) * batch / PROBE
        if predicted > max_step:
            report(skipped="a step of %d images predicted to take %.0f s (from one of %d images), over the %.0f s allowed"
                   % (batch, predicted, PROBE, max_step), predicted_images_per_s=batch / predicted, **base)
            return
    t = time.time()
    try:
        for _ in range(2 if compiled else 1):
            step(x, y)
    except Exception as e:  # torch.compile without a working compiler, say
        report(skipped="%s failed: %s" % (variant, str(e).strip().splitlines()[0][:200]), **base)
        return
    warm = time.time() - t
    t = time.time()
    for _ in range(steps):
        step(x, y)
    dt = (time.time() - t) / steps
    report(mode=variant, seconds_per_step=dt, images_per_s=batch / dt, warmup_s=warm, **base)


if __name__ == "__main__":
    main()
