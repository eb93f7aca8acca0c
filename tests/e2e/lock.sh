#!/usr/bin/env bash
# One writer per checkpoint folder (issue 11, class 4): a second run on a
# folder another run holds fails at once, naming the holder's pid; after a
# kill -9 of the holder a new run takes the folder and removes the temporary
# files of interrupted saves (but not those of a live writer); a fresh run on a
# folder of another run's checkpoints is refused; --keep counts
# only complete checkpoints; the SIGTERM save into the default folder takes
# the lock too, and goes to ./checkpoints.N where ./checkpoints is another
# run's; a resume from an older checkpoint of a folder may not write its
# branch there; the run's other outputs may not be the folder's own files.
#
#   bash tests/e2e/lock.sh <path-to-ampc> <scratch-dir>
set -u
ampc="$1"; dir="$2"
case $dir in "" | / | . | "$HOME") echo "lock: refusing scratch dir '$dir'" >&2; exit 2 ;; esac
rm -rf "$dir"; mkdir -p "$dir"
data=/usr/share/datasets/fashion-mnist
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
if [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then
  echo "skipped: $data not installed"; echo "0 passed, 0 failed"; exit 0
fi
export OMP_NUM_THREADS=1
ck="$dir/ck"
F=(--model mlp --data "$data" --train-limit 512 --test-limit 64 --batch-size 32 --quiet --threads 1)

# the holder: a long run saving often
"$ampc" train "${F[@]}" --epochs 100000 --checkpoint-dir "$ck" --save-every 1 >/dev/null 2>"$dir/a.err" &
a=$!
for _ in $(seq 1 300); do
  [ "$(cat "$ck/.lock" 2>/dev/null)" = "$a" ] && ls "$ck"/ckpt-step-*.safetensors >/dev/null 2>&1 && break
  kill -0 $a 2>/dev/null || break
  sleep 0.1
done
[ "$(cat "$ck/.lock" 2>/dev/null)" = "$a" ] && ok "the holder's pid is in $ck/.lock" || { bad "no lock file with the holder's pid"; cat "$dir/a.err"; }

# a second run on the same folder: fails at once, with the holder's pid
t0=$(date +%s%N)
timeout 20 "$ampc" train "${F[@]}" --epochs 1 --checkpoint-dir "$ck" >"$dir/b.out" 2>"$dir/b.err"
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ $rc = 1 ] && ok "second run exits 1" || bad "second run exit status $rc"
grep -q "^ampc: error: --checkpoint-dir: '$ck' is in use by another ampc run (pid $a holds" "$dir/b.err" &&
  ok "second run names the holder (pid $a)" || { bad "second run's error"; cat "$dir/b.err"; }
[ $ms -lt 5000 ] && ok "second run failed at once (${ms} ms)" || bad "second run took ${ms} ms"
[ "$(cat "$ck/.lock")" = "$a" ] && ok "the holder keeps the folder" || bad "the lock file changed"

# kill -9 the holder; plant what an interrupted save leaves (its pid is dead
# now), one of a live writer, and a file that is none of ours
kill -9 $a; wait $a 2>/dev/null
head -c 4096 /dev/zero >"$ck/.ckpt-step-00000077.safetensors.tmp.$a.3"
sleep 600 </dev/null >/dev/null 2>&1 &
live=$!
: >"$ck/.ckpt-step-00000078.safetensors.tmp.$live.0"
: >"$ck/.notes.tmp.$a.1"
before=$(ls -A "$ck" | grep -c '\.tmp\.')
# (it resumes the killed run: a fresh one is refused a folder of another run's checkpoints, below)
"$ampc" train "${F[@]}" --epochs 1 --checkpoint-dir "$ck" --resume "$ck" --save-every 1 >"$dir/c.out" 2>"$dir/c.err" &
c=$!
held=0
for _ in $(seq 1 300); do
  [ "$(cat "$ck/.lock" 2>/dev/null)" = "$c" ] && { held=1; break; }
  kill -0 $c 2>/dev/null || break
  sleep 0.05
done
wait $c; rc=$?
[ $rc = 0 ] && ok "after kill -9 a new run takes the folder (exit 0)" || { bad "new run exit status $rc"; cat "$dir/c.err"; }
[ $held = 1 ] && ok "the new run's pid was in the lock file" || bad "the new run's pid never showed in the lock file"
left=$(ls -A "$ck" | grep "^\.ckpt-step-.*\.tmp\.$a\." | wc -l)
[ "$left" = 0 ] && ok "the killed run's leftovers are removed ($before temporary files before)" || { bad "$left leftovers of pid $a remain"; ls -A "$ck"; }
[ -e "$ck/.ckpt-step-00000078.safetensors.tmp.$live.0" ] && ok "a live writer's temporary file is left alone" || bad "a live writer's file was removed"
[ -e "$ck/.notes.tmp.$a.1" ] && ok "files that are not checkpoints are left alone" || bad "an unrelated file was removed"
grep -Eq "removed [0-9]+ unfinished checkpoint files? left in $ck" "$dir/c.err" && ok "the removal is reported" || { bad "no note of the removal"; cat "$dir/c.err"; }
kill $live 2>/dev/null; wait $live 2>/dev/null

