#!/usr/bin/env bash
# Trains the cnn on a slice of the real Fashion-MNIST and checks that it learns,
# that the metrics file has the documented keys, and that saved weights
# evaluate to the same accuracy.
set -u
ampc="$1"; dir="$2"
rm -rf "$dir"; mkdir -p "$dir"
data=/usr/share/datasets/fashion-mnist
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
if [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then
  echo "skipped: $data not installed (apt-get install dataset-fashion-mnist)"
  echo "0 passed, 0 failed"
  exit 0
fi
for lvl in O0 O2; do
  if "$ampc" train --model cnn --epochs 1 --train-limit 4096 --test-limit 1000 --opt-level $lvl --quiet \
       --metrics "$dir/m_$lvl.jsonl" --save "$dir/w_$lvl.safetensors" > "$dir/out_$lvl.txt" 2>&1; then
    ok "train $lvl exits 0"
  else
    bad "train $lvl exits 0"; cat "$dir/out_$lvl.txt"; continue
  fi
  acc=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['test_acc'])" "$dir/m_$lvl.jsonl" 2>/dev/null)
  if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > 0.70 else 1)" "$acc"; then ok "$lvl learns (test_acc $acc > 0.70)"; else bad "$lvl learns (test_acc $acc)"; fi
  keys=$(python3 -c "import json,sys; o=json.loads(open(sys.argv[1]).readline()); print(all(k in o for k in ['epoch','train_loss','test_loss','test_acc','images_per_s','seconds','loss_scale','skipped_steps','memory']))" "$dir/m_$lvl.jsonl")
  [ "$keys" = True ] && ok "$lvl metrics keys" || bad "$lvl metrics keys"
  ev=$("$ampc" eval --model cnn --weights "$dir/w_$lvl.safetensors" --test-limit 1000 --opt-level $lvl 2>&1)
  eacc=$(echo "$ev" | sed -n 's/.*test_acc \([0-9.]*\).*/\1/p')
  if python3 -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) - float(sys.argv[2])) < 0.003 else 1)" "$acc" "$eacc"; then
    ok "$lvl eval of saved weights ($eacc) matches training's ($acc)"
  else
    bad "$lvl eval of saved weights: '$ev' vs $acc"
  fi
done
# --amp-report shows what loss scaling is for: with a scale of 1 a share of the
# f16 gradient values underflows, with the dynamic scale almost none does
for ls in 1 dynamic; do
  "$ampc" train --model cnn --epochs 1 --train-limit 1024 --test-limit 256 --opt-level O2 --loss-scale $ls --amp-report \
    --quiet --metrics "$dir/ar_$ls.jsonl" > /dev/null 2>&1 || bad "amp-report run with loss scale $ls"
done
if python3 - "$dir/ar_1.jsonl" "$dir/ar_dynamic.jsonl" <<'PY'
import json, sys
one, dyn = (json.loads(open(f).readline())["grad_underflow_fraction"] for f in sys.argv[1:3])
print(f"grad_underflow_fraction: loss scale 1 {one:.3g}, dynamic {dyn:.3g}")
sys.exit(0 if one > 1e-3 and one > 100 * dyn else 1)
PY
then ok "--amp-report: underflow with loss scale 1, almost none with dynamic scaling"; else bad "--amp-report underflow fractions"; fi
echo "$pass passed, $fail failed"
[ $fail = 0 ]
