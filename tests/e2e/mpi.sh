#!/usr/bin/env bash
# Data-parallel training under mpirun, 2 ranks x 1 thread (issue 13):
# - equivalence: 2 ranks x batch 64 end 30 steps where 1 rank x batch 128
#   on the same global batches ends -- the mlp, and the cnn with --sync-bn,
#   at O0 and O2, with --allreduce-type f32 too -- as close as one process
#   with another summation order gets (2 threads, im2col convolutions);
#   the same over TCP only (--mca btl tcp,self), bit for bit
# - an inf injected into one rank's batch: both ranks skip that step with
#   the same new scale; clipping gives the same norm on every rank
# - ZeRO-1: the same weights and checkpoint tensors as without it, master +
#   optimizer bytes per rank <= 0.55x
# - faults: kill -9 of a rank ends the job naming the rank; resume with 2
#   ranks ends bit-identical to an unbroken run, with 1 rank it continues; a
#   rank that fails ends the job with its error; diverged ranks are an error;
#   kill -9 of mpirun leaves no rank behind and resume continues from the
#   last checkpoint
# - ampc bench under mpirun reports the all-reduce; metrics carry world_size
# - ranks started with different options (MPMD) are refused once, naming the
#   option (or the rank whose command line has an error); a last global batch
#   of fewer images than ranks is left out (batches of 1), one of 3 images
#   trains as it does in one process
#   bash mpi.sh <path to ampc> <scratch dir>
set -u
ampc="$1"; dir="$2"
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dir"; mkdir -p "$dir"
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
finish() { echo "$pass passed, $fail failed"; [ $fail = 0 ]; exit $?; }
data=/usr/share/datasets/fashion-mnist
if ! command -v mpirun > /dev/null 2>&1; then
  echo "skipped: no mpirun (Debian: openmpi-bin)"; finish
fi
if ! "$ampc" --version | grep -q 'MPI: built'; then
  echo "skipped: this ampc was built without MPI"; finish
