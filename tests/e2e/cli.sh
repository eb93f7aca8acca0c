#!/usr/bin/env bash
# The command line behaves: the progress bar on a terminal of 80 columns
# (redrawn in place, never wider than the terminal) and plain lines
# elsewhere, the end-of-run summary, step records, and no silent surprises:
# Ctrl-C says what it saved and where and leaves --save alone unless asked,
# the default checkpoint folder is in --help, a finished run says so on
# resume, --amp-report prints without --metrics, eval and grad take only
# their own options, usage errors exit 2 and others 1, errors name the flag
# or the file, bench labels an f32 run f32, summary lists every layer.
set -u
ampc="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; dir="$2"
rm -rf "$dir"; mkdir -p "$dir"
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
data=/usr/share/datasets/fashion-mnist
if [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then
  echo "skipped: $data not installed"; echo "0 passed, 0 failed"; exit 0
fi
small=(--model cnn --train-limit 1024 --test-limit 256 --batch-size 64)

# --- the progress bar in a pseudo-terminal ------------------------------------------------
# runpty.py COLS OUT ARGS...: runs ARGS on a terminal COLS wide, its output into OUT
cat > "$dir/runpty.py" <<'EOF'
import fcntl, os, pty, struct, sys, termios
cols, out, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
pid, fd = pty.fork()
if pid == 0:
    os.execv(args[0], args)
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
buf = b""
while True:
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        break
    if not chunk:
        break
    buf += chunk
os.waitpid(pid, 0)
open(out, "wb").write(buf)
EOF
# frames.py FILE COLS MUST...: the bar's frames fit in COLS - 1 and the last holds every MUST
cat > "$dir/frames.py" <<'EOF'
import re, sys
t = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
cols, must = int(sys.argv[2]), sys.argv[3:]
frames = [re.sub(r"\x1b\[K", "", f) for f in re.split(r"[\r\n]", t)]
frames = [f for f in frames if f.startswith("epoch ") and "[" in f]
assert frames, "no progress frames"
assert "\r" in t and "\x1b[K" in t, "not redrawn in place"
assert max(len(f) for f in frames) <= cols - 1, max(frames, key=len)
for part in must:
    assert part in frames[-1], (part, frames[-1])
assert re.search(r"^epoch \d/2 \[[#.]+\] \d+/32", frames[-1]), frames[-1]
EOF
python3 "$dir/runpty.py" 80 "$dir/pty80.txt" "$ampc" train --model cnn --train-limit 2048 --test-limit 64 --batch-size 64 --threads 1 --epochs 2 --opt-level O2
python3 "$dir/frames.py" "$dir/pty80.txt" 80 "loss " "img/s" "ETA " "scale " &&
  ok "progress bar at 80 columns: redrawn in place, at most 79 wide, with loss, img/s, scale and ETA" || bad "progress bar at 80 columns"
python3 "$dir/runpty.py" 44 "$dir/pty44.txt" "$ampc" train --model cnn --train-limit 2048 --test-limit 64 --batch-size 64 --threads 1 --epochs 2 --opt-level O2
python3 "$dir/frames.py" "$dir/pty44.txt" 44 "loss " && ok "progress bar at 44 columns: fits, keeps the count and the loss" || bad "progress bar at 44 columns"

# plain lines when not a terminal, and the summary at the end
"$ampc" train "${small[@]}" --epochs 2 --opt-level O2 --metrics "$dir/m.jsonl" --log-every 3 --save "$dir/w.safetensors" \
  --checkpoint-dir "$dir/ck" > "$dir/out.txt" 2> "$dir/err.txt"
if grep -q $'\r' "$dir/err.txt"; then bad "no carriage returns when stderr is not a terminal"; else ok "plain progress lines when stderr is a file"; fi
if grep -q "^ampc: done in [0-9.]*s: 2 epochs, 32 steps ([0-9]* skipped), test_acc best 0\.[0-9]* (epoch [12]) final 0\.[0-9]*, loss scale [0-9]*, peak memory [0-9]* MB" "$dir/err.txt" &&
   grep -q "^ampc: wrote metrics $dir/m.jsonl, weights $dir/w.safetensors, checkpoints in $dir/ck (last $dir/ck/ckpt-step-00000032.safetensors)" "$dir/err.txt"; then
  ok "the summary: time, epochs, steps, best and final accuracy, scale, peak memory, the paths written"
else
  bad "the summary"; tail -3 "$dir/err.txt"
fi
python3 - "$dir/m.jsonl" <<'EOF' && ok "--log-every 3: step records every 3 steps and at each skipped one, with step, loss, loss_scale, skipped, lr" || bad "step records"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in recs if "step" in r and "epoch" not in r]
epochs = [r for r in recs if "epoch" in r]
every3 = [r["step"] for r in steps if not r["skipped"]]
assert [t for t in every3 if t != 32] == list(range(3, 33, 3)), every3
assert steps[-1]["step"] == 32  # the run's last step has its record
assert all(r["step"] % 3 == 0 or r["skipped"] or r["step"] == 32 for r in steps)
assert all(set(r) >= {"step", "loss", "loss_scale", "skipped", "lr"} for r in steps)
assert sum(1 for r in steps if r["skipped"]) == sum(e["skipped_steps"] for e in epochs)
assert len(epochs) == 2
EOF

