#!/usr/bin/env bash
# A checkpoint written by ampc loads in PyTorch: train resnet18 one step on a
# generated CIFAR-10 folder with checkpoints on, load the checkpoint into the
# PyTorch ResNet-18 (strict state_dict), and compare logits on a batch with
# `ampc grad`'s. Skipped where no PyTorch is installed.
set -u
ampc="$1"; dir="$2"
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dir"; mkdir -p "$dir/cifar"
py=""
for cand in /usr/bin/python3 python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch, numpy" 2>/dev/null; then py="$cand"; break; fi
done
if [ -z "$py" ]; then echo "skipped: no PyTorch (apt-get install python3-torch)"; echo "0 passed, 0 failed"; exit 0; fi
for f in data_batch_1 data_batch_2 data_batch_3 data_batch_4 data_batch_5 test_batch; do
  for ((i = 0; i < 16; i++)); do printf "\\$(printf '%03o' $((i % 10)))"; head -c 3072 /dev/urandom; done > "$dir/cifar/$f.bin"
done
pass=0; fail=0
for lvl in O0 O2; do
  if ! "$ampc" train --model resnet18 --dataset cifar10 --data "$dir/cifar" --epochs 1 --batch-size 8 --train-limit 16 \
       --test-limit 8 --opt-level $lvl --quiet --checkpoint-dir "$dir/ck_$lvl" > "$dir/train_$lvl.log" 2>&1; then
    fail=$((fail + 1)); echo "FAIL $lvl training"; cat "$dir/train_$lvl.log"; continue
  fi
  ck=$(ls "$dir/ck_$lvl"/ckpt-step-*.safetensors | tail -1)
  "$py" - "$dir/batch.safetensors" <<'PY'
import json, struct, sys, numpy as np
rng = np.random.default_rng(5)
x = rng.standard_normal((4, 3, 32, 32)).astype(np.float32); y = np.array([1, 2, 3, 4], np.int64)
hdr = {"x": {"dtype": "F32", "shape": list(x.shape), "data_offsets": [0, x.nbytes]},
       "y": {"dtype": "I64", "shape": [4], "data_offsets": [x.nbytes, x.nbytes + y.nbytes]}}
h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + x.tobytes() + y.tobytes())
PY
  "$ampc" grad --model resnet18 --weights "$ck" --batch "$dir/batch.safetensors" --out "$dir/grad_$lvl.safetensors" --opt-level O0 > /dev/null 2>&1 \
    || { fail=$((fail + 1)); echo "FAIL $lvl ampc grad on the checkpoint"; continue; }
  if "$py" "$here/pytorch_load_checkpoint.py" "$ck" "$dir/batch.safetensors" "$dir/grad_$lvl.safetensors"; then
    pass=$((pass + 1)); echo "ok   $lvl checkpoint loads in PyTorch with the same logits"
  else
    fail=$((fail + 1)); echo "FAIL $lvl checkpoint in PyTorch"
  fi
done
echo "$pass passed, $fail failed"
[ $fail = 0 ]
