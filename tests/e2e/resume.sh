#!/usr/bin/env bash
# Exact resume: N steps in one run == k steps, SIGKILL, resume to N; bit-identical
# final weights and identical metrics, for O0 and O2 (with --amp-report: the resumed
# epoch's gradient statistics cover its steps before the resume too; the metrics file
# cut at the checkpoint, so that the steps the killed run took after it, and a last
# line the kill cut short, are not in it twice). Also: SIGTERM saves a
# checkpoint and exits 0; --keep prunes; two runs with the same seed are identical. A
# resume that would change the run (another optimizer or normalisation) or from a
# checkpoint whose counters are past any run's is refused.
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
  F=(--model cnn --epochs 2 --train-limit 1536 --test-limit 256 --batch-size 64 --quiet --opt-level $lvl --threads 2 --log-every 1)
  [ $lvl = O2 ] && F+=(--amp-report)
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
  # the killed run's steps after its last checkpoint, and a record the kill cut short
  last=$(ls "$dir/ck_$lvl" | tail -1 | sed 's/[^0-9]//g; s/^0*//')
  printf '{"step": 99999, "loss": 0.' >> "$dir/part_$lvl.jsonl"
  past=$(python3 -c "
import json, sys
n = 0
for l in open(sys.argv[1]):
    try: o = json.loads(l)
    except ValueError: n += 1; continue
    n += ('epoch' not in o and o.get('step', 0) > int(sys.argv[2]))
print(n)" "$dir/part_$lvl.jsonl" "$last")
  "$ampc" train "${F[@]}" --resume "$dir/ck_$lvl" --save "$dir/res_$lvl.st" --metrics "$dir/part_$lvl.jsonl" 2>"$dir/res_$lvl.err" >/dev/null || { bad "$lvl resume"; cat "$dir/res_$lvl.err"; }
  cmp -s "$dir/full_$lvl.st" "$dir/res_$lvl.st" && ok "$lvl kill + resume: bit-identical weights" || bad "$lvl kill + resume: weights differ"
  if [ "$(strip "$dir/full_$lvl.jsonl")" = "$(strip "$dir/part_$lvl.jsonl")" ]; then
    ok "$lvl kill + resume: identical metrics ($past line(s) past step $last dropped, none twice)"
  else
    bad "$lvl kill + resume: metrics differ"
  fi
done
# The metrics file cut at the checkpoint, from given checkpoints of one run (no kill, so
# no timing): step records past it (--log-every 3: the first record after the resume
# averages the steps since the one before, the checkpoint's too), epoch records past it,
# a whole record whose newline is missing (kept, the newline added); the notice says
# how many lines went, with --quiet too
R=(--model cnn --epochs 2 --train-limit 1536 --test-limit 256 --batch-size 64 --quiet --opt-level O2 --threads 2 --amp-report)
"$ampc" train "${R[@]}" --log-every 3 --checkpoint-dir "$dir/cm" --save-every 5 --metrics "$dir/cm_full.jsonl" >/dev/null 2>&1
"$ampc" train "${R[@]}" --checkpoint-dir "$dir/ce" --save-every 5 --metrics "$dir/ce_full.jsonl" >/dev/null 2>&1
cut_case() { # name, checkpoint, full metrics, the metrics before the resume (a file), expected notice (a pattern)
  local name=$1 ck=$2 full=$3 before=$4 want=$5
  cp "$before" "$dir/cut.jsonl"
  "$ampc" train "${R[@]}" $([ "$full" = "$dir/cm_full.jsonl" ] && echo --log-every 3) --resume "$ck" --metrics "$dir/cut.jsonl" >/dev/null 2>"$dir/cut.err"
  if [ "$(strip "$full")" = "$(strip "$dir/cut.jsonl")" ] && { [ -n "$want" ] && grep -Eq "$want" "$dir/cut.err" || { [ -z "$want" ] && ! grep -q dropped "$dir/cut.err"; }; }; then
    ok "metrics cut at the checkpoint, $name: $(grep -o 'dropped.*' "$dir/cut.err" || echo 'nothing dropped')"
  else
    bad "metrics cut at the checkpoint, $name: $(cat "$dir/cut.err")"
  fi
}
past=$(python3 -c "
import json, sys
print(sum(1 for l in open(sys.argv[1]) if json.loads(l).get('step', 0) > 10 or json.loads(l).get('epoch', 0) > 0))" "$dir/cm_full.jsonl")
cut_case "step records past step 10" "$dir/cm/ckpt-step-00000010.safetensors" "$dir/cm_full.jsonl" "$dir/cm_full.jsonl" \
  "dropped $past lines from the first record past the checkpoint \\(step 10\\) on"
cut_case "the second epoch's record, resumed at step 30" "$dir/ce/ckpt-step-00000030.safetensors" "$dir/ce_full.jsonl" "$dir/ce_full.jsonl" \
  "dropped 1 line from the first record past the checkpoint \\(step 30\\) on"
python3 -c "
import json, sys
ls = [l for l in open(sys.argv[1]) if json.loads(l).get('step', 99) <= 10]
open(sys.argv[2], 'w').write(''.join(ls).rstrip('\\n'))" "$dir/cm_full.jsonl" "$dir/cm_head.jsonl"
cut_case "a whole record without its newline, kept" "$dir/cm/ckpt-step-00000010.safetensors" "$dir/cm_full.jsonl" "$dir/cm_head.jsonl" ""
printf '\n{"step": 11, "lo' >> "$dir/cm_head.jsonl"
cut_case "a last line cut short" "$dir/cm/ckpt-step-00000010.safetensors" "$dir/cm_full.jsonl" "$dir/cm_head.jsonl" \
  "dropped its last line, cut short"
# a resumed epoch whose steps before the resume had no statistics saves none in its checkpoints
"$ampc" train --model cnn --epochs 1 --train-limit 1536 --test-limit 256 --batch-size 64 --quiet --threads 2 --opt-level O2 \
  --checkpoint-dir "$dir/gn" --save-every 5 >/dev/null 2>&1
"$ampc" train "${R[@]}" --epochs 1 --resume "$dir/gn/ckpt-step-00000010.safetensors" --checkpoint-dir "$dir/gm" --save-every 5 >/dev/null 2>&1
has_stats() { python3 -c "
import json, struct, sys
f = open(sys.argv[1], 'rb'); h = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
print('yes' if 'grad_stats' in json.loads(h['__metadata__']['ampc']) else 'no')" "$1"; }
if [ "$(has_stats "$dir/gm/ckpt-step-00000015.safetensors")" = no ] && [ "$(has_stats "$dir/cm/ckpt-step-00000015.safetensors")" = yes ]; then
  ok "--amp-report's statistics saved only where they cover the epoch from its start"
else
  bad "grad_stats in a checkpoint of an epoch resumed without them: $(has_stats "$dir/gm/ckpt-step-00000015.safetensors")"
fi
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
# a stop on an epoch's last step, resumed at another global batch: the run
# goes on at that epoch's end (it resumed at image 530 of 530, batch 10 of
# 11, and trained the epoch's last 30 images again; with more ranks than
# before, at a batch past the epoch, refused). One step an epoch: every stop
# lands on an epoch's last step.
E=(--model mlp --train-limit 530 --test-limit 32 --optimizer sgd --lr 0.01 --threads 1 --quiet)
"$ampc" train "${E[@]}" --batch-size 530 --epochs 100000 --checkpoint-dir "$dir/eend" >/dev/null 2>"$dir/eend.err" &
pid=$!
sleep 2
kill -TERM $pid; wait $pid
ep=$(sed -n 's/^ampc: SIGTERM received at epoch \([0-9]*\), batch 1\/1: saving a checkpoint at step \([0-9]*\).*/\1/p' "$dir/eend.err")
st=$(sed -n 's/^ampc: SIGTERM received at epoch \([0-9]*\), batch 1\/1: saving a checkpoint at step \([0-9]*\).*/\2/p' "$dir/eend.err")
if [ -n "$ep" ] && [ -n "$st" ]; then
  "$ampc" train "${E[@]:0:${#E[@]}-1}" --batch-size 50 --epochs $((ep + 1)) --resume "$dir/eend" > /dev/null 2> "$dir/eend2.err"
  rc=$?
  # 530 / 50: 11 steps in the next epoch, none in the finished one
  if [ $rc = 0 ] && grep -q "^ampc: done in [0-9.]*s: [0-9]* epochs*, $((st + 11)) steps" "$dir/eend2.err"; then
    ok "a stop at an epoch's end, resumed at another --batch-size: the next epoch's 11 steps, none more"
  else
    bad "a stop at an epoch's end resumed at another --batch-size (step $st): exit $rc: $(grep -v '^epoch' "$dir/eend2.err" | tail -2)"
  fi
else
  bad "a stop at an epoch's end: $(cat "$dir/eend.err")"
fi
# a stop on the run's very last step, resumed: the step records are the
# uninterrupted run's (the resumed run, taking no step, wrote a record of
# step 0 with the carried loss, skipped, scale 0)
L=(--model cnn --threads 1 --test-limit 64 --train-limit 2000 --batch-size 500 --epochs 1 --log-every 3 --quiet)
"$ampc" train "${L[@]}" --metrics "$dir/last_full.jsonl" > /dev/null 2>&1
"$ampc" train "${L[@]}" --metrics "$dir/last.jsonl" --checkpoint-dir "$dir/last" > /dev/null 2>&1 &
pid=$!
for i in $(seq 1 3000); do grep -q '"step":3,' "$dir/last.jsonl" 2>/dev/null && break; sleep 0.01; done
kill -TERM $pid; wait $pid
"$ampc" train "${L[@]}" --metrics "$dir/last.jsonl" --checkpoint-dir "$dir/last" --resume "$dir/last" > /dev/null 2>&1
if python3 - "$dir/last_full.jsonl" "$dir/last.jsonl" <<'EOF'
import json, sys
def steps(p):
    return [o for o in map(json.loads, open(p)) if "step" in o and "epoch" not in o]
a, b = steps(sys.argv[1]), steps(sys.argv[2])
sys.exit(0 if a == b and [o["step"] for o in a] == [3, 4] else 1)
EOF
then ok "a stop on the run's last step, resumed: the step records are the uninterrupted run's"
else bad "a stop on the run's last step: step records $(grep -v '"epoch"' "$dir/last.jsonl" | cut -c1-60 | tr '\n' ' ')"; fi
# --keep 2 keeps the two newest
"$ampc" train --model cnn --epochs 1 --train-limit 1280 --test-limit 128 --quiet --checkpoint-dir "$dir/keep" --save-every 2 --keep 2 >/dev/null 2>&1
n=$(ls "$dir/keep" | wc -l)
[ "$n" = 2 ] && ok "--keep 2 leaves 2 checkpoints" || bad "--keep 2 leaves $n"
# a resume that would not continue the run as it was: refused with one line naming the flag or
# the checkpoint's field, exit 1, nothing trained
A=(--model mlp --train-limit 256 --test-limit 64 --batch-size 32 --threads 1 --quiet)
"$ampc" train "${A[@]}" --epochs 1 --checkpoint-dir "$dir/r_adam" >/dev/null 2>&1 || bad "mlp adam run"
"$ampc" train "${A[@]}" --epochs 1 --checkpoint-dir "$dir/r_sgd" --optimizer sgd --momentum 0.9 >/dev/null 2>&1 || bad "mlp sgd run"
refused() { # message pattern, args...
  local pat=$1; shift
  "$ampc" train "${A[@]}" --epochs 2 "$@" </dev/null >"$dir/r.out" 2>"$dir/r.err"
  local rc=$?
  if [ $rc = 1 ] && [ "$(wc -l < "$dir/r.err")" = 1 ] && grep -Eq "^ampc: error: .*$pat" "$dir/r.err" && ! grep -q "^epoch" "$dir/r.out"; then
    ok "resume $(echo "$*" | sed "s|$dir/||g"): $(sed "s|$dir/||g" "$dir/r.err")"
  else
    bad "resume $*: exit $rc: $(cat "$dir/r.err" "$dir/r.out")"
  fi
}
refused "was trained with optimizer adam, not sgd \\(--optimizer\\)" --resume "$dir/r_adam" --optimizer sgd
refused "was trained with optimizer sgd, not adam \\(--optimizer\\)" --resume "$dir/r_sgd" --optimizer adam
refused "was trained with --normalize on, not off" --resume "$dir/r_adam" --normalize off
refused "was trained on fashion-mnist, .*not mnist's \\(--dataset\\)" --resume "$dir/r_adam" --dataset mnist --data "$data"
# the run state's counters, each past any run, written into a copy of the checkpoint
edit() { # out, key=JSON value ...
  python3 - "$(ls "$dir"/r_adam/ckpt-step-*.safetensors | tail -1)" "$@" <<'PY'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
with open(src, "rb") as f:
    head = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    data = f.read()
run = json.loads(head["__metadata__"]["ampc"])
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1)
    run[k] = json.loads(v)
head["__metadata__"]["ampc"] = json.dumps(run, separators=(",", ":"), sort_keys=True)
h = json.dumps(head, separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)
with open(dst, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + data)
PY
}
edit "$dir/r_same.st" && "$ampc" train "${A[@]}" --epochs 2 --resume "$dir/r_same.st" >/dev/null 2>"$dir/r.err" &&
  ok "resume from an edited copy of the checkpoint, nothing changed: trains" || { bad "resume from an unchanged copy"; cat "$dir/r.err"; }
while IFS='|' read -r pat kv; do
  # shellcheck disable=SC2086
  edit "$dir/r_bad.st" $kv && refused "r_bad.st: $pat" --resume "$dir/r_bad.st"
done <<'CASES'
'step' = 9223372036854775807 is outside \[0, 1099511627776\]|step=9223372036854775807
'seen' = 4611686018427387904 is outside \[0, 9007199254740992\]|seen=4611686018427387904
'loss_sum' = 1e\+300 is more than 1e\+30 per image of 'seen' = 64|seen=64 loss_sum=1e300
'optimizer_step' = 9 is more than 'step' = 8|optimizer_step=9
'optimizer' is 'lamb', not one of sgd, adam or adamw|optimizer="lamb"
'global_batch' = 4611686018427387904 is outside \[1, 2147483648\]|batch=5 global_batch=4611686018427387904
'batch' = 4194305 of 'global_batch' = 2147483648 images is more than 9007199254740992|batch=4194305 global_batch=2147483648
'grad_stats' is not an object|grad_stats=[1,2,3]
grad_stats 'values' = -1 is outside \[0, 4611686018427387904\]|grad_stats={"values":-1,"underflow":0,"max_abs":1}
grad_stats 'underflow' = 11 is outside \[0, 10\]|grad_stats={"values":10,"underflow":11,"max_abs":1}
grad_stats 'max_abs' is negative or past the largest f32|grad_stats={"values":10,"underflow":1,"max_abs":1e39}
grad_stats 'max_abs' is missing or not a number|grad_stats={"values":10,"underflow":1}
CASES
echo "$pass passed, $fail failed"
[ $fail = 0 ]