# --- Ctrl-C ------------------------------------------------------------------------------
# (100 epochs: the run is still in its first epochs when the signal comes, however fast the machine)
for extra in "" --save-on-interrupt; do
  d="$dir/int$extra"; mkdir -p "$d"
  (cd "$d" && exec "$ampc" train --model cnn --train-limit 20000 --test-limit 128 --epochs 100 --batch-size 64 --quiet \
     --save "$d/w.safetensors" $extra > out.txt 2> err.txt) &
  pid=$!
  for _ in $(seq 100); do [ -e "$d/err.txt" ] && break; sleep 0.1; done
  sleep 3
  kill -INT $pid; wait $pid; rc=$?
  ck=$(ls "$d/checkpoints" 2>/dev/null | head -1)
  if [ $rc = 0 ] && [ -n "$ck" ] && grep -q "SIGINT received at epoch [0-9]*, batch [0-9]*/313: saving a checkpoint at step" "$d/err.txt" &&
     grep -q "ampc: saved checkpoints/$ck" "$d/err.txt" && grep -q "resume with: ampc train ... --resume checkpoints" "$d/err.txt"; then
    ok "Ctrl-C${extra:+ $extra}: exit 0, says where it stopped, what it saved (checkpoints/$ck) and how to resume"
  else
    bad "Ctrl-C${extra:+ $extra}: rc $rc"; cat "$d/err.txt"
  fi
  if [ -z "$extra" ]; then
    if [ ! -e "$d/w.safetensors" ] && grep -q -- "--save $d/w.safetensors not written: the run stopped mid-epoch (--save-on-interrupt writes it anyway)" "$d/err.txt"; then
      ok "Ctrl-C leaves --save unwritten and says so"
    else bad "Ctrl-C wrote --save or said nothing"; fi
  else
    if [ -s "$d/w.safetensors" ]; then ok "Ctrl-C with --save-on-interrupt writes --save"; else bad "--save-on-interrupt"; fi
  fi
done

# --- help, resume of a finished run, --amp-report ---------------------------------------
if "$ampc" train --help | grep -q -- "--checkpoint-dir DIR.*default for the SIGINT/SIGTERM save: ./checkpoints"; then ok "train --help names the default checkpoint folder"; else bad "default checkpoint folder in --help"; fi
out=$("$ampc" train "${small[@]}" --epochs 2 --opt-level O2 --resume "$dir/ck" --metrics "$dir/fin.jsonl" 2>&1); rc=$?
if [ $rc = 0 ] && echo "$out" | grep -q "is finished: it trained all 2 epochs (32 steps); give a larger --epochs to train on"; then ok "resuming a finished run: $(echo "$out" | tail -1)"; else bad "resume of a finished run: rc $rc '$out'"; fi
if [ ! -e "$dir/fin.jsonl" ]; then ok "... makes no --metrics file for the run that did not train"; else bad "a finished run's resume made $dir/fin.jsonl"; fi
out=$("$ampc" train "${small[@]}" --epochs 1 --opt-level O2 --amp-report --quiet 2>&1)
if echo "$out" | grep -q "^epoch 1: .* grad_underflow [0-9.]*% of [0-9]* half values, grad_max_abs [0-9.e+-]*$"; then ok "--amp-report without --metrics prints its figures"; else bad "--amp-report without --metrics: '$out'"; fi

# --- each command its own options; exit codes; errors name the flag or file ---------------
for c in eval grad; do
  opts=$("$ampc" $c --help | grep -o -- '--[a-z0-9-]*' | sort -u | tr '\n' ' ')
  leaked=$(for o in --loss-scale --grad-accum --clip-grad-norm --master-weights --stochastic-rounding --amp-report --train-limit --epochs --lr; do
             echo " $opts " | grep -q -- " $o " && echo "$o"; done)
  if [ -z "$leaked" ]; then ok "$c --help lists only its own options"; else bad "$c --help lists training options: $leaked"; fi
done
check() { # expected status, text, command...
  local want=$1 text=$2; shift 2
  local err; err=$("$@" 2>&1 >/dev/null); local rc=$?
  if [ $rc = "$want" ] && [ "$(echo "$err" | wc -l)" = 1 ] && echo "$err" | grep -qF -- "$text"; then ok "exit $want: $err"; else bad "wanted exit $want and '$text': rc $rc, '$err'"; fi
}
check 2 "eval: unknown option '--loss-scale'" "$ampc" eval --loss-scale 8 --weights "$dir/w.safetensors"
check 2 "grad: unknown option '--grad-accum'" "$ampc" grad --grad-accum 2 --weights a --batch b --out c
check 2 "--master-weights: amp: master_weights makes no sense with O1" "$ampc" train --opt-level O1 --master-weights on
check 2 "--opt-level: amp: unknown opt level 'O9'" "$ampc" eval --opt-level O9 --weights "$dir/w.safetensors"
check 2 "--model: unknown model 'vgg'" "$ampc" bench --model vgg
check 1 "$dir/none.safetensors" "$ampc" eval --test-limit 64 --weights "$dir/none.safetensors"
printf 'not a safetensors file' > "$dir/junk.safetensors"
check 1 "$dir/junk.safetensors" "$ampc" eval --test-limit 64 --weights "$dir/junk.safetensors"

