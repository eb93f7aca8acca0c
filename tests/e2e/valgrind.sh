#!/usr/bin/env bash
# A short training run under valgrind's memcheck: no invalid reads or writes,
# no use of uninitialised values, no definite leaks.
set -u
ampc="$1"; dir="$2"
src=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$dir"
if ! command -v valgrind >/dev/null; then
  echo "skipped: valgrind not installed (apt-get install valgrind)"; echo "0 passed, 0 failed"; exit 0
fi
data=/usr/share/datasets/fashion-mnist
[ -e "$data/train-images-idx3-ubyte.gz" ] || { echo "skipped: no Fashion-MNIST"; echo "0 passed, 0 failed"; exit 0; }
# OpenBLAS's kernels named here: where it picks ones without AVX2 (a CPU
# model it does not know, or valgrind's virtual CPU) the program would run
# itself again to get better ones, and that second run would escape memcheck
# (no --trace-children); valgrind runs AVX2 code but not AVX-512
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; else export OPENBLAS_CORETYPE=Prescott; fi
fi
OMP_NUM_THREADS=1 valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
  --suppressions="$src/tests/e2e/valgrind.supp" \
  --log-file="$dir/memcheck.log" "$ampc" train --model cnn --epochs 1 --train-limit 64 --test-limit 32 \
  --batch-size 32 --opt-level O2 --threads 1 --quiet > "$dir/out.txt" 2>&1
rc=$?
grep -E "ERROR SUMMARY|definitely lost" "$dir/memcheck.log"
# valgrind's summary is there only if the process it watched ran to its end
if [ $rc = 0 ] && ! grep -q "ERROR SUMMARY" "$dir/memcheck.log"; then rc=98; echo "no ERROR SUMMARY: the run left memcheck"; fi
if [ $rc = 0 ]; then echo "ok   memcheck clean (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)"; echo "1 passed, 0 failed"; exit 0; fi
echo "FAIL memcheck (exit $rc)"; tail -40 "$dir/memcheck.log"; echo "0 passed, 1 failed"; exit 1
