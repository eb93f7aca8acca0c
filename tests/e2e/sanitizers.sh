#!/usr/bin/env bash
# The unit tests again, built with AddressSanitizer and UndefinedBehaviorSanitizer
# (in their own build folder), plus one short training run of the CLI and the
# bad-input table's shape_ cases under them.
set -u
ampc="$1"; dir="$2"
src=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$dir"
b="$dir/build-asan"
echo "configuring $b"
# (the CPU library: the CUDA backend's host code is tested by the plain
# build's host emulation, and nvcc would double the build time)
if ! cmake -S "$src" -B "$b" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAMPC_SANITIZE=ON -DAMPC_CUDA=OFF > "$dir/cmake.log" 2>&1; then
  cat "$dir/cmake.log"; echo "0 passed, 1 failed"; exit 1
fi
if ! cmake --build "$b" -j 2 > "$dir/build.log" 2>&1; then
  tail -30 "$dir/build.log"; echo "0 passed, 1 failed"; exit 1
fi
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# the exhaustive 2^32 conversion sweeps run in the plain build; here a quick pass
export AMPC_TEST_QUICK=1
(cd "$b" && ctest -L unit --output-on-failure -j 2 --timeout 900) ; rc=$?
pass=0; fail=0
[ $rc = 0 ] && pass=$((pass + 1)) || fail=$((fail + 1))
if "$b/ampc" train --model cnn --epochs 1 --train-limit 512 --test-limit 128 --opt-level O2 --quiet > "$dir/train.log" 2>&1; then
  pass=$((pass + 1)); echo "ok   short O2 training run under ASan/UBSan"
else
  fail=$((fail + 1)); echo "FAIL short training run under ASan/UBSan"; tail -30 "$dir/train.log"
fi
# the bad-input cases of inputs that disagree (issue 11, class 1: a test set
# larger than the training set overflowed a heap buffer) under ASan/UBSan
if BAD_INPUT_ONLY='^shape_' bash "$src/tests/e2e/bad_input.sh" "$b/ampc" "$dir/bad_input_shape" > "$dir/bad_input_shape.log" 2>&1; then
  pass=$((pass + 1)); echo "ok   bad-input shape cases under ASan/UBSan ($(grep -o '^bad_input: [0-9]* cases' "$dir/bad_input_shape.log"))"
else
  fail=$((fail + 1)); echo "FAIL bad-input shape cases under ASan/UBSan"; tail -30 "$dir/bad_input_shape.log"
fi
echo "$pass passed, $fail failed"
[ $fail = 0 ]