# OpenMP's threads spin about a microsecond at a barrier, then sleep (a busy
# neighbour on the cores otherwise halves the step's speed): GOMP_SPINCOUNT
# is set by re-running the program, unless the user chose a wait policy
w1=$(env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY "$ampc" --version | grep '^openmp:')
w2=$(env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=active "$ampc" --version | grep '^openmp:')
w3=$(env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=5 "$ampc" --version | grep '^openmp:')
if [ "$w1" = "openmp: GOMP_SPINCOUNT=1000" ] && [ "$w2" = "openmp: OMP_WAIT_POLICY=active" ] && [ "$w3" = "openmp: GOMP_SPINCOUNT=5" ]; then
  ok "OpenMP waits: GOMP_SPINCOUNT=1000 unless the user set a policy"
else bad "OpenMP waits: '$w1' '$w2' '$w3'"; fi
# OMP_DYNAMIC=true (libgomp may then give a team fewer threads than asked
# for, the more so the busier the machine) once left bench's sgemm baseline
# waiting for ever in OpenBLAS: the program runs its teams whole
# waiting for ever in OpenBLAS, as did OMP_THREAD_LIMIT=1 (a team of one
# where OpenBLAS asked for every core): the program runs its teams whole, at
# most the limit
for v in OMP_DYNAMIC=true OMP_THREAD_LIMIT=1; do
  if timeout 300 env "$v" "$ampc" bench --model cnn --steps 2 --profile off --sgemm-size 1024 > "$dir/dyn.out" 2>&1 &&
    grep -q "images/s" "$dir/dyn.out"; then ok "$v: bench runs to the end"
  else bad "$v: bench did not finish: $(tail -1 "$dir/dyn.out")"; fi
done
# The default thread count stays within a CPU quota on the process's
# control group (AMPC_TEST_CGROUP: a directory standing for it); --threads
# and OMP_NUM_THREADS still choose
if [ "$(nproc)" -ge 2 ]; then
  mkdir -p "$dir/cg"
  threads_of() { sed -n 's/.*device cpu, \([0-9]*\) thread.*/\1/p' "$1" | head -1; }
  echo "100000 100000" > "$dir/cg/cpu.max"
  AMPC_TEST_CGROUP="$dir/cg" "$ampc" bench --model cnn --steps 1 --profile off --sgemm-size 64 > "$dir/cg1.out" 2>&1
  AMPC_TEST_CGROUP="$dir/cg" "$ampc" bench --model cnn --steps 1 --threads 2 --profile off --sgemm-size 64 > "$dir/cg2.out" 2>&1
  echo "max 100000" > "$dir/cg/cpu.max"
  AMPC_TEST_CGROUP="$dir/cg" "$ampc" bench --model cnn --steps 1 --profile off --sgemm-size 64 > "$dir/cg3.out" 2>&1
  rm "$dir/cg/cpu.max"
  printf '50000\n' > "$dir/cg/cpu.cfs_quota_us"
  printf '100000\n' > "$dir/cg/cpu.cfs_period_us"
  AMPC_TEST_CGROUP="$dir/cg" "$ampc" bench --model cnn --steps 1 --profile off --sgemm-size 64 > "$dir/cg4.out" 2>&1
  t1=$(threads_of "$dir/cg1.out") t2=$(threads_of "$dir/cg2.out") t3=$(threads_of "$dir/cg3.out") t4=$(threads_of "$dir/cg4.out")
  if [ "$t1" = 1 ] && [ "$t2" = 2 ] && [ "$t3" -ge 2 ] && [ "$t4" = 1 ]; then
    ok "a 1-CPU quota (cgroup v2, v1 half a CPU): 1 thread by default; --threads 2: 2; no quota: $t3"
  else bad "threads under a CPU quota: '$t1' (want 1), --threads 2 '$t2', no quota '$t3', v1 '$t4' (want 1)"; fi
fi
# Under a control group's memory limit (a container's), a model past it is
# an error that says so, not a process the kernel kills (exit 137) as it
# touches the pages: the graph's plan (v2 memory.max, 200 MB), then the amp
# state that comes after it (v1 memory.limit_in_bytes, 300 MB)
mkdir -p "$dir/mg2" "$dir/mg1"
echo $((200 * 1024 * 1024)) > "$dir/mg2/memory.max"
echo $((300 * 1024 * 1024)) > "$dir/mg1/memory.limit_in_bytes"
for m in mg2 mg1; do
  AMPC_TEST_CGROUP="$dir/$m" "$ampc" bench --model resnet18 --opt-level O2 --steps 1 --profile off --sgemm-size 64 > "$dir/$m.out" 2>&1
  rc=$?
  if [ $rc = 1 ] && grep -q "out of memory.*control group limits its memory\|of memory of backend cpu.*control group limits its memory" "$dir/$m.out"; then
    ok "memory limit ($m): $(tail -1 "$dir/$m.out" | cut -c1-90)..."
  else bad "memory limit ($m): exit $rc: $(tail -1 "$dir/$m.out")"; fi
