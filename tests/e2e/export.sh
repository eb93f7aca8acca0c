#!/usr/bin/env bash
# End-to-end: `ampc export`. Trains the cnn on a slice of the real
# Fashion-MNIST at O2 (f16 model, f32 masters) with checkpoints, exports the
# last checkpoint as f32, f16 and bf16, and checks (export_check.py) that
# each holds exactly the model's state_dict -- the parameters from the f32
# masters, rounded to the type asked for, integer buffers as saved, no
# master./optim. entries, the preprocessing in the metadata -- and, where
# PyTorch is installed, that load_state_dict(strict=True) takes it and that
# PyTorch, preprocessing the test images as the metadata says, gets ampc
# eval's accuracy. The same for ResNet-18 on a generated CIFAR-10 folder.
# Then the errors, among them a file that is not the whole model (a tensor
# missing or one too many) and values --dtype f16 cannot hold.
#   bash export.sh <path to the ampc binary> <scratch dir>
set -u
ampc="$1"; dir="$2"
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dir"; mkdir -p "$dir/cifar"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
data=/usr/share/datasets/fashion-mnist
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
py=python3
for cand in /usr/bin/python3 python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch, numpy" 2>/dev/null; then py="$cand"; break; fi
done
if ! "$py" -c "import numpy" 2>/dev/null; then
  echo "skipped: no python3 with numpy to read the exports"; echo "0 passed, 0 failed"; exit 0
fi
"$py" -c "import torch" 2>/dev/null || echo "note: no PyTorch (apt-get install python3-torch): the strict loads are skipped"

# $1: model, $2: checkpoint, $3: prefix of the exports; then export_check.py's extra args
export_and_check() {
  local model=$1 ck=$2 out=$3; shift 3
  local dt
  for dt in f32 f16 bf16; do
    if "$ampc" export "$ck" -o "${out}_$dt.safetensors" --dtype $dt 2> "${out}_$dt.err" &&
      grep -q "wrote ${out}_$dt.safetensors: .* as $dt, parameters from the f32 master weights; preprocessing recorded" "${out}_$dt.err"; then
      ok "$model: ampc export --dtype $dt: $(cut -c1-160 "${out}_$dt.err")"
    else
      bad "$model: ampc export --dtype $dt"; cat "${out}_$dt.err"
    fi
  done
  if "$py" "$here/export_check.py" "$model" "$ck" "${out}_f32.safetensors" "${out}_f16.safetensors" "${out}_bf16.safetensors" "$@" > "${out}_check.log" 2>&1; then
    ok "$model: the exports hold the checkpoint's state_dict ($(grep -c '^ok' "${out}_check.log") checks: $(grep -o 'load_state_dict(strict=True) takes' "${out}_check.log" | wc -l) strict loads in PyTorch$(grep -q '^skipped' "${out}_check.log" && echo ', skipped: no PyTorch'))"
  else
    bad "$model: export check"; grep -v '^ok' "${out}_check.log"
  fi
  grep -E "^(ok|FAIL|skipped)" "${out}_check.log" | sed 's/^/       /'
}