fi
if [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then
  echo "skipped: $data not installed"; finish
fi
export OMP_NUM_THREADS=1
MPI=(mpirun --allow-run-as-root --oversubscribe -np 2)
stcmp() { python3 "$here/mpi_compare.py" "$@"; }
# the largest relative difference stcmp printed
err() { sed -n 's/.*max |a - b| \/ max |a| = \([^ ]*\) .*/\1/p'; }
le() { python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)" "$1" "$2"; }
# every rank's hash of its final weights (AMPC_TEST_STEP_LOG) is the same
same_ranks() { [ "$(grep -c 'ampc: test: rank [01] weights' "$1")" = 2 ] && [ "$(sed -n 's/.*rank [01] weights //p' "$1" | sort -u | wc -l)" = 1 ]; }

# --- equivalence: 30 global batches of 128 -----------------------------------------------
# SGD (Adam turns a rounding of a near-zero gradient into a step of lr);
# at O2 a static loss scale: a rank's f16 gradient of its half batch (its
# mean over 64 images) can overflow at the dynamic scale's 2^16 where the
# full batch's does not, and then the ranks skip a step one process takes
E=(--epochs 1 --train-limit 3840 --test-limit 128 --quiet --seed 3 --optimizer sgd --lr 0.01)
for cfg in "mlp O0" "mlp O2" "cnn O0" "cnn O2"; do
  set -- $cfg; m=$1; lvl=$2
  X=(--model "$m" --opt-level "$lvl"); [ "$lvl" = O2 ] && X+=(--loss-scale 1024)
  S=(); [ "$m" = cnn ] && S=(--sync-bn)
  t=${m}_$lvl
  "$ampc" train "${E[@]}" "${X[@]}" --batch-size 128 --threads 1 --save "$dir/one_$t.st" > /dev/null 2>&1 || bad "$t: 1 rank"
  C=(); [ "$m" = cnn ] && C=(--conv im2col)
  "$ampc" train "${E[@]}" "${X[@]}" --batch-size 128 --threads 2 "${C[@]}" --save "$dir/order_$t.st" > /dev/null 2>&1 || bad "$t: 1 rank, 2 threads"
  [ "$m" = mlp ] && { "$ampc" train "${E[@]}" "${X[@]}" --batch-size 64 --grad-accum 2 --threads 1 --save "$dir/accum_$t.st" > /dev/null 2>&1 || bad "$t: 1 rank, 2 micro-batches"; }
  AMPC_TEST_STEP_LOG=1 "${MPI[@]}" "$ampc" train "${E[@]}" "${X[@]}" "${S[@]}" --batch-size 64 --threads 1 --save "$dir/two_$t.st" \
    --metrics "$dir/two_$t.jsonl" > /dev/null 2> "$dir/two_$t.err" || { bad "$t: 2 ranks"; cat "$dir/two_$t.err"; }
  # the noise of summing the same batch in another order in one process: with
  # 2 threads and other convolution kernels, and for the mlp (no batch norm,
  # whose statistics a micro-batch changes) in two micro-batches of 64: at O2
  # each half's gradient then rounds to f16 before the sum, as a rank's does
  # before the all-reduce (with a BLAS whose sums do not depend on the thread
  # count that is the only difference)
  b1=$(stcmp "$dir/one_$t.st" "$dir/order_$t.st" | err); b2=0
  [ "$m" = mlp ] && b2=$(stcmp "$dir/one_$t.st" "$dir/accum_$t.st" | err)
  base=$(python3 -c "print(max(float('${b1:-nan}'), float('${b2:-nan}')))")
  e2=$(stcmp "$dir/one_$t.st" "$dir/two_$t.st" | err)
  tol=$(python3 -c "print(max(4 * float('$base'), 1e-6))")
  if [ -n "$e2" ] && le "$e2" "$tol"; then
    ok "$t${S:+ ${S[*]}}: 2 ranks x 64 vs 1 rank x 128 after 30 steps: $e2 (1 rank with another summation order: $base)"
  else
    bad "$t: 2 ranks x 64 vs 1 rank x 128: '$e2', more than 4 x $base"
  fi
  same_ranks "$dir/two_$t.err" && ok "$t: both ranks end with the same weights" || bad "$t: the ranks' weights differ"
  if [ "$lvl" = O2 ]; then
    "${MPI[@]}" "$ampc" train "${E[@]}" "${X[@]}" "${S[@]}" --batch-size 64 --threads 1 --allreduce-type f32 --save "$dir/f32_$t.st" > /dev/null 2>&1 || bad "$t: --allreduce-type f32"
    e3=$(stcmp "$dir/one_$t.st" "$dir/f32_$t.st" | err)
    if [ -n "$e3" ] && le "$e3" "$tol"; then ok "$t --allreduce-type f32: $e3"; else bad "$t --allreduce-type f32: '$e3'"; fi
  fi
done
if python3 -c "import json,sys; o=json.loads(open(sys.argv[1]).readline()); sys.exit(0 if o['world_size']==2 and o['global_batch_size']==128 and 'comm_hidden_fraction' in o else 1)" "$dir/two_cnn_O2.jsonl"; then
  ok "metrics carry world_size 2, global_batch_size 128 and the all-reduce's time"
else
  bad "metrics: $(head -c 300 "$dir/two_cnn_O2.jsonl")"
fi
# the step records' loss under --grad-accum with a partial last micro-batch
# (500 = 10 x 48 + 20): 2 ranks record what one process does, the mean of
# the step's micro-batch losses (they recorded the images' mean, which
# weighs the short one less than the step's gradient does)
G=(--model mlp --epochs 1 --train-limit 500 --test-limit 64 --quiet --optimizer sgd --lr 0.01 --grad-accum 3 --threads 1 --log-every 1)
"$ampc" train "${G[@]}" --batch-size 48 --metrics "$dir/acc1.jsonl" > /dev/null 2>&1 || bad "grad-accum: 1 rank"
"${MPI[@]}" "$ampc" train "${G[@]}" --batch-size 24 --metrics "$dir/acc2.jsonl" > /dev/null 2>&1 || bad "grad-accum: 2 ranks"
if python3 - "$dir/acc1.jsonl" "$dir/acc2.jsonl" <<'EOF'
import json, sys
def steps(p):
    return {o["step"]: o["loss"] for o in map(json.loads, open(p)) if "step" in o and "epoch" not in o}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert sorted(a) == sorted(b) == [1, 2, 3, 4], (sorted(a), sorted(b))
worst = max(abs(a[k] - b[k]) / abs(a[k]) for k in a)
print("largest relative difference", worst)
sys.exit(0 if worst <= 1e-5 else 1)
EOF
then ok "--grad-accum 3 with a partial last micro-batch: 2 ranks' step losses are one process's"
else bad "--grad-accum step losses: 2 ranks against 1 process differ"; fi

# TCP only: the same reductions over another transport
for t in mlp_O0 cnn_O2; do
  X=(--model "${t%_*}" --opt-level "${t#*_}"); [ "$t" = cnn_O2 ] && X+=(--loss-scale 1024 --sync-bn)
  "${MPI[@]}" --mca btl tcp,self "$ampc" train "${E[@]}" "${X[@]}" --batch-size 64 --threads 1 --save "$dir/tcp_$t.st" > /dev/null 2>&1 || bad "$t over TCP"
  stcmp "$dir/two_$t.st" "$dir/tcp_$t.st" --exact > /dev/null && ok "$t over TCP only (--mca btl tcp,self): bit-identical to shared memory" ||
    bad "$t over TCP: $(stcmp "$dir/two_$t.st" "$dir/tcp_$t.st")"
done

# --- an inf on one rank; clipping ---------------------------------------------------------
AMPC_TEST_INF_AT=1:5 AMPC_TEST_STEP_LOG=1 "${MPI[@]}" "$ampc" train --model mlp --opt-level O2 --epochs 1 --train-limit 1280 --test-limit 128 \
  --batch-size 64 --threads 1 --quiet --clip-grad-norm 0.5 --metrics "$dir/inf.jsonl" --log-every 1 > /dev/null 2> "$dir/inf.err" || bad "inf run"
r0=$(sed -n 's/^ampc: test: rank 0 step 5 //p' "$dir/inf.err"); r1=$(sed -n 's/^ampc: test: rank 1 step 5 //p' "$dir/inf.err")
if echo "$r0" | grep -q '^applied 0 scale 32768 ' && [ "$r0" = "$r1" ]; then
  ok "an inf in rank 1's batch: both ranks skip step 5, scale 65536 -> 32768 on both ($r1)"
else
  bad "inf on rank 1: rank 0 '$r0', rank 1 '$r1'"
fi
grep -q '"skipped":true' "$dir/inf.jsonl" && ok "rank 0's metrics record the skipped step" || bad "no skipped step in the metrics"
n0=$(sed -n 's/^ampc: test: rank 0 step [0-9]* applied 1 .*grad_norm //p' "$dir/inf.err"); n1=$(sed -n 's/^ampc: test: rank 1 step [0-9]* applied 1 .*grad_norm //p' "$dir/inf.err")
if [ -n "$n0" ] && [ "$n0" = "$n1" ]; then ok "clipping: the same gradient norm on both ranks at all $(echo "$n0" | wc -l) applied steps"; else bad "norms differ between ranks"; fi
same_ranks "$dir/inf.err" && ok "inf run: both ranks end with the same weights" || bad "inf run: weights differ"

# --- ZeRO-1 ---------------------------------------------------------------------------------
Z=(--epochs 1 --train-limit 1280 --test-limit 128 --quiet --batch-size 64 --threads 1)
for t in mlp_O2 cnn_O0; do
  X=(--model "${t%_*}" --opt-level "${t#*_}")
  "${MPI[@]}" "$ampc" train "${Z[@]}" "${X[@]}" --save "$dir/z0_$t.st" --metrics "$dir/z0_$t.jsonl" --checkpoint-dir "$dir/z0ck_$t" > /dev/null 2>&1 || bad "$t without ZeRO"
  "${MPI[@]}" "$ampc" train "${Z[@]}" "${X[@]}" --zero 1 --save "$dir/z1_$t.st" --metrics "$dir/z1_$t.jsonl" --checkpoint-dir "$dir/z1ck_$t" > /dev/null 2>&1 || bad "$t --zero 1"
  stcmp "$dir/z0_$t.st" "$dir/z1_$t.st" --exact > /dev/null && ok "$t --zero 1: the same weights as without ZeRO, bit for bit" || bad "$t --zero 1: $(stcmp "$dir/z0_$t.st" "$dir/z1_$t.st")"
  c0=$(ls "$dir/z0ck_$t"/ckpt-step-*.safetensors 2>/dev/null | tail -1); c1=$(ls "$dir/z1ck_$t"/ckpt-step-*.safetensors 2>/dev/null | tail -1)
  if [ -n "$c1" ] && stcmp "$c0" "$c1" --exact > /dev/null; then ok "$t --zero 1: the checkpoint (masters and optimizer state gathered) is the unsharded one"; else bad "$t --zero 1 checkpoint: $(stcmp "$c0" "$c1" 2>&1)"; fi
  ratio=$(python3 -c "
import json,sys
def mo(p):
    m=json.loads(open(p).readline())['memory']; return m['master_weights']['total']+m['optimizer_state']['total']
print('%.3f' % (mo(sys.argv[2]) / mo(sys.argv[1])))" "$dir/z0_$t.jsonl" "$dir/z1_$t.jsonl")
  le "$ratio" 0.55 && ok "$t --zero 1: accounted master + optimizer bytes per rank $ratio x the unsharded" || bad "$t --zero 1: ratio $ratio"
done

# --- faults ----------------------------------------------------------------------------------
F1=(--model cnn --opt-level O2 --epochs 2 --train-limit 2560 --test-limit 128 --batch-size 64 --threads 1)
F=("${F1[@]}" --quiet)
"${MPI[@]}" "$ampc" train "${F[@]}" --save "$dir/full.st" > /dev/null 2>&1 || bad "unbroken 2-rank run"
# signal_rank1 SIGNAL CKDIR ERRFILE ARGS...: starts a 2-rank run of ARGS saving checkpoints every 5
# steps in CKDIR (stderr to ERRFILE), sends SIGNAL to rank 1 once step 10's checkpoint exists, and
# waits up to 30 s for the job to end; sets victim (rank 1's pid, empty when it was not found) and rc
signal_rank1() {
  local sig=$1 ck=$2 err=$3; shift 3
  "${MPI[@]}" "$ampc" train "$@" --checkpoint-dir "$ck" --save-every 5 > /dev/null 2> "$err" &
  local mpid=$!
  victim=""
  for _ in $(seq 1 600); do
    if [ -e "$ck/ckpt-step-00000010.safetensors" ]; then
      for p in $(pgrep -P $mpid); do
        tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && victim=$p
      done
      break
    fi
    kill -0 $mpid 2> /dev/null || break
    sleep 0.1
  done
  [ -n "$victim" ] && kill -"$sig" "$victim"
  for _ in $(seq 1 300); do kill -0 $mpid 2> /dev/null || break; sleep 0.1; done
  if kill -0 $mpid 2> /dev/null; then
    bad "the job still runs 30 s after SIG$sig to rank 1"; kill -9 $mpid
  fi
  wait $mpid; rc=$?
}
# kill -9 of rank 1 once a mid-epoch checkpoint exists
signal_rank1 KILL "$dir/ck" "$dir/kill.err" "${F[@]}"
if [ -n "$victim" ] && [ $rc != 0 ] && grep -q 'rank 1 .*exited on signal 9' "$dir/kill.err"; then
  ok "kill -9 of rank 1: the job ends (status $rc): $(grep -o 'process rank 1 .*exited on signal 9[^.]*' "$dir/kill.err" | head -1)"
else
  bad "kill -9 of rank 1 (pid '$victim'): status $rc: $(head -5 "$dir/kill.err")"
fi
# SIGTERM to rank 1 alone: every rank stops after the same step, rank 0 names the signal and
# where it came from, saves a checkpoint, and the job ends cleanly
signal_rank1 TERM "$dir/ckt" "$dir/term.err" --model cnn --opt-level O2 --epochs 1000 --train-limit 2560 --test-limit 128 \
  --batch-size 64 --threads 1 --quiet
if [ -n "$victim" ] && [ $rc = 0 ] && grep -q '^ampc: SIGTERM (by another rank) received at epoch [0-9]*, batch [0-9]*/[0-9]*: saving a checkpoint at step' "$dir/term.err" &&
  grep -q 'resume with: ampc train ... --resume' "$dir/term.err"; then
  ok "SIGTERM to rank 1: $(grep -o 'SIGTERM (by another rank) received at epoch [0-9]*, batch [0-9/]*' "$dir/term.err"), a checkpoint saved, status 0"
else
  bad "SIGTERM to rank 1 (pid '$victim'): status $rc: $(head -5 "$dir/term.err")"
fi
cp -r "$dir/ck" "$dir/ck1"
"${MPI[@]}" "$ampc" train "${F[@]}" --resume "$dir/ck" --save "$dir/res2.st" > /dev/null 2> "$dir/res2.err" || { bad "2-rank resume"; cat "$dir/res2.err"; }
stcmp "$dir/full.st" "$dir/res2.st" --exact > /dev/null && ok "resume with 2 ranks: bit-identical to the unbroken 2-rank run" || bad "2-rank resume: $(stcmp "$dir/full.st" "$dir/res2.st")"
"$ampc" train "${F1[@]}" --batch-size 128 --threads 2 --resume "$dir/ck1" --save "$dir/res1.st" > /dev/null 2> "$dir/res1.err"; rc=$?
from=$(sed -n 's/^ampc: resumed from .* at \(epoch .*\)$/\1/p' "$dir/res1.err")
if [ $rc = 0 ] && [ -n "$from" ] && [ -s "$dir/res1.st" ]; then
  ok "resume with 1 rank x 128 from the 2-rank checkpoint continues at $from; against the unbroken 2-rank run: $(stcmp "$dir/full.st" "$dir/res1.st")"
else
  bad "1-rank resume: status $rc: $(cat "$dir/res1.err")"
fi
# a rank that fails (a failing call) ends the job with its error, at once
timeout 60 "${MPI[@]}" env AMPC_TEST_FAIL_AT=1:3 "$ampc" train "${F[@]}" > /dev/null 2> "$dir/failrank.err"; rc=$?
if [ $rc != 0 ] && [ $rc != 124 ] && [ "$(grep -c '^ampc: error: ' "$dir/failrank.err")" = 1 ] && grep -q '^ampc: error: rank 1: step 3' "$dir/failrank.err"; then
  ok "a failing rank ends the job (status $rc): $(grep '^ampc: error' "$dir/failrank.err")"
else
  bad "failing rank: status $rc: $(head -3 "$dir/failrank.err")"
fi
# ranks whose loss scales drift apart: an error at the epoch's rank check
timeout 60 "${MPI[@]}" env AMPC_TEST_DIVERGE_AT=1:3 "$ampc" train "${F[@]}" --epochs 1 > /dev/null 2> "$dir/diverge.err"; rc=$?
if [ $rc != 0 ] && [ $rc != 124 ] && grep -q '^ampc: error: epoch 1: amp: the ranks have diverged: loss scale' "$dir/diverge.err"; then
  ok "diverged ranks are an error: $(grep '^ampc: error' "$dir/diverge.err" | head -1)"
else
  bad "divergence: status $rc: $(head -3 "$dir/diverge.err")"
fi
# a set-up error of every rank: said once, no hang
timeout 60 "${MPI[@]}" "$ampc" train --model cnn --quiet --resume "$dir/nothing-here" > /dev/null 2> "$dir/setup.err"; rc=$?
if [ $rc = 1 ] && [ "$(grep -c 'ampc: error' "$dir/setup.err")" = 1 ] && grep -q "^ampc: error: rank 0: --resume: '.*nothing-here'" "$dir/setup.err"; then
  ok "a set-up error: one line naming the first rank, status 1"
else
  bad "set-up error: status $rc: $(cat "$dir/setup.err")"
fi
timeout 60 "${MPI[@]}" "$ampc" train --zero 2 > /dev/null 2> "$dir/usage.err"; rc=$?
[ "$(grep -c 'ampc: error' "$dir/usage.err")" = 1 ] && grep -q '^ampc: error: --zero: must be at most 1, got 2' "$dir/usage.err" && ok "a usage error: said once by rank 0" ||
  bad "usage error: $(cat "$dir/usage.err")"
# the commands that run in one process refuse a launcher of several: said once, exit 2
timeout 60 "${MPI[@]}" "$ampc" summary --model mlp > "$dir/one.out" 2> "$dir/one.err"; rc=$?
[ $rc != 0 ] && [ "$(grep -c 'ampc: error' "$dir/one.err")" = 1 ] && grep -q 'summary runs in one process' "$dir/one.err" && [ ! -s "$dir/one.out" ] &&
  ok "summary under mpirun -np 2: refused once (status $rc)" || bad "summary under mpirun: status $rc: $(cat "$dir/one.err" "$dir/one.out")"
# kill -9 of the launcher: no rank survives it, and resume continues from the last checkpoint.
# A run of 320 steps, so that the kill lands mid-run however fast the machine (F's 40 steps took a
# fast one past its end: the ranks go on for about a second after mpirun dies), against its own unbroken run.
FL=(--model cnn --opt-level O2 --epochs 1 --train-limit 40960 --test-limit 128 --batch-size 64 --threads 1 --quiet)
"${MPI[@]}" "$ampc" train "${FL[@]}" --save "$dir/fullL.st" > /dev/null 2>&1 || bad "unbroken 2-rank run of 320 steps"
"${MPI[@]}" "$ampc" train "${FL[@]}" --checkpoint-dir "$dir/ckl" --save-every 5 > /dev/null 2>&1 &
mpid=$!
ranks=""
for _ in $(seq 1 600); do
  [ -e "$dir/ckl/ckpt-step-00000010.safetensors" ] && { ranks=$(pgrep -P $mpid | tr '\n' ' '); break; }
  kill -0 $mpid 2> /dev/null || break
  sleep 0.1
done
kill -9 $mpid; wait $mpid 2> /dev/null
left=""
for _ in $(seq 1 100); do
  left=""
  for p in $ranks; do kill -0 "$p" 2> /dev/null && left="$left $p"; done
  [ -z "$left" ] && break
  sleep 0.1
done
if [ -n "$ranks" ] && [ -z "$left" ]; then ok "kill -9 of mpirun: its ranks ($ranks) end too"; else bad "kill -9 of mpirun: ranks left:$left"; for p in $left; do kill -9 "$p"; done; fi
last=$(ls "$dir/ckl" | sed -n 's/^ckpt-step-0*\([0-9]*\)\.safetensors$/\1/p' | sort -n | tail -1)
"${MPI[@]}" "$ampc" train "${FL[@]}" --resume "$dir/ckl" --save "$dir/resl.st" > /dev/null 2> "$dir/resl.err"; rc=$?
stcmp "$dir/fullL.st" "$dir/resl.st" --exact > /dev/null && ok "resume after kill -9 of mpirun: from step $last, bit-identical to the unbroken run" ||
  bad "resume after killing mpirun: status $rc $(cat "$dir/resl.err")"

# --- bench -----------------------------------------------------------------------------------
if "${MPI[@]}" "$ampc" bench --model cnn --batch-size 32 --steps 2 --threads 1 --opt-level O2 --json > "$dir/bench.json" 2> "$dir/bench.err" &&
  python3 -c "import json,sys; o=json.load(open(sys.argv[1])); sys.exit(0 if o['world_size']==2 and o['comm_buckets']>=1 and 'comm_hidden_fraction' in o else 1)" "$dir/bench.json"; then
  ok "ampc bench under mpirun: $(python3 -c "import json,sys; o=json.load(open(sys.argv[1])); print('%d ranks, %.0f images/s, all-reduce %.1f ms alone, %.1f ms exposed' % (o['world_size'], o['images_per_s'], 1e3*o['comm_blocking_seconds_per_step'], 1e3*o['comm_exposed_seconds_per_step']))" "$dir/bench.json")"
else
  bad "bench under mpirun: $(cat "$dir/bench.json" "$dir/bench.err")"
fi

# --- ranks started alike, and short last batches (each rank needs an image) --------------------
C=(--model mlp --epochs 1 --batch-size 64 --threads 1 --test-limit 100 --quiet --train-limit 640)
for extra in "--epochs 2" "--seed 7" "--zero 1"; do
  mpirun --allow-run-as-root --oversubscribe -np 1 "$ampc" train "${C[@]}" : -np 1 "$ampc" train "${C[@]}" $extra > /dev/null 2> "$dir/mm.err"
  rc=$?; o=${extra%% *}
  if [ $rc = 2 ] && [ "$(grep -c "^ampc: error: $o is not the same on every rank" "$dir/mm.err")" = 1 ]; then ok "ranks started with $o differing: refused once, exit 2"
  else bad "ranks started with $extra differing: exit $rc, $(head -2 "$dir/mm.err")"; fi
done
mpirun --allow-run-as-root --oversubscribe -np 1 "$ampc" train "${C[@]}" : -np 1 "$ampc" train "${C[@]}" --bogus > /dev/null 2> "$dir/mm.err"
rc=$?
if [ $rc = 2 ] && grep -q "^ampc: error: the ranks were started with different command lines: rank 1's has an error" "$dir/mm.err"; then
  ok "one rank's command line has an error: refused, naming the rank"
else bad "one rank's bad command line: exit $rc, $(head -2 "$dir/mm.err")"; fi
# --allreduce-type f32 where the gradients are f32 already (O0): refused as doing nothing
"${MPI[@]}" "$ampc" train "${C[@]}" --allreduce-type f32 > /dev/null 2> "$dir/arf.err"
rc=$?
if [ $rc = 2 ] && [ "$(grep -c "^ampc: error: --allreduce-type f32: this run's gradients are f32 already" "$dir/arf.err")" = 1 ]; then
  ok "--allreduce-type f32 at O0: refused once, exit 2"
else bad "--allreduce-type f32 at O0: exit $rc, $(head -2 "$dir/arf.err")"; fi
# one rank's set-up fails (its data folder does not exist): the job ends with that
# rank's error, and rank 0 leaves no checkpoint folder (before: the ranks met in
# different collectives, and MPI said only "MPI_ERR_TRUNCATE")
mpirun --allow-run-as-root --oversubscribe -np 1 "$ampc" train "${C[@]}" --checkpoint-dir "$dir/rk/ck" : \
  -np 1 "$ampc" train "${C[@]}" --checkpoint-dir "$dir/rk/ck" --data "$dir/nosuch" > /dev/null 2> "$dir/rk.err"
rc=$?
if [ $rc = 1 ] && grep -q "^ampc: error: rank 1: fashion-mnist: cannot find train-images" "$dir/rk.err" && ! grep -q "MPI_ERR" "$dir/rk.err" &&
  [ ! -e "$dir/rk/ck" ]; then ok "one rank's data folder missing: exit 1, that rank's error, no checkpoint folder left"
else bad "one rank's bad data folder: exit $rc, $(head -2 "$dir/rk.err"), $(ls -a "$dir/rk/ck" 2>&1 | tr '\n' ' ')"; fi
# ranks whose data differ in size: an error naming it, not a run that trains nothing
mkdir -p "$dir/small"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte; do zcat "$data/$f.gz" > "$dir/small/$f"; done
for f in t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do ln -sf "$data/$f.gz" "$dir/small/$f.gz"; done
python3 -c "
import struct, sys
d = sys.argv[1]
for f, hdr, rec in (('train-images-idx3-ubyte', 16, 784), ('train-labels-idx1-ubyte', 8, 1)):
    b = bytearray(open(d + '/' + f, 'rb').read()[:hdr + 300 * rec]); b[4:8] = struct.pack('>I', 300)
    open(d + '/' + f, 'wb').write(b)
" "$dir/small"
D=(--model mlp --epochs 1 --batch-size 16 --threads 1 --test-limit 64 --quiet)
mpirun --allow-run-as-root --oversubscribe -np 1 "$ampc" train "${D[@]}" : -np 1 "$ampc" train "${D[@]}" --data "$dir/small" \
  > /dev/null 2> "$dir/sz.err"
rc=$?
if [ $rc = 1 ] && [ "$(grep -c -E "^ampc: error: rank (0: the ranks differ in the training set's image count \(60000 on this rank, 300 on another\)|1: the ranks differ in the training set's image count \(300 on this rank, 60000 on another\))" "$dir/sz.err")" = 1 ]; then
  ok "ranks seeing 60000 and 300 training images: exit 1, one error naming it and which count is whose"
else bad "ranks with different data: exit $rc, $(head -2 "$dir/sz.err")"; fi
# ... and of the same size but other labels: compared by a hash of their contents
mkdir -p "$dir/small2" && cp -P "$dir"/small/* "$dir/small2/"
python3 -c "
import sys
p = sys.argv[1] + '/train-labels-idx1-ubyte'; b = bytearray(open(p, 'rb').read())
for i in range(8, 58): b[i] = (b[i] + 1) % 10
open(p, 'wb').write(b)
" "$dir/small2"
mpirun --allow-run-as-root --oversubscribe -np 1 "$ampc" train "${D[@]}" --data "$dir/small" : -np 1 "$ampc" train "${D[@]}" --data "$dir/small2" \
  > /dev/null 2> "$dir/sz2.err"
rc=$?
if [ $rc = 1 ] && [ "$(grep -c "^ampc: error: rank [01]: the ranks differ in the training set's images and labels (a hash)" "$dir/sz2.err")" = 1 ]; then
  ok "ranks whose training sets differ in 50 labels only: exit 1, one error naming the training set"
else bad "ranks with other labels: exit $rc, $(head -2 "$dir/sz2.err")"; fi
# ranks resuming different checkpoints of the same step: their models differ
for k in A B; do
  lr=0.001; [ $k = B ] && lr=0.01
  "$ampc" train "${D[@]}" --data "$dir/small" --lr $lr --checkpoint-dir "$dir/ck$k" > /dev/null 2>&1
done
mpirun --allow-run-as-root --oversubscribe -np 1 "$ampc" train "${D[@]}" --data "$dir/small" --epochs 2 --resume "$dir/ckA" : \
  -np 1 "$ampc" train "${D[@]}" --data "$dir/small" --epochs 2 --resume "$dir/ckB" > /dev/null 2> "$dir/ck2.err"
rc=$?
if [ $rc = 1 ] && [ "$(grep -c "^ampc: error: rank [01]: the ranks differ in the model's weights and buffers, as made or resumed (a hash)" "$dir/ck2.err")" = 1 ]; then
  ok "ranks resuming other checkpoints of the same step: exit 1, one error naming the models"
else bad "ranks resuming other checkpoints: exit $rc, $(head -2 "$dir/ck2.err")"; fi
# an output given to some ranks only: refused at once (rank 0 alone saving
# waited forever in its collective while the other rank had finished)
timeout 120 mpirun --allow-run-as-root --oversubscribe -np 1 "$ampc" train "${C[@]}" --save "$dir/one.st" : -np 1 "$ampc" train "${C[@]}" \
  > /dev/null 2> "$dir/one.err"
rc=$?
if [ $rc = 2 ] && [ "$(grep -c "^ampc: error: --save is given on some ranks and not on others" "$dir/one.err")" = 1 ] && [ ! -e "$dir/one.st" ]; then
  ok "--save given to rank 0 alone: refused once, exit 2"
else bad "--save on one rank: exit $rc, $(head -2 "$dir/one.err")"; fi
# an epoch of one step: the all-reduce not measured alone (not 0)
"${MPI[@]}" "$ampc" train --model mlp --epochs 1 --batch-size 64 --threads 1 --train-limit 128 --test-limit 64 --metrics "$dir/one_step.jsonl" \
  > "$dir/one_step.out" 2>&1
if python3 -c "import json,sys; o=json.loads(open(sys.argv[1]).readline()); sys.exit(0 if o['comm_seconds_per_step'] is None and o['comm_hidden_fraction'] is None else 1)" "$dir/one_step.jsonl" &&
  grep -q "all-reduce not measured (too few steps in the epoch)" "$dir/one_step.out"; then
  ok "an epoch of one step: comm_seconds_per_step null, the line says not measured"
else bad "one-step epoch's all-reduce: $(cat "$dir/one_step.out" | tail -2)"; fi
# the all-reduce's bytes a step: the mlp's 235146 f32 gradients at O0 (4 x 235146)
if python3 -c "import json,sys; o=json.loads(open(sys.argv[1]).readline()); sys.exit(0 if o['comm_bytes_per_step']==940584 else 1)" "$dir/two_mlp_O0.jsonl"; then
  ok "comm_bytes_per_step: 940584, the mlp's gradient (the calibration step not counted among the overlapped ones)"
else bad "comm_bytes_per_step: $(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['comm_bytes_per_step'])" "$dir/two_mlp_O0.jsonl")"; fi
# 999 images in batches of 2 x 1: the last global batch (1 image) would leave rank 1 none
timeout 300 "${MPI[@]}" "$ampc" train --model mlp --epochs 2 --train-limit 999 --test-limit 50 --batch-size 1 --threads 1 > /dev/null 2> "$dir/b1.err"
rc=$?
if [ $rc = 0 ] && grep -q " 998 steps " "$dir/b1.err"; then ok "batches of 2 x 1 over 999 images: the 1-image last batch is left out, 998 steps"
else bad "batches of 1 with an uneven image count: exit $rc, $(tail -2 "$dir/b1.err")"; fi
# 1283 images: the last global batch (3 images, 1 and 2 a rank) trains, as in one process
L=(--model mlp --epochs 1 --test-limit 50 --quiet --seed 3 --optimizer sgd --lr 0.1 --threads 1 --train-limit 1283)
"$ampc" train "${L[@]}" --batch-size 128 --save "$dir/lb1.st" > /dev/null 2>&1
"${MPI[@]}" "$ampc" train "${L[@]}" --batch-size 64 --save "$dir/lb2.st" > /dev/null 2>&1
e=$(stcmp "$dir/lb1.st" "$dir/lb2.st" | err)
if [ -n "$e" ] && le "$e" 1e-5; then ok "a last batch of 3 images: 2 ranks x 64 = one process at 128 (max relative difference $e)"
else bad "a last batch of 3 images: 2 ranks against one: $e"; fi
finish