done
# Run again with threads bound (OMP_PLACES=cores, as PyTorch's CPU guides
# advise), the program keeps every place libgomp found: libgomp says its
# places at start in each run (OMP_DISPLAY_ENV), the same in both
p1=$(env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY OMP_PLACES=cores OMP_DISPLAY_ENV=true "$ampc" --version 2>&1 >/dev/null | grep "OMP_PLACES = ")
if [ "$(printf '%s\n' "$p1" | wc -l)" = 2 ] && [ "$(printf '%s\n' "$p1" | sort -u | wc -l)" = 1 ]; then
  ok "OMP_PLACES=cores: the program run again keeps every place ($(printf '%s' "$p1" | head -1 | tr -d ' '))"
else bad "OMP_PLACES=cores: the places of the two runs: $(printf '%s' "$p1" | tr '\n' ' ')"; fi

# --- bench and summary ----------------------------------------------------------------------
# OpenBLAS's kernels fit the CPU: where it has AVX2 and FMA, the program runs
# on a kernel set with them even where OpenBLAS does not know the CPU's model
# (it then re-executes itself with OPENBLAS_CORETYPE); a value the user set
# is kept.
core=$(env -u OPENBLAS_CORETYPE "$ampc" --version | sed -n 's/^blas: .*, core \([A-Za-z0-9_]*\).*/\1/p')
forced=$(OPENBLAS_CORETYPE=Prescott "$ampc" --version | sed -n 's/^blas: .*, core \([A-Za-z0-9_]*\).*/\1/p')
pre_avx2=" Unknown Katmai Coppermine Northwood Prescott Banias Atom Core2 Penryn Dunnington Nehalem Athlon Opteron Opteron_SSE3 Barcelona Nano Sandybridge Bobcat Bulldozer Piledriver Steamroller "
if [ -z "$core" ] || [ "$forced" != Prescott ]; then bad "ampc --version's blas core: '$core', with OPENBLAS_CORETYPE=Prescott '$forced'"
elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && [[ "$pre_avx2" == *" $core "* ]]; then
  bad "OpenBLAS runs its $core kernels on a CPU with AVX2 and FMA"
else ok "OpenBLAS core $core on this CPU, the user's OPENBLAS_CORETYPE kept"; fi
# a value that holds OpenBLAS back is kept and named, with the set that fits
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  v=$(OPENBLAS_CORETYPE=Prescott "$ampc" --version | grep '^blas:')
  b=$(OPENBLAS_CORETYPE=Prescott "$ampc" bench --model mlp --steps 1 | grep '^note: OpenBLAS runs its Prescott kernels')
  if [[ "$v" == *"(OPENBLAS_CORETYPE=Prescott); this cpu fits its "*" kernels (unset OPENBLAS_CORETYPE and kernels that fit are chosen)" ]] &&
     [ -n "$b" ]; then ok "an OPENBLAS_CORETYPE older than the CPU: --version and bench say so ($b)"
  else bad "no note on OPENBLAS_CORETYPE=Prescott: '$v' '$b'"; fi
fi
if "$ampc" bench --model mlp --steps 1 --opt-level O0 | head -1 | grep -q "O0 (f32)" &&
   "$ampc" bench --model mlp --steps 1 --opt-level O2 --half bf16 | head -1 | grep -q "O2 (bf16)"; then
  ok "bench labels O0 f32 and O2 bf16"
else bad "bench's precision label"; fi
# --profile off: the ops are not timed, so no time share (it printed 0% for each kind but the optimizer)
if ! "$ampc" bench --model mlp --steps 1 --sgemm-size 64 --profile off | grep -q "time share" &&
   "$ampc" bench --model mlp --steps 1 --sgemm-size 64 --profile off --json | python3 -c "import json,sys; sys.exit('time_share' in json.load(sys.stdin))" &&
   "$ampc" bench --model mlp --steps 1 --sgemm-size 64 | grep -q "^time share: conv_forward"; then
  ok "bench --profile off prints no time share (text or JSON); on, it does"
else bad "bench's time share with --profile off"; fi
s=$("$ampc" summary --model resnet18)
if echo "$s" | grep -q "^layer1.0.relu1 .*ReLU" && echo "$s" | grep -q "^layer1.0.add .*Add" && echo "$s" | grep -q "^avgpool " &&
   [ "$("$ampc" summary --model cnn | grep -c ReLU)" = 3 ]; then
  ok "summary lists every layer of every model (ResNet-18's ReLUs, adds and pool too)"
else bad "summary rows"; fi

# --- grad at O2: f16 gradients times a scale of 2^16 overflow (the last layer's are about 1);
# the scale backs off until they fit, and the unscaled gradients agree with O0's -----------------
cat > "$dir/mkbatch.py" <<'EOF'
import json, random, struct, sys
out, n = sys.argv[1], int(sys.argv[2])
r = random.Random(7)
x = [r.gauss(0.0, 1.0) for _ in range(n * 28 * 28)]
y = [r.randrange(10) for _ in range(n)]
xb, yb = struct.pack("<%df" % len(x), *x), struct.pack("<%dq" % n, *y)
h = {"x": {"dtype": "F32", "shape": [n, 1, 28, 28], "data_offsets": [0, len(xb)]},
     "y": {"dtype": "I64", "shape": [n], "data_offsets": [len(xb), len(xb) + len(yb)]}}