# --- the cnn on Fashion-MNIST at O2 ------------------------------------------------
if [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then
  echo "skipped (cnn): $data not installed (apt-get install dataset-fashion-mnist)"
else
  if "$ampc" train --model cnn --epochs 1 --train-limit 2048 --test-limit 512 --opt-level O2 --quiet \
       --checkpoint-dir "$dir/ck_cnn" > "$dir/train_cnn.log" 2>&1; then
    ok "train cnn O2 on Fashion-MNIST with checkpoints"
    ck=$(ls "$dir/ck_cnn"/ckpt-step-*.safetensors | tail -1)
    export_and_check cnn "$ck" "$dir/cnn"
    acc=$("$ampc" eval --model cnn --weights "$dir/cnn_f32.safetensors" --test-limit 512 2>&1 | sed -n 's/.*test_acc \([0-9.]*\).*/\1/p')
    if [ -n "$acc" ]; then
      ok "ampc eval takes the export: test_acc $acc"
      if "$py" -c "import torch" 2>/dev/null; then
        if "$py" "$here/export_check.py" cnn "$ck" "$dir/cnn_f32.safetensors" "$dir/cnn_f16.safetensors" "$dir/cnn_bf16.safetensors" "$acc" 512 > "$dir/acc.log" 2>&1; then
          ok "$(grep 'test accuracy' "$dir/acc.log" | sed 's/^ok   //')"
        else
          bad "PyTorch with the recorded preprocessing"; grep -v '^ok' "$dir/acc.log"
        fi
      fi
    else
      bad "ampc eval on the export"
    fi
  else
    bad "train cnn"; cat "$dir/train_cnn.log"
  fi
  # a weights file from --save records the preprocessing too, and export carries it on
  if "$ampc" train --model mlp --epochs 1 --train-limit 512 --test-limit 128 --quiet --save "$dir/mlp_w.safetensors" > "$dir/train_mlp.log" 2>&1 &&
    "$ampc" export "$dir/mlp_w.safetensors" -o "$dir/mlp_x.safetensors" 2> "$dir/mlp_x.err" &&
    grep -q "preprocessing recorded in the metadata" "$dir/mlp_x.err" &&
    "$py" - "$dir/mlp_w.safetensors" "$dir/mlp_x.safetensors" <<'PY'
import json, struct, sys
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        meta = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))["__metadata__"]
    p = json.loads(meta["preprocessing"])
    assert p["dataset"] == "fashion-mnist" and p["shape"] == [1, 28, 28] and p["normalize"], p
    assert abs(p["mean"][0] - 0.286) < 1e-6 and abs(p["std"][0] - 0.353) < 1e-6, p
PY
  then
    ok "train --save records the preprocessing; export of the weights file carries it"
  else
    bad "preprocessing in a --save weights file"; cat "$dir/train_mlp.log" "$dir/mlp_x.err"
  fi
fi

# --- ResNet-18 on a generated CIFAR-10 folder at O2 ------------------------------
for f in data_batch_1 data_batch_2 data_batch_3 data_batch_4 data_batch_5 test_batch; do
  for ((i = 0; i < 16; i++)); do printf "\\$(printf '%03o' $((i % 10)))"; head -c 3072 /dev/urandom; done > "$dir/cifar/$f.bin"
done
if "$ampc" train --model resnet18 --dataset cifar10 --data "$dir/cifar" --epochs 1 --batch-size 8 --train-limit 16 \
     --test-limit 8 --opt-level O2 --quiet --checkpoint-dir "$dir/ck_r18" > "$dir/train_r18.log" 2>&1; then
  ok "train resnet18 O2 on generated CIFAR-10 with checkpoints"
  export_and_check resnet18 "$(ls "$dir/ck_r18"/ckpt-step-*.safetensors | tail -1)" "$dir/r18"
else
  bad "train resnet18"; cat "$dir/train_r18.log"
fi

