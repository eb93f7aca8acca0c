"""Training steps of the CIFAR ResNet-18 in PyTorch, for the side-by-side
comparison with `ampc bench`: Adam lr 1e-3, random 3x32x32 inputs, in one of
PyTorch's configurations, on the CPU or a GPU.

usage: python3 pytorch_resnet18.py THREADS BATCH MODE STEPS [MAX_STEP_SECONDS] [options]

MODE:
  fp32 (or nchw)  float32, NCHW memory format (PyTorch's default)
  cl              float32, channels_last
  cl_compile      float32, channels_last, the model under torch.compile (PyTorch 2 or later)
  bf16            torch.amp autocast to bfloat16, NCHW
  cl_bf16         bfloat16 autocast, channels_last
  f16             autocast to float16 with a GradScaler (as torch.amp users
                  train on a GPU)
options (they add to what MODE says):
  --device cpu|cuda   where to run (default cpu)
  --channels-last     NHWC activations and weights
  --compile           torch.compile the model
  --warmup N          untimed steps first (default 1; 2 with torch.compile on
                      the CPU, 3 on cuda, whose first steps compile forward
                      and backward)
  --max-step S        (the same as MAX_STEP_SECONDS) a configuration that is
                      not compiled first runs one step on 8 images; when that
                      predicts a full step longer than S seconds (bf16 autocast
                      on a CPU without bf16 arithmetic is 30-150x slower than
                      fp32), it is not timed further and reports the
                      prediction, so one hopeless configuration does not hold
                      up a comparison for many minutes.

Prints one JSON object: torch, variant, device, images_per_s,
seconds_per_step, warmup_s, peak_rss_bytes, and on cuda the GPU's name and
peak_gpu_allocated_bytes / peak_gpu_reserved_bytes over the timed steps (on
cuda the timing waits for the GPU before and after); or, for a configuration
that cannot run here (torch.compile before PyTorch 2, or a compiler error),
"skipped" with the reason.
"""
import argparse
import contextlib
import json
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MODES = ("fp32", "nchw", "cl", "cl_compile", "bf16", "cl_bf16", "f16")
PROBE = 8  # images in the probe step of --max-step


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
    p = argparse.ArgumentParser(usage="pytorch_resnet18.py THREADS BATCH MODE STEPS [MAX_STEP_SECONDS] [options]",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("threads", type=int)
    p.add_argument("batch", type=int)
    p.add_argument("mode", choices=MODES)
    p.add_argument("steps", type=int)
    p.add_argument("max_step_pos", type=float, nargs="?", default=None, metavar="MAX_STEP_SECONDS")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--max-step", type=float, default=None)
    a = p.parse_args()
    variant = "fp32" if a.mode == "nchw" else a.mode
    channels_last = a.channels_last or variant.startswith("cl")
    compiled = a.compile or "compile" in variant
    half = torch.bfloat16 if "bf16" in variant else torch.float16 if variant == "f16" else None
    max_step = a.max_step if a.max_step is not None else a.max_step_pos
    cuda = a.device == "cuda"
    name = ("cl_" if channels_last and not variant.startswith("cl") else "") + variant + \
        ("_compile" if compiled and "compile" not in variant else "")
    base = dict(variant=name, device=a.device, threads=a.threads, batch=a.batch, channels_last=channels_last,
                compile=compiled)

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if cuda:
        # the settings a user after speed takes; f32 stays true f32, as ampc's O0
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(a.device)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = ResNet18().to(dev, memory_format=fmt)
    # on cuda the fused Adam (one kernel for all parameters), as ampc's step
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, **({"fused": True} if cuda else {}))
    x = torch.randn(a.batch, 3, 32, 32, device=dev).contiguous(memory_format=fmt)
    y = torch.randint(0, 10, (a.batch,), device=dev)
    scaler = None
    if variant == "f16":
        scaler = torch.amp.GradScaler(a.device) if hasattr(torch.amp, "GradScaler") else torch.cuda.amp.GradScaler()
    net = model
    if compiled:
        if not hasattr(torch, "compile"):
            report(skipped="torch.compile is not in PyTorch %s (it came with 2.0)" % torch.__version__, **base)
            return
        net = torch.compile(model)

    def step(xb, yb):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=half) if half is not None else contextlib.nullcontext():
            loss = F.cross_entropy(net(xb), yb)
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

    if max_step is not None and not compiled:
        step(x[:PROBE], y[:PROBE])  # first call: allocations, kernel selection
        sync()
        t = time.time()
        step(x[:PROBE], y[:PROBE])
        sync()
        predicted = (time.time() - t) * a.batch / PROBE
        if predicted > max_step:
            report(skipped="a step of %d images predicted to take %.0f s (from one of %d images), over the %.0f s allowed"
                   % (a.batch, predicted, PROBE, max_step), predicted_images_per_s=a.batch / predicted, **base)
            return
    warmup = a.warmup if a.warmup is not None else ((3 if cuda else 2) if compiled else 1)
    t = time.time()
    try:
        for _ in range(warmup):
            step(x, y)
        sync()
    except Exception as e:  # torch.compile without a working compiler, say
        report(skipped="%s failed: %s" % (name, str(e).strip().splitlines()[0][:200]), **base)
        return
    warm = time.time() - t
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t = time.time()
    for _ in range(a.steps):
        step(x, y)
    sync()
    dt = (time.time() - t) / a.steps
    extra = {}
    if cuda:
        extra = dict(gpu=torch.cuda.get_device_name(), peak_gpu_allocated_bytes=torch.cuda.max_memory_allocated(),
                     peak_gpu_reserved_bytes=torch.cuda.max_memory_reserved())
    report(mode=variant, seconds_per_step=dt, images_per_s=a.batch / dt, warmup_s=warm, **extra, **base)


if __name__ == "__main__":
    main()