hs = json.dumps(h).encode()
hs += b" " * (-len(hs) % 8)
open(out, "wb").write(struct.pack("<Q", len(hs)) + hs + xb + yb)
EOF
cat > "$dir/gradcmp.py" <<'EOF'
import array, json, math, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h, d = json.loads(b[8:8 + n]), b[8 + n:]
    out = {}
    for k, v in h.items():
        if k.startswith("grad."):
            a = array.array("f")
            a.frombytes(d[v["data_offsets"][0]:v["data_offsets"][1]])
            out[k] = a
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
bad = [k for k in b if not all(math.isfinite(v) for v in b[k])]
if bad: sys.exit("non-finite: " + " ".join(bad))
k = "grad.11.weight"  # the last linear layer's: the largest gradients
err = math.sqrt(sum((p - q) ** 2 for p, q in zip(a[k], b[k]))) / math.sqrt(sum(p * p for p in a[k]))
print("%s: O2 against O0, relative error %.4f" % (k, err))
sys.exit(0 if err < 0.05 else 1)
EOF
python3 "$dir/mkbatch.py" "$dir/batch.safetensors" 16
g0=$("$ampc" grad --model cnn --weights "$dir/w.safetensors" --batch "$dir/batch.safetensors" --out "$dir/g0.safetensors" 2>&1)
g2=$("$ampc" grad --model cnn --weights "$dir/w.safetensors" --batch "$dir/batch.safetensors" --out "$dir/g2.safetensors" --opt-level O2 2>&1)
if cmp=$(python3 "$dir/gradcmp.py" "$dir/g0.safetensors" "$dir/g2.safetensors" 2>&1) && ! echo "$g2" | grep -q warning; then
  ok "grad at O2: finite unscaled gradients, ${g2##*(}; $cmp"
else bad "grad at O2: '$g2' / '$g0': $cmp"; fi

# --- a checkpoint folder whose parents are missing is made with them --------------------------
if "$ampc" train --model mlp --train-limit 64 --test-limit 32 --batch-size 32 --epochs 1 --quiet \
     --checkpoint-dir "$dir/runs/a/ck" > /dev/null 2>&1 && [ -s "$dir/runs/a/ck/ckpt-step-00000002.safetensors" ]; then
  ok "--checkpoint-dir makes the missing folders above it"
else bad "--checkpoint-dir runs/a/ck"; fi

# --- eval says when its normalisation is not the one the weights were trained with ------------
w_off=$("$ampc" eval --model cnn --weights "$dir/w.safetensors" --test-limit 64 --normalize off 2>&1 >/dev/null)
w_on=$("$ampc" eval --model cnn --weights "$dir/w.safetensors" --test-limit 64 2>&1 >/dev/null)
if echo "$w_off" | grep -q "^ampc: warning: eval: .*w.safetensors was trained with per-channel normalisation of fashion-mnist, and this evaluation runs with --normalize off$" && [ -z "$w_on" ]; then
  ok "eval --normalize off on weights trained with it warns: ${w_off#ampc: warning: }"
else bad "eval normalisation warning: '$w_off' / '$w_on'"; fi

# --- a metrics file is emptied only once the run is set to train ----------------------------
printf '{"epoch":1}\n' > "$dir/keep.jsonl"
"$ampc" train --model mlp --quiet --data "$dir/nosuch" --metrics "$dir/keep.jsonl" > /dev/null 2>&1
if [ "$(cat "$dir/keep.jsonl")" = '{"epoch":1}' ]; then ok "a run that fails before training leaves --metrics as it was"
else bad "--metrics emptied by a run that never trained: '$(cat "$dir/keep.jsonl")'"; fi

# --- a loss that is not finite is null in the metrics (JSON has no inf or NaN) ----------------
AMPC_TEST_INF_AT=0:3 "$ampc" train --model mlp --opt-level O2 --train-limit 640 --test-limit 64 --batch-size 64 --epochs 1 \
  --quiet --metrics "$dir/inf.jsonl" --log-every 1 > /dev/null 2>&1
if python3 -c "
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
st = [r for r in recs if 'step' in r and 'epoch' not in r]
ep = [r for r in recs if 'epoch' in r]
s3 = [r for r in st if r['step'] == 3]
assert len(st) == 10 and len(ep) == 1, (len(st), len(ep))
assert s3 and s3[0]['skipped'] is True and 'loss' in s3[0] and s3[0]['loss'] is None, s3
assert all(isinstance(r['loss'], float) for r in st if r['step'] != 3)
assert 'train_loss' in ep[0] and ep[0]['train_loss'] is None and isinstance(ep[0]['test_loss'], float), ep
" "$dir/inf.jsonl" && "$ampc" report "$dir/inf.jsonl" -o "$dir/inf.html" > /dev/null 2>&1; then
  ok "an inf input at step 3: its record's loss and the epoch's train_loss are null, the rest numbers; report reads it"
else
  bad "non-finite loss in the metrics: $(head -c 600 "$dir/inf.jsonl")"
fi

# --- a run that stops at a step leaves that step's record; every step overflowing still gives
#     --amp-report's grad_max_abs (the least magnitude that overflows at the scale) -------------------
"$ampc" train --model mlp --opt-level O2 --train-limit 512 --test-limit 64 --epochs 1 --threads 1 --quiet --loss-scale 1e6 \
  --metrics "$dir/stop.jsonl" --log-every 1 > /dev/null 2> "$dir/stop.txt"
