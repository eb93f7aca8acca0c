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
OMP_NUM_THREADS=1 valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
  --suppressions="$src/tests/e2e/valgrind.supp" \
  --log-file="$dir/memcheck.log" "$ampc" train --model cnn --epochs 1 --train-limit 64 --test-limit 32 \
  --batch-size 32 --opt-level O2 --threads 1 --quiet > "$dir/out.txt" 2>&1
rc=$?
grep -E "ERROR SUMMARY|definitely lost" "$dir/memcheck.log"
if [ $rc = 0 ]; then echo "ok   memcheck clean"; echo "1 passed, 0 failed"; exit 0; fi
echo "FAIL memcheck (exit $rc)"; tail -40 "$dir/memcheck.log"; echo "0 passed, 1 failed"; exit 1
