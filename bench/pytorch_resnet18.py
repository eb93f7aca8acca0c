"""Training steps of the CIFAR ResNet-18 in PyTorch, for the side-by-side
comparison with `ampc bench`: Adam lr 1e-3, random 3x32x32 inputs.

usage: python3 pytorch_resnet18.py THREADS BATCH fp32|bf16 STEPS
Prints one JSON object: images_per_s, seconds_per_step, peak_rss_bytes.
"""
import json
import resource
import sys
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
    threads, batch = int(sys.argv[1]), int(sys.argv[2])
    mode, steps = sys.argv[3], int(sys.argv[4])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = ResNet18()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16"):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    step()
    t = time.time()
    for _ in range(steps):
        step()
    dt = (time.time() - t) / steps
    print(json.dumps({"torch": torch.__version__, "mode": mode, "threads": threads, "batch": batch,
                      "seconds_per_step": dt, "images_per_s": batch / dt,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


if __name__ == "__main__":
    main()