rc=$?
last=$(tail -1 "$dir/stop.jsonl")
stop=$(sed -n 's/^ampc: error: step \([0-9]*\): non-finite.*/\1/p' "$dir/stop.txt")
if [ $rc = 1 ] && [ -n "$stop" ] && echo "$last" | grep -q "^{\"step\":$stop,.*\"skipped\":true"; then ok "a static scale's overflow stops the run at step $stop, whose record is the metrics file's last"
else bad "stop step's record: exit $rc, step '$stop', last record '$last'"; fi
"$ampc" train --model mlp --opt-level O2 --train-limit 512 --test-limit 64 --epochs 1 --threads 1 --quiet --loss-scale 1e8 \
  --on-nonfinite skip --amp-report --metrics "$dir/allover.jsonl" > /dev/null 2>&1
if python3 -c "
import json, sys
r = json.loads(open(sys.argv[1]).readlines()[-1])
assert r['skipped_steps'] == 4, r
assert abs(r['grad_max_abs'] - 65504 / 1e8) < 1e-9, r['grad_max_abs']
" "$dir/allover.jsonl"; then ok "--amp-report with every step overflowing at 1e8: grad_max_abs 65504/1e8, not 0"
else bad "grad_max_abs over overflowing steps: $(tail -1 "$dir/allover.jsonl" | head -c 400)"; fi
for f in --loss-scale --min-loss-scale --max-loss-scale; do
  err=$("$ampc" train --model mlp --opt-level O2 --train-limit 64 --test-limit 64 --quiet $f 1e-40 2>&1 > /dev/null)
  rc=$?
  if [ $rc = 2 ] && echo "$err" | grep -q "^ampc: error: $f: .*below f32's smallest normal number"; then ok "$f 1e-40 (subnormal): exit 2"
  else bad "$f 1e-40: exit $rc, '$err'"; fi
done

# --- writes that fail are errors: the metrics file, standard output --------------------------
if [ -w /dev/full ] && [ -c /dev/full ]; then
  "$ampc" train --model mlp --train-limit 64 --test-limit 32 --batch-size 32 --epochs 1 --quiet --metrics /dev/full > /dev/null 2> "$dir/full.txt"
  rc=$?
  if [ $rc = 1 ] && grep -q "^ampc: error: --metrics: error writing '/dev/full'" "$dir/full.txt"; then ok "--metrics /dev/full: exit 1, $(head -1 "$dir/full.txt")"
  else bad "--metrics /dev/full: exit $rc, '$(cat "$dir/full.txt")'"; fi
  "$ampc" summary --model cnn > /dev/full 2> "$dir/full2.txt"
  rc=$?
  if [ $rc = 1 ] && [ "$(wc -l < "$dir/full2.txt")" = 1 ] && grep -q "^ampc: error: standard output: write error" "$dir/full2.txt"; then ok "summary > /dev/full: exit 1, one line"
  else bad "summary > /dev/full: exit $rc, '$(cat "$dir/full2.txt")'"; fi
  [ -c /dev/full ] && ok "/dev/full is still a device" || bad "/dev/full was replaced"
fi

# --- an epoch's last batches: a step of accumulated micro-batches is applied even when the
#     last batch is too small to train on; one image trains a model without batch norm ---------
steps_of() { sed -n 's/.* \([0-9]*\) steps\? (.*/\1/p' "$1" | tail -1; }
acc=(--train-limit 385 --test-limit 64 --batch-size 128 --epochs 2 --grad-accum 2 --threads 1 --lr 0.01)
"$ampc" train --model mlp "${acc[@]}" > /dev/null 2> "$dir/acc_mlp.txt"
"$ampc" train --model cnn "${acc[@]}" --metrics "$dir/acc_cnn.jsonl" --log-every 1 --opt-level O2 > /dev/null 2> "$dir/acc_cnn.txt"
"$ampc" train --model mlp --train-limit 129 --test-limit 64 --batch-size 128 --epochs 1 --threads 1 > /dev/null 2> "$dir/one.txt"
a1=$(steps_of "$dir/acc_mlp.txt"); a2=$(steps_of "$dir/acc_cnn.txt"); a3=$(steps_of "$dir/one.txt")
if [ "$a1" = 4 ] && [ "$a2" = 4 ] && [ "$a3" = 2 ]; then
  ok "385 images, batches of 128 x 2 micro-batches: 2 steps an epoch (mlp and cnn); 129 images: 2 steps for the mlp"
else bad "last batches: mlp $a1, cnn $a2 steps of 4; 129 images: $a3 of 2 ($(tail -1 "$dir/acc_cnn.txt"))"; fi
# ... the metrics count the f32 master gradients accumulation makes at O2, and every step
# record has the gradient norm (no clipping asked for)
cat > "$dir/acc_check.py" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
ep = [r for r in recs if "epoch" in r and "memory" in r]
st = [r for r in recs if "step" in r and "epoch" not in r]
assert ep and all(r["memory"]["gradients"].get("f32", 0) > 0 for r in ep), [r["memory"]["gradients"] for r in ep]
assert st and all("grad_norm" in r and r["grad_norm"] > 0 for r in st if not r["skipped"]), st
EOF
if python3 "$dir/acc_check.py" "$dir/acc_cnn.jsonl"; then
  ok "O2 with --grad-accum: the metrics' gradients count the f32 master gradients; step records carry grad_norm"