# a fresh run (no --resume of that folder) on a folder of another run's checkpoints is
# refused: --keep would take this run's as the older ones, and --resume DIR the other's newest
"$ampc" train "${F[@]}" --epochs 1 --checkpoint-dir "$ck" --keep 1 >/dev/null 2>"$dir/o.err"
rc=$?
n=$(find "$ck" -maxdepth 1 -type f -name 'ckpt-step-*.safetensors' | wc -l)
[ $rc = 1 ] && grep -q "^ampc: error: --checkpoint-dir: '$ck' holds another run's checkpoints (the latest $ck/ckpt-step-" "$dir/o.err" && [ "$n" -ge 1 ] &&
  ok "a fresh run with --keep 1 on a folder of another run's checkpoints: refused, the $n checkpoints kept" || { bad "fresh run on another run's folder: exit $rc, $n left"; cat "$dir/o.err"; }

# --keep counts complete checkpoints only: a folder and a leftover that look like checkpoints do not count
kd="$dir/keep"
mkdir -p "$kd/ckpt-step-99999999.safetensors"
"$ampc" train "${F[@]}" --epochs 1 --train-limit 256 --checkpoint-dir "$kd" --save-every 1 --keep 2 >/dev/null 2>"$dir/k.err" || { bad "--keep run failed"; cat "$dir/k.err"; }
n=$(find "$kd" -maxdepth 1 -type f -name 'ckpt-step-*.safetensors' | wc -l)
[ "$n" = 2 ] && ok "--keep 2 keeps 2 complete checkpoints beside a folder of that name" || { bad "--keep 2 left $n"; ls -A "$kd"; }

# SIGTERM without --checkpoint-dir saves into ./checkpoints: locked there too
wd="$dir/wd"
mkdir -p "$wd/checkpoints"
echo 4243 >"$wd/checkpoints/.lock"
(exec 9<>"$wd/checkpoints/.lock"; flock 9; exec sleep 600) </dev/null >/dev/null 2>&1 &
holder=$!
for _ in $(seq 1 50); do flock -n "$wd/checkpoints/.lock" true 2>/dev/null || break; sleep 0.1; done
(cd "$wd" && exec "$ampc" train "${F[@]}" --epochs 100000) >/dev/null 2>"$dir/t.err" &
t=$!
sleep 2
kill -TERM $t; wait $t; rc=$?
kill $holder 2>/dev/null; wait $holder 2>/dev/null
n1=$(find "$wd/checkpoints.1" -maxdepth 1 -name 'ckpt-step-*.safetensors' 2>/dev/null | wc -l)
n0=$(find "$wd/checkpoints" -maxdepth 1 -name 'ckpt-step-*.safetensors' | wc -l)
[ $rc = 0 ] && [ "$n1" = 1 ] && [ "$n0" = 0 ] && grep -q "resume with: ampc train ... --resume checkpoints.1$" "$dir/t.err" &&
  ok "SIGTERM save where another run holds ./checkpoints: into ./checkpoints.1, and the hint names it" ||
  { bad "SIGTERM into a held folder: exit status $rc, $n0 in checkpoints, $n1 in checkpoints.1"; cat "$dir/t.err"; }

# ... and where ./checkpoints holds another run's checkpoints: not mixed with
# them (--resume checkpoints would take the other run's newest)
wd2="$dir/wd2"
mkdir -p "$wd2/checkpoints" && cp "$(ls "$ck"/ckpt-step-*.safetensors | tail -n 1)" "$wd2/checkpoints/ckpt-step-99999999.safetensors"
(cd "$wd2" && exec "$ampc" train "${F[@]}" --epochs 100000) >/dev/null 2>"$dir/t2.err" &
t=$!
sleep 2
kill -TERM $t; wait $t; rc=$?
n0=$(find "$wd2/checkpoints" -maxdepth 1 -name 'ckpt-step-*.safetensors' | wc -l)
[ $rc = 0 ] && [ "$n0" = 1 ] && ls "$wd2"/checkpoints.1/ckpt-step-*.safetensors >/dev/null 2>&1 &&
  ok "SIGTERM save where ./checkpoints holds another run's checkpoints: into ./checkpoints.1" ||
  { bad "SIGTERM beside another run's checkpoints: exit $rc, $n0 in checkpoints"; cat "$dir/t2.err"; }