# --- errors: one line naming the file or flag; 1 for bad input, 2 for usage ------
ck=$(ls "$dir"/ck_*/ckpt-step-*.safetensors 2>/dev/null | tail -1)
printf 'not a safetensors file' > "$dir/junk.safetensors"
expect() { # expected exit, message pattern, args...
  local want=$1 pat=$2; shift 2
  "$ampc" export "$@" > "$dir/err.out" 2> "$dir/err.txt"
  local rc=$?
  if [ $rc -eq "$want" ] && [ "$(wc -l < "$dir/err.txt")" -eq 1 ] && grep -Eq "^ampc: error: .*$pat" "$dir/err.txt" && [ ! -s "$dir/err.out" ]; then
    ok "export $(echo "$*" | sed "s|$dir/||g"): exit $rc, $(sed "s|$dir/||g" "$dir/err.txt")"
  else
    bad "export $*: exit $rc (want $want): $(cat "$dir/err.txt")"
  fi
}
expect 1 "missing.safetensors" "$dir/missing.safetensors" -o "$dir/x.safetensors"
expect 1 "junk.safetensors" "$dir/junk.safetensors" -o "$dir/x.safetensors"
# a safetensors file that is no checkpoint (here an export, format "pt"; grad's files alike)
expect 1 "not an ampc checkpoint or weights file \\(its \"format\" metadata is 'pt'\\)" "$(ls "$dir"/*_f32.safetensors | head -1)" -o "$dir/x.safetensors"
expect 2 "-o FILE is required" "$ck"
expect 2 "no checkpoint given" -o "$dir/x.safetensors"
expect 2 "--dtype: expected f32, f16 or bf16, got 'f64'" "$ck" -o "$dir/x.safetensors" --dtype f64
expect 2 "is the input file" "$ck" -o "$ck"
expect 2 "unknown option '--bogus'" "$ck" -o "$dir/x.safetensors" --bogus
# a file the export would not be the model's state_dict from: a tensor missing, one too many,
# a value that --dtype f16 would write as inf
if [ -n "$ck" ]; then
  # $1 out, $2 drop|add|big; prints the tensor's (model) name
  alter() {
    "$py" - "$ck" "$@" <<'PY'
import json, struct, sys
src, dst, op = sys.argv[1:4]
with open(src, "rb") as f:
    head = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    data = f.read()
meta = head.pop("__metadata__", None)
names = sorted(head, key=lambda k: head[k]["data_offsets"][0])
model = [k for k in names if not k.startswith(("master.", "optim."))]
# drop: the model's last bias; big: a parameter's exact value (its master copy where there is one) 1e6
target = [k for k in model if k.endswith(".bias")][-1] if op == "drop" else next(k for k in model if head.get("master." + k, head[k])["dtype"] == "F32")
if op == "big" and "master." + target in head:
    target_key = "master." + target
else:
    target_key = target
out, blobs, off = {}, [], 0
for k in names:
    b = bytearray(data[head[k]["data_offsets"][0]:head[k]["data_offsets"][1]])
    if op == "drop" and k == target_key:
        continue
    if op == "big" and k == target_key:
        b[0:4] = struct.pack("<f", 1e6)
    out[k] = dict(head[k], data_offsets=[off, off + len(b)])
    blobs.append(bytes(b)); off += len(b)
if op == "add":
    target = "extra.weight"
    out[target] = {"dtype": "F32", "shape": [1], "data_offsets": [off, off + 4]}
    blobs.append(struct.pack("<f", 1.0))
if meta is not None:
    out["__metadata__"] = meta
h = json.dumps(out, separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)
with open(dst, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
print(target)
PY
  }
  t=$(alter "$dir/drop.safetensors" drop) && expect 1 "drop.safetensors: missing tensor '$t' of model" "$dir/drop.safetensors" -o "$dir/x.safetensors"
  t=$(alter "$dir/add.safetensors" add) && expect 1 "add.safetensors: unexpected tensor '$t' for model" "$dir/add.safetensors" -o "$dir/x.safetensors"
  t=$(alter "$dir/big.safetensors" big) &&
    expect 1 "big.safetensors: tensor '$t' has values up to 1e\+06 in magnitude \(element 0\), beyond f16's range \(largest 65504\).*--dtype f32 or bf16" \
      "$dir/big.safetensors" -o "$dir/x.safetensors" --dtype f16
  if "$ampc" export "$dir/big.safetensors" -o "$dir/big_bf16.safetensors" --dtype bf16 2>/dev/null; then
    ok "export --dtype bf16 holds 1e6"; rm -f "$dir/big_bf16.safetensors"
  else
    bad "export --dtype bf16 of 1e6"
  fi
fi
[ ! -e "$dir/x.safetensors" ] && ok "nothing written on errors" || bad "an export was written despite an error"

echo "$pass passed, $fail failed"
[ $fail = 0 ]