else bad "metrics of an O2 run with --grad-accum: $(head -c 600 "$dir/acc_cnn.jsonl")"; fi

# --- --log-every N: a record every N steps and at the run's last step (step 12 of 3 epochs of 4) --------
"$ampc" train --model mlp --train-limit 512 --test-limit 128 --epochs 3 --quiet --metrics "$dir/le.jsonl" --log-every 5 > /dev/null 2>&1
got=$(python3 -c "import json,sys; print(' '.join(str(o['step']) for o in map(json.loads, open(sys.argv[1])) if 'epoch_progress' in o))" "$dir/le.jsonl")
if [ "$got" = "5 10 12" ]; then ok "--log-every 5 over 12 steps: records at steps 5, 10 and the last, 12"
else bad "--log-every 5 over 12 steps: records at '$got'"; fi

# --- the environment: closed streams, pipes, file-size limits, OMP_NUM_THREADS, a metrics file in use --------
E=(--model mlp --train-limit 256 --test-limit 64 --epochs 1 --threads 1)
rm -f "$dir/cs.jsonl"; "$ampc" train "${E[@]}" --metrics "$dir/cs.jsonl" >&- 2>"$dir/cs.err"; rc=$?
if [ $rc = 1 ] && head -c 1 "$dir/cs.jsonl" | grep -q '{' && grep -q "^ampc: error: standard output: write error: Bad file descriptor" "$dir/cs.err"; then
  ok "stdout closed: the metrics file holds records only (the epoch lines went into it), and the run says stdout was closed"
else bad "stdout closed: exit $rc, metrics '$(head -c 40 "$dir/cs.jsonl")'"; fi
rm -f "$dir/pipe.st"; "$ampc" train "${E[@]}" --epochs 3 --save "$dir/pipe.st" 2>"$dir/pipe.err" | head -1 > /dev/null; rc=${PIPESTATUS[0]}
if [ $rc = 1 ] && [ -s "$dir/pipe.st" ] && grep -q "^ampc: error: standard output: write error: Broken pipe" "$dir/pipe.err"; then
  ok "stdout a pipe closed early: the run goes on and writes --save, then says so (it died of SIGPIPE)"
else bad "closed pipe: exit $rc, $(tail -1 "$dir/pipe.err")"; fi
(ulimit -f 500; "$ampc" train "${E[@]}" --save "$dir/big.st" > /dev/null 2>"$dir/fsz.err"); rc=$?
if [ $rc = 1 ] && [ "$(grep -c "^ampc: error: .*File too large" "$dir/fsz.err")" = 1 ] && ! ls -a "$dir" | grep -q '\.big\.st\.tmp'; then
  ok "a file past ulimit -f: one error line, no temporary file left (it died of SIGXFSZ)"
else bad "ulimit -f: exit $rc, $(tail -1 "$dir/fsz.err")"; fi
OMP_NUM_THREADS=100000 "$ampc" train "${E[@]}" > /dev/null 2>"$dir/omp.err"; rc=$?
if [ $rc = 2 ] && grep -q "^ampc: error: OMP_NUM_THREADS: '100000' is more than the" "$dir/omp.err"; then ok "OMP_NUM_THREADS=100000: refused (libgomp crashed making the threads)"
else bad "OMP_NUM_THREADS=100000: exit $rc, $(tail -1 "$dir/omp.err")"; fi
rm -f "$dir/two.jsonl"
"$ampc" train --model mlp --train-limit 4096 --test-limit 64 --epochs 1000 --threads 1 --metrics "$dir/two.jsonl" --checkpoint-dir "$dir/two_ck" > /dev/null 2>&1 &
first=$!
for _ in $(seq 1 100); do [ -s "$dir/two.jsonl" ] && break; sleep 0.1; done
"$ampc" train "${E[@]}" --metrics "$dir/two.jsonl" > /dev/null 2>"$dir/two.err"; rc=$?
kill -TERM $first; wait $first
if [ $rc = 1 ] && grep -q "^ampc: error: --metrics: '$dir/two.jsonl' is being written by another run" "$dir/two.err"; then
  ok "a second run on a metrics file another run writes: refused (their lines interleaved)"
else bad "two runs on one metrics file: exit $rc, $(tail -1 "$dir/two.err")"; fi

# --- a batch larger than the training set: the whole set, planned for no more ----------------
out=$("$ampc" train --model cnn --train-limit 64 --test-limit 32 --batch-size 65536 --epochs 1 2>&1); rc=$?
mem=$(echo "$out" | grep -o "activations [0-9.]* MB" | head -1 | grep -o "[0-9.]*")
if [ $rc = 0 ] && echo "$out" | grep -q "64 train / 32 test images, batch 64," && awk "BEGIN{exit !($mem < 100)}"; then
  ok "--batch-size 65536 on 64 images: one batch of 64, activations planned for it ($mem MB)"
else bad "--batch-size past the data: rc $rc '$(echo "$out" | head -5)'"; fi

