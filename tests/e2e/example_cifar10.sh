#!/usr/bin/env bash
# End-to-end: the C example (examples/resnet18_cifar10.c) and `ampc train`
# on a tiny generated CIFAR-10 folder.
#   bash example_cifar10.sh <path to the ampc binary> <scratch dir>
# The example binary is built next to the CLI, in examples/.
set -u

ampc=${1:?usage: example_cifar10.sh AMPC_BINARY SCRATCH_DIR}
scratch=${2:?usage: example_cifar10.sh AMPC_BINARY SCRATCH_DIR}
example="$(dirname "$ampc")/examples/resnet18_cifar10"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok: $1"; }
bad() { fail=$((fail + 1)); echo "FAIL: $1"; }

rm -rf "$scratch"
mkdir -p "$scratch/cifar"

# CIFAR-10 binary format: records of 1 label byte (0..9) + 3072 pixel bytes
# (R, G, B planes of 32x32). 64 records per file; labels cycle through the
# classes, pixels are random.
make_batch() {
  local i
  for ((i = 0; i < 64; i++)); do
    printf "\\$(printf '%03o' $((i % 10)))"
    head -c 3072 /dev/urandom
  done >"$1"
}
for f in data_batch_1 data_batch_2 data_batch_3 data_batch_4 data_batch_5 test_batch; do
  make_batch "$scratch/cifar/$f.bin"
done
size=$(wc -c <"$scratch/cifar/test_batch.bin")
if [ "$size" -eq $((64 * 3073)) ]; then ok "generated CIFAR-10 files"; else bad "generated test_batch.bin has $size bytes"; fi

# A finite number after "loss" on some line of $1.
has_loss() { grep -Eq 'loss [0-9]+\.[0-9]+' "$1"; }

# --- the example ------------------------------------------------------------
if [ ! -x "$example" ]; then
  bad "example binary not found at $example (build the resnet18_cifar10 target)"
else
  out="$scratch/example.out"
  if "$example" --data "$scratch/cifar" --steps 2 --batch 16 --test-limit 32 >"$out" 2>&1; then
    ok "example: 2 steps at O2 exit 0"
  else
    bad "example: 2 steps at O2 exited $?"; cat "$out"
  fi
  if grep -Eq '^step 2/2 .*loss [0-9]+\.[0-9]+ loss_scale [0-9.e+]+ [0-9.]+ img/s' "$out"; then
    ok "example: prints loss, loss scale and images/s"
  else
    bad "example: no progress line with a finite loss"; cat "$out"
  fi
  if grep -Eq '^test: loss [0-9]+\.[0-9]+ accuracy [0-9.]+ on 32 images' "$out"; then
    ok "example: evaluates on the 32 test images"
  else
    bad "example: no test line for 32 images"; cat "$out"
  fi
  if grep -q 'cast_model_type=f16' "$out"; then ok "example: O2 casts the model to f16"; else bad "example: O2 not reported"; cat "$out"; fi

  # Another level and half type: O3 with bf16 (all half, no masters).
  out="$scratch/example_o3.out"
  if "$example" --data "$scratch/cifar" --steps 1 --batch 16 --test-limit 16 --opt-level O3 --half bf16 >"$out" 2>&1 &&
    has_loss "$out" && grep -q 'cast_model_type=bf16' "$out"; then
    ok "example: O3 bf16 runs"
  else
    bad "example: O3 bf16"; cat "$out"
  fi

  # Errors: a message and a non-zero exit.
  out="$scratch/example_err.out"
  "$example" --data "$scratch/no-such-dir" --steps 1 --batch 16 >"$out" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && grep -q 'error: .*data_batch_1.bin' "$out"; then
    ok "example: a missing data folder fails with a message naming the file"
  else
    bad "example: missing data folder: exit $rc"; cat "$out"
  fi
  "$example" --opt-level O5 >"$out" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && grep -q "error: .*O5" "$out"; then ok "example: a bad --opt-level is refused"; else bad "example: --opt-level O5: exit $rc"; cat "$out"; fi
  "$example" --batch 1x >"$out" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && grep -q "error: --batch" "$out"; then ok "example: a bad --batch is refused"; else bad "example: --batch 1x: exit $rc"; cat "$out"; fi
  "$example" --bogus >"$out" 2>&1
  rc=$?
  if [ $rc = 2 ] && grep -q "error: unknown option '--bogus'" "$out"; then ok "example: an unknown option given last is named as one"; else bad "example: --bogus: exit $rc"; cat "$out"; fi
  head -c 1000 "$scratch/cifar/data_batch_1.bin" >"$scratch/cifar_trunc.bin"
  mkdir -p "$scratch/trunc" && cp "$scratch/cifar/"*.bin "$scratch/trunc/" && cp "$scratch/cifar_trunc.bin" "$scratch/trunc/data_batch_3.bin"
  "$example" --data "$scratch/trunc" --steps 1 --batch 16 >"$out" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && grep -q 'error: .*data_batch_3.bin' "$out"; then
    ok "example: a truncated file fails with a message naming it"
  else
    bad "example: truncated data_batch_3.bin: exit $rc"; cat "$out"
  fi
fi

# --- the CLI on the same data -------------------------------------------------
out="$scratch/train.out"
if "$ampc" train --model resnet18 --dataset cifar10 --data "$scratch/cifar" --epochs 1 --batch-size 16 \
  --train-limit 32 --test-limit 16 --opt-level O2 >"$out" 2>&1; then
  ok "ampc train resnet18 cifar10 O2 exit 0"
else
  bad "ampc train exited non-zero"; cat "$out"
fi
if grep -Eq '^epoch 1: train_loss [0-9]+\.[0-9]+ test_loss [0-9]+\.[0-9]+ test_acc [0-9.]+ ' "$out"; then
  ok "ampc train prints the epoch line"
else
  bad "ampc train: no epoch line with finite losses"; cat "$out"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
