#!/usr/bin/env bash
# The device boundary, seen from the command line:
#  - outside src/backend/ no code reads or writes tensor data through a
#    pointer (the check the design asks for, on the sources);
#  - training, resuming, eval and grad on the guarded backend (device memory
#    inaccessible outside backend calls) give the cpu backend's results bit
#    for bit: the same epoch lines and metrics (timings aside), the same
#    saved weights, the same checkpoint tensors, the same gradients file;
#  - --device names a backend: an unknown one, cuda in a build without it,
#    or cuda on a machine without a GPU, is a one-line error.
set -u
ampc="$1"; dir="$2"
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$dir"; mkdir -p "$dir"
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

hits=$(cd "$src" && grep -rn -E '\.data\b|->data\b' tools examples src/amp src/optim src/io/checkpoint.c)
if [ -z "$hits" ]; then ok "no tensor data through pointers outside src/backend"; else bad "pointer access outside src/backend:"; echo "$hits"; fi

err=$("$ampc" train --device nosuch --epochs 1 2>&1); rc=$?
if [ $rc -ne 0 ] && [ "$(echo "$err" | wc -l)" = 1 ] && echo "$err" | grep -q "unknown backend 'nosuch'"; then ok "--device nosuch: $err"; else bad "--device nosuch: rc $rc, '$err'"; fi
if "$ampc" --version 2>/dev/null | grep -q '^backends:.*cuda'; then
  # built with CUDA: without a GPU, one line saying so
  err=$("$ampc" eval --device cuda --weights none.safetensors 2>&1); rc=$?
  if echo "$err" | grep -q "no CUDA device"; then
    if [ $rc = 1 ] && [ "$(echo "$err" | wc -l)" = 1 ] && echo "$err" | grep -q '^ampc: error: --device: backend cuda: no CUDA device (cudaGetDeviceCount: '; then
      ok "--device cuda without a GPU: $err"
    else
      bad "--device cuda without a GPU: rc $rc, '$err'"
    fi
  else
    echo "(a CUDA device is here: the no-device error is not checked; scripts/gpu-check checks the device)"
  fi
  # cuBLAS (and cuBLASLt with it, ~140 MB resident once loaded) is opened by
  # the cuda device when it is made: a cpu run does not load it
  if command -v readelf >/dev/null; then
    if readelf -d "$ampc" | grep NEEDED | grep -q cublas; then bad "ampc links cuBLAS (it should open it at run time)"; else ok "ampc does not link cuBLAS"; fi
  fi
  # (what the dynamic loader opens for a cpu run, its libraries' own needs included)
  out=$(LD_DEBUG=files "$ampc" bench --model mlp --steps 1 --warmup 0 --sgemm-size 64 --profile off --json 2>&1 >/dev/null)
  if ! echo "$out" | grep -q 'file=libcudart'; then bad "LD_DEBUG=files shows no libcudart: the check cannot see what is loaded"
  elif echo "$out" | grep -q 'file=libcublas'; then bad "a cpu run loaded cuBLAS"; else ok "a cpu run does not load cuBLAS"; fi
else
  err=$("$ampc" eval --device cuda --weights none.safetensors 2>&1); rc=$?
  if [ $rc -ne 0 ] && echo "$err" | grep -q "ampc was built without CUDA"; then ok "--device cuda: $err"; else bad "--device cuda: rc $rc, '$err'"; fi
fi

