#!/usr/bin/env bash
# Exact resume: N steps in one run == k steps, SIGKILL, resume to N; bit-identical
# final weights and identical metrics, for O0 and O2. Also: SIGTERM saves a
# checkpoint and exits 0; --keep prunes; two runs with the same seed are identical.
set -u
ampc="$1"; dir="$2"
rm -rf "$dir"; mkdir -p "$dir"
data=/usr/share/datasets/fashion-mnist
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
if [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then
  echo "skipped: $data not installed"; echo "0 passed, 0 failed"; exit 0
fi
strip() { python3 -c "
import json,sys
for l in open(sys.argv[1]):
    o=json.loads(l)
    for k in ('images_per_s','seconds','train_seconds'): o.pop(k,None)
    print(json.dumps(o,sort_keys=True))" "$1"; }
for lvl in O0 O2; do
  F=(--model cnn --epochs 2 --train-limit 1536 --test-limit 256 --batch-size 64 --quiet --opt-level $lvl --threads 2)
  "$ampc" train "${F[@]}" --save "$dir/full_$lvl.st" --metrics "$dir/full_$lvl.jsonl" >/dev/null 2>&1 || bad "$lvl full run"
  "$ampc" train "${F[@]}" --save "$dir/again_$lvl.st" --metrics "$dir/again_$lvl.jsonl" >/dev/null 2>&1
  cmp -s "$dir/full_$lvl.st" "$dir/again_$lvl.st" && ok "$lvl same seed twice: identical weights" || bad "$lvl same seed twice"
  # run with checkpoints every 5 steps; kill it once a mid-epoch checkpoint exists
  "$ampc" train "${F[@]}" --checkpoint-dir "$dir/ck_$lvl" --save-every 5 --metrics "$dir/part_$lvl.jsonl" >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    [ -e "$dir/ck_$lvl/ckpt-step-00000010.safetensors" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
  n=$(ls "$dir/ck_$lvl" 2>/dev/null | wc -l)
  [ "$n" -ge 1 ] && ok "$lvl killed run left $n checkpoint(s)" || bad "$lvl no checkpoint before the kill"
  "$ampc" train "${F[@]}" --resume "$dir/ck_$lvl" --save "$dir/res_$lvl.st" --metrics "$dir/part_$lvl.jsonl" >/dev/null 2>"$dir/res_$lvl.err" || { bad "$lvl resume"; cat "$dir/res_$lvl.err"; }
  cmp -s "$dir/full_$lvl.st" "$dir/res_$lvl.st" && ok "$lvl kill + resume: bit-identical weights" || bad "$lvl kill + resume: weights differ"
  if [ "$(strip "$dir/full_$lvl.jsonl")" = "$(strip "$dir/part_$lvl.jsonl" | tail -n "$(wc -l < "$dir/full_$lvl.jsonl")")" ]; then
    ok "$lvl kill + resume: identical metrics"
  else
    bad "$lvl kill + resume: metrics differ"
  fi
done
# SIGTERM: a checkpoint at the end of the current step, exit 0 (1000 epochs: the run is still
# going when the signal comes, however fast the machine)
F=(--model cnn --epochs 1000 --train-limit 2048 --test-limit 128 --quiet --threads 2)
"$ampc" train "${F[@]}" --checkpoint-dir "$dir/term" >/dev/null 2>"$dir/term.err" &
pid=$!
sleep 3
kill -TERM $pid; wait $pid; rc=$?
[ $rc = 0 ] && ok "SIGTERM exits 0" || bad "SIGTERM exit status $rc"
grep -q "^ampc: SIGTERM received at epoch [0-9]*, batch [0-9]*/16: saving a checkpoint at step" "$dir/term.err" &&
  ok "SIGTERM: says where it stopped" || { bad "SIGTERM: no message"; cat "$dir/term.err"; }
ls "$dir/term"/ckpt-step-*.safetensors >/dev/null 2>&1 && ok "SIGTERM saved a checkpoint" || bad "SIGTERM saved nothing"
# --keep 2 keeps the two newest
"$ampc" train --model cnn --epochs 1 --train-limit 1280 --test-limit 128 --quiet --checkpoint-dir "$dir/keep" --save-every 2 --keep 2 >/dev/null 2>&1
n=$(ls "$dir/keep" | wc -l)
[ "$n" = 2 ] && ok "--keep 2 leaves 2 checkpoints" || bad "--keep 2 leaves $n"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