# that run resumed from its folder and stopped again: its own folder once more
(cd "$wd2" && exec "$ampc" train "${F[@]}" --epochs 100000 --resume checkpoints.1) >/dev/null 2>"$dir/t3.err" &
t=$!
sleep 2
kill -TERM $t; wait $t; rc=$?
n1=$(find "$wd2/checkpoints.1" -maxdepth 1 -name 'ckpt-step-*.safetensors' | wc -l)
[ $rc = 0 ] && [ "$n1" = 2 ] && [ ! -e "$wd2/checkpoints.2" ] && ok "... and the resumed run's next SIGTERM save goes to the same folder" ||
  { bad "resumed SIGTERM save: exit $rc, $n1 in checkpoints.1"; ls "$wd2"; cat "$dir/t3.err"; }

# a resume from an older checkpoint than the folder's latest: its saves there
# would replace the run's later checkpoints (and --keep delete them)
br="$dir/branch"
"$ampc" train "${F[@]}" --train-limit 128 --epochs 2 --checkpoint-dir "$br" --save-every 2 >/dev/null 2>&1
first=$(ls "$br"/ckpt-step-*.safetensors | head -n 1); last=$(ls "$br"/ckpt-step-*.safetensors | tail -n 1)
before=$(md5sum "$br"/ckpt-step-*.safetensors)
"$ampc" train "${F[@]}" --train-limit 128 --epochs 3 --lr 0.01 --resume "$first" --checkpoint-dir "$br" --keep 1 >/dev/null 2>"$dir/b.err"
rc=$?
[ $rc = 1 ] && grep -q "^ampc: error: --resume: '$first' is not the latest checkpoint in '$br' ($last is)" "$dir/b.err" &&
  [ "$(md5sum "$br"/ckpt-step-*.safetensors)" = "$before" ] && ok "a branch from an older checkpoint into its folder: refused, the folder unchanged" ||
  { bad "branch into the folder: exit $rc"; cat "$dir/b.err"; }
"$ampc" train "${F[@]}" --train-limit 128 --epochs 3 --resume "$br" --checkpoint-dir "$br" >/dev/null 2>"$dir/b.err" &&
  ok "... the latest resumes there" || { bad "resume of the latest into its folder failed"; cat "$dir/b.err"; }

# a --checkpoint-dir whose checkpoints' paths would not fit a path: refused
# before training, not at the first save
long=$(printf './%.0s' $(seq 1 2030))ckL
"$ampc" train "${F[@]}" --epochs 1 --checkpoint-dir "$long" >/dev/null 2>"$dir/l.err"
rc=$?
[ $rc = 2 ] && [ "$(cat "$dir/l.err")" = "ampc: error: --checkpoint-dir: the path is 4063 bytes long; at most 4000" ] && [ ! -e ckL ] &&
  ok "a --checkpoint-dir path too long: refused at once" || { bad "long --checkpoint-dir: exit $rc"; head -c 300 "$dir/l.err"; }

# a run that fails before saving anything leaves no trace of the folder it made,
# and keeps a folder (and lock file) that were there before it
"$ampc" train "${F[@]}" --data "$dir/no-such-data" --checkpoint-dir "$dir/made/a/b" >/dev/null 2>"$dir/m.err"
rc=$?
[ $rc = 1 ] && [ ! -e "$dir/made" ] && ok "a failed run removes the checkpoint folders it made" || { bad "failed run: exit $rc, left: $(find "$dir/made" 2>&1 | tr '\n' ' ')"; cat "$dir/m.err"; }
mkdir -p "$dir/had"; echo 1 >"$dir/had/.lock"
"$ampc" train "${F[@]}" --data "$dir/no-such-data" --checkpoint-dir "$dir/had/new" >/dev/null 2>"$dir/m.err"
[ -f "$dir/had/.lock" ] && [ ! -e "$dir/had/new" ] && ok "... but not the folder or lock that were there" || { bad "failed run removed what it did not make"; ls -A "$dir/had"; }
"$ampc" train "${F[@]}" --data "$dir/no-such-data" --checkpoint-dir "$dir/had" >/dev/null 2>"$dir/m.err"
[ -f "$dir/had/.lock" ] && ok "... nor an old lock file" || bad "failed run removed an old lock file"
mkdir -p "$dir/sym"; ln -s "$dir/elsewhere" "$dir/sym/.lock"
"$ampc" train "${F[@]}" --checkpoint-dir "$dir/sym" >/dev/null 2>"$dir/s.err"
rc=$?
[ $rc = 1 ] && grep -q "sym/.lock is a symbolic link" "$dir/s.err" && [ ! -e "$dir/elsewhere" ] && ok "a symbolic link as the lock file is refused" || { bad "symlink lock: exit $rc"; cat "$dir/s.err"; }

echo "$pass passed, $fail failed"
[ $fail = 0 ]
