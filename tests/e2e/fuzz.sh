#!/usr/bin/env bash
# A bounded fuzzing pass over every reader and the option parser (libFuzzer,
# with ASan/UBSan): each target runs AMPC_FUZZ_SECONDS (default 30) from its
# committed seed corpus. Longer campaigns: tests/fuzz/run.sh SECONDS.
set -u
ampc="$1"; dir="$2"
src=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$dir"
if ! command -v clang >/dev/null || ! echo 'int LLVMFuzzerTestOneInput(const char*d,long n){return 0;}' | \
     clang -x c -fsanitize=fuzzer - -o "$dir/probe" 2>/dev/null; then
  echo "skipped: clang with libFuzzer not available (apt-get install clang libclang-rt-14-dev)"
  echo "0 passed, 0 failed"; exit 0
fi
# the targets' scratch files go in this test's own folder
mkdir -p "$dir/tmp"
TMPDIR="$dir/tmp" AMPC_FUZZ_BUILD="$dir/build-fuzz" bash "$src/tests/fuzz/run.sh" "${AMPC_FUZZ_SECONDS:-30}"; rc=$?
if [ $rc = 0 ]; then echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi
exit $rc
