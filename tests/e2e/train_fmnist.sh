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
echo "$pass passed, $fail failed"
[ $fail = 0 ]