data=/usr/share/datasets/fashion-mnist
if [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then
  echo "skipped the training comparisons: $data not installed"
  echo "$pass passed, $fail failed"
  [ $fail = 0 ]; exit
fi

# every line of stdout and every metrics record without the timing fields
strip() {
  python3 - "$@" <<'EOF'
import json, re, sys
out, metrics = sys.argv[1], sys.argv[2]
for line in open(out):
    print(re.sub(r" [0-9.]+ img/s [0-9.]+s", "", line.rstrip()))
for line in open(metrics):
    o = json.loads(line)
    for k in ("images_per_s", "seconds", "train_seconds"):
        o.pop(k, None)
    print(json.dumps(o, sort_keys=True))
EOF
}
# the tensors of a safetensors file (not its metadata, which holds timings)
tensors() {
  python3 - "$1" <<'EOF'
import json, struct, sys, hashlib
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h.pop("__metadata__", None)
base = 8 + n
for name in sorted(h):
    s, e = h[name]["data_offsets"]
    print(name, h[name]["dtype"], h[name]["shape"], hashlib.sha256(b[base + s:base + e]).hexdigest())
EOF
}

common=(--model cnn --epochs 2 --train-limit 768 --test-limit 256 --batch-size 64 --grad-accum 2 --clip-grad-norm 1
        --seed 3 --quiet)
for lvl in O2 O3; do
  for dev in cpu cpu-guarded; do
    d="$dir/$lvl-$dev"; mkdir -p "$d"
    extra=()
    [ $lvl = O3 ] && extra=(--half bf16 --stochastic-rounding)
    "$ampc" train "${common[@]}" "${extra[@]}" --opt-level $lvl --device $dev --metrics "$d/m.jsonl" \
      --save "$d/w.safetensors" --checkpoint-dir "$d/ck" --save-every 5 > "$d/out.txt" 2>&1 || { bad "train $lvl on $dev"; cat "$d/out.txt"; }
    strip "$d/out.txt" "$d/m.jsonl" > "$d/summary.txt" 2>/dev/null
    tensors "$d/w.safetensors" > "$d/w.txt" 2>/dev/null
    last=$(ls "$d/ck" | sort | tail -1)
    tensors "$d/ck/$last" > "$d/ck.txt" 2>/dev/null
  done
  a="$dir/$lvl-cpu"; b="$dir/$lvl-cpu-guarded"
  if [ -s "$a/summary.txt" ] && cmp -s "$a/summary.txt" "$b/summary.txt"; then ok "$lvl: cpu-guarded trains as cpu does (epoch lines, metrics)"; else bad "$lvl: training output differs"; diff "$a/summary.txt" "$b/summary.txt" | head; fi
  if [ -s "$a/w.txt" ] && cmp -s "$a/w.txt" "$b/w.txt"; then ok "$lvl: the same saved weights"; else bad "$lvl: saved weights differ"; fi
  if [ -s "$a/ck.txt" ] && cmp -s "$a/ck.txt" "$b/ck.txt"; then ok "$lvl: the same last checkpoint ($(wc -l < "$a/ck.txt") tensors)"; else bad "$lvl: checkpoints differ"; fi
done

# resume on the guarded backend from a cpu checkpoint taken mid-run: it ends
# where the unbroken cpu run ended
d="$dir/resume"; mkdir -p "$d"
"$ampc" train "${common[@]}" --opt-level O2 --epochs 1 --checkpoint-dir "$d/ck" --save-every 4 > /dev/null 2>&1
mid=$(ls "$d/ck" | sort | head -1)
if "$ampc" train "${common[@]}" --opt-level O2 --device cpu-guarded --resume "$d/ck/$mid" --save "$d/w.safetensors" > "$d/out.txt" 2>&1; then
  tensors "$d/w.safetensors" > "$d/w.txt"
  if cmp -s "$d/w.txt" "$dir/O2-cpu/w.txt"; then ok "resumed on cpu-guarded from a cpu checkpoint ($mid): the unbroken run's weights"; else bad "resume across backends differs"; fi
else
  bad "resume on cpu-guarded"; cat "$d/out.txt"
fi

# eval and grad
for dev in cpu cpu-guarded; do
  "$ampc" eval --model cnn --weights "$dir/O2-cpu/w.safetensors" --test-limit 256 --opt-level O2 --device $dev > "$dir/eval-$dev.txt" 2>&1
done
if [ -s "$dir/eval-cpu.txt" ] && cmp -s "$dir/eval-cpu.txt" "$dir/eval-cpu-guarded.txt"; then ok "eval: $(cat "$dir/eval-cpu.txt")"; else bad "eval differs"; cat "$dir/eval-cpu.txt" "$dir/eval-cpu-guarded.txt"; fi
python3 - "$dir/batch.safetensors" <<'EOF'
import json, struct, sys, random
random.seed(5)
n, shape = 8, [8, 1, 28, 28]
x = struct.pack("<%df" % (n * 784), *[random.uniform(-1, 1) for _ in range(n * 784)])
y = struct.pack("<%dq" % n, *[random.randrange(10) for _ in range(n)])
h = {"x": {"dtype": "F32", "shape": shape, "data_offsets": [0, len(x)]},
     "y": {"dtype": "I64", "shape": [n], "data_offsets": [len(x), len(x) + len(y)]}}
hj = json.dumps(h).encode()
hj += b" " * ((8 - len(hj) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(hj)) + hj + x + y)
EOF
for dev in cpu cpu-guarded; do
  "$ampc" grad --model cnn --weights "$dir/O2-cpu/w.safetensors" --batch "$dir/batch.safetensors" --opt-level O2 --device $dev \
    --out "$dir/grad-$dev.safetensors" > /dev/null 2>&1 || bad "grad on $dev"
done
if [ -s "$dir/grad-cpu.safetensors" ] && cmp -s "$dir/grad-cpu.safetensors" "$dir/grad-cpu-guarded.safetensors"; then ok "grad: the same file"; else bad "grad files differ"; fi

echo "$pass passed, $fail failed"
[ $fail = 0 ]
