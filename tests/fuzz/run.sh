#!/usr/bin/env bash
# Builds the libFuzzer targets in a separate clang build (build-fuzz) and runs
# each one for SECONDS, one after the other; prints each target's executions
# and exits non-zero if any target crashed, leaked, hung or ran out of memory.
#
#   tests/fuzz/run.sh 60                  # every target, 60 s each
#   FUZZ_TARGETS="idx cli" tests/fuzz/run.sh 300
#
# The seeds in tests/fuzz/corpus/<target>/ are copied into
# build-fuzz/corpus/<target>/, which keeps what the fuzzer finds across runs;
# a crashing input is written to build-fuzz/artifacts/ and its path printed.
# Replay one with: build-fuzz/tests/fuzz/fuzz_<target> <file>
# Environment: FUZZ_TARGETS (default "idx cifar safetensors cli pair checkpoint report"),
# AMPC_FUZZ_BUILD (default <repo>/build-fuzz), AMPC_FUZZ_SRC (default the repo),
# FUZZ_RSS_MB (libFuzzer's -rss_limit_mb, default 2560).
set -uo pipefail

if [ $# -ne 1 ] || ! [[ $1 =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then
  echo "usage: $0 SECONDS   (time each fuzz target runs)" >&2
  exit 2
fi
secs=$1
here=$(cd "$(dirname "$0")" && pwd)
src=${AMPC_FUZZ_SRC:-$(cd "$here/../.." && pwd)}
build=${AMPC_FUZZ_BUILD:-$src/build-fuzz}
targets=${FUZZ_TARGETS:-idx cifar safetensors cli pair checkpoint report}

if ! grep -q "tests/fuzz" "$src/CMakeLists.txt"; then
  echo "run.sh: $src/CMakeLists.txt does not add tests/fuzz (see tests/fuzz/CMakeLists.txt)" >&2
  exit 2
fi
if ! command -v clang >/dev/null; then
  echo "run.sh: clang not found (Debian: apt-get install clang libclang-rt-14-dev)" >&2
  exit 2
fi

echo "run.sh: configuring $build" >&2
# (the readers and the parser: the library without the CUDA backend)
cmake -S "$src" -B "$build" -DCMAKE_C_COMPILER=clang -DAMPC_FUZZ=ON -DAMPC_CUDA=OFF -DCMAKE_BUILD_TYPE=Release \
  >"$build.configure.log" 2>&1 || { cat "$build.configure.log" >&2; exit 2; }
rm -f "$build.configure.log"
bins=()
for t in $targets; do bins+=("fuzz_$t"); done
echo "run.sh: building ${bins[*]}" >&2
cmake --build "$build" -j "$(nproc)" --target "${bins[@]}" >"$build/fuzz-build.log" 2>&1 ||
  { tail -40 "$build/fuzz-build.log" >&2; exit 2; }

# The readers take folders, so every input is written to a file: keep those
# in memory when we can (an ext4 /tmp makes the readers ~10x slower).
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi
export OMP_NUM_THREADS=1
# Largest input per target: CIFAR records are 3073/3074 bytes, so 4 of them.
declare -A max_len=([idx]=8192 [cifar]=12800 [safetensors]=4096 [cli]=1024 [pair]=256 [checkpoint]=16384)

mkdir -p "$build/artifacts"
status=0
summary=()
for t in $targets; do
  bin="$build/tests/fuzz/fuzz_$t"
  corpus="$build/corpus/$t"
  mkdir -p "$corpus"
  log="$build/fuzz_$t.log"
  echo "run.sh: fuzz_$t for ${secs}s (log $log)" >&2
  "$bin" -max_total_time="$secs" -max_len="${max_len[$t]:-4096}" -timeout=10 -rss_limit_mb="${FUZZ_RSS_MB:-2560}" \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" "$corpus" "$here/corpus/$t" \
    >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  [ -n "$execs" ] || execs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  if [ $rc -eq 0 ]; then
    summary+=("fuzz_$t: ${execs:-?} executions, ${cov:-cov: ?}, corpus $(find "$corpus" -type f | wc -l) files: ok")
  else
    status=1
    artifact=$(grep -o "Test unit written to .*" "$log" | tail -1 | sed 's/Test unit written to //')
    summary+=("fuzz_$t: ${execs:-?} executions: FAILED (exit $rc) $(grep -m1 -E 'ERROR:|SUMMARY:' "$log")")
    [ -n "$artifact" ] && summary+=("  reproducer: $artifact (replay: $bin $artifact)")
    grep -m1 -B2 -A25 -E '==ERROR|runtime error|invariant|internal error' "$log" >&2 || tail -30 "$log" >&2
  fi
done
printf '%s\n' "${summary[@]}"
exit $status