# --- an output name near the 255-byte limit of a name can still be written ---------------------
long=$(printf 'a%.0s' $(seq 1 250)).st
if (cd "$dir" && "$ampc" train --model mlp --train-limit 64 --test-limit 32 --epochs 1 --quiet --save "$long" >/dev/null 2>"$dir/long.err") &&
   [ -s "$dir/$long" ]; then ok "--save of a 253-byte file name"; else bad "--save of a 253-byte name: $(cat "$dir/long.err")"; fi

# --- eval of weights trained on another dataset's normalisation: a warning ------------------------
"$ampc" eval --model mlp --test-limit 32 --weights "$dir/$long" --dataset mnist --data "$data" >/dev/null 2>"$dir/ds.err"; rc=$?
if [ $rc = 0 ] && grep -q "^ampc: warning: eval: .* was trained on fashion-mnist, normalised with its mean and std, and this evaluation normalises with mnist's (--dataset)$" "$dir/ds.err"; then
  ok "eval with another --dataset than the weights': warned"
else bad "eval with another --dataset: rc $rc '$(cat "$dir/ds.err")'"; fi

# --- ampc help COMMAND is that command's help -----------------------------------------------
if "$ampc" help train 2>&1 | grep -q "^usage: ampc train" && "$ampc" help export 2>&1 | grep -q "^usage: ampc export"; then
  ok "ampc help train / export print those commands' help"
else bad "ampc help train: '$("$ampc" help train 2>&1 | head -2)'"; fi
"$ampc" > /dev/null 2> "$dir/none.txt"
rc=$?
if [ $rc = 2 ] && head -1 "$dir/none.txt" | grep -q "^ampc: error: no command given" && grep -q "^usage: ampc" "$dir/none.txt"; then
  ok "ampc alone: exit 2, an error line, then the usage"
else bad "ampc alone: exit $rc, '$(head -2 "$dir/none.txt")'"; fi

# a file name with a newline and a terminal escape in it: the lines that say
# what was written keep to one line and print no escape, as error lines do
odd="$dir/w"$'\n'"x"$'\e'"[31m.safetensors"
"$ampc" train --model mlp --train-limit 64 --test-limit 32 --batch-size 32 --epochs 1 --threads 1 --save "$odd" > /dev/null 2> "$dir/odd.txt"
rc=$?
"$ampc" export "$odd" -o "$odd.f16" --dtype f16 2>> "$dir/odd.txt"
rc2=$?
if [ $rc = 0 ] && [ $rc2 = 0 ] && [ -f "$odd" ] && [ -f "$odd.f16" ] && ! grep -q $'\e' "$dir/odd.txt" &&
   grep -q "^ampc: wrote weights $dir/w?x?\[31m.safetensors$" "$dir/odd.txt" &&
   grep -q "^ampc: wrote $dir/w?x?\[31m.safetensors.f16: " "$dir/odd.txt"; then
  ok "a file name with control characters: written, and shown with '?' for them"
else
  bad "a file name with control characters (exit $rc, $rc2)"; cat -v "$dir/odd.txt" | tail -4
fi

# under an address-space limit (ulimit -v, a batch system's h_vmem) too low
# for OpenBLAS's buffers, 128 MB a thread: an error naming the limit, not a
# process that hangs in its first product (OpenBLAS retries the allocation
# for ever). The least limit the program starts under at all is found first
# (below it OpenBLAS's own start-up, before main, hangs the same way).
least=$(python3 - "$ampc" <<'EOF'
import resource, subprocess, sys
def starts(kb):
    lim = kb * 1024
    try:
        return subprocess.run([sys.argv[1], "--version"], capture_output=True, timeout=5,
                              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (lim, lim))).returncode == 0
    except subprocess.TimeoutExpired:
        return False
lo, hi = 1 << 16, 1 << 24  # kB: 64 MB .. 16 GB
if not starts(hi):
    print(0)
    sys.exit()
while hi - lo > 16384:
    mid = (lo + hi) // 2
    if starts(mid):
        hi = mid
    else:
        lo = mid
print(hi)
EOF
)
if [ "${least:-0}" -gt 0 ]; then
  (ulimit -v $((least + 200 * 1024)); timeout -s KILL 60 "$ampc" train --model mlp --train-limit 64 --test-limit 32 --batch-size 32 --epochs 1 --threads 8 --quiet > "$dir/vlim.txt" 2>&1)
  rc=$?
  (ulimit -v $((least + 8 * 140 * 1024 + 1024 * 1024)); timeout -s KILL 60 "$ampc" train --model mlp --train-limit 64 --test-limit 32 --batch-size 32 --epochs 1 --threads 8 --quiet > "$dir/vlim2.txt" 2>&1)
  rc2=$?
  if [ $rc = 1 ] && grep -q "^ampc: error: .*address-space limit (ulimit -v, [0-9]* MB) leaves too little for OpenBLAS's buffers, [0-9]* MB more for " "$dir/vlim.txt" &&
     [ $rc2 = 0 ]; then
    ok "ulimit -v too low for OpenBLAS's buffers: an error naming the limit (exit 1), not a hang; with room for them the run trains"
  else
    bad "ulimit -v: exit $rc (137: killed after hanging), with room $rc2: $(head -2 "$dir/vlim.txt") $(head -2 "$dir/vlim2.txt")"
  fi
else
  ok "ulimit -v: skipped (the program does not start under a limit of 16 GB here)"
fi

echo "$pass passed, $fail failed"
[ $fail = 0 ]
