#!/usr/bin/env bash
# Checks (and where possible installs) what building and testing ampc needs on
# Debian: cmake, pkg-config, OpenBLAS (OpenMP build), zlib, jansson, Open MPI
# (mpirun and its headers, for data-parallel training) and the Fashion-MNIST
# dataset; SIMDe (headers: the AVX-512 kernels' test on CPUs without
# AVX-512); for the tests of the report, the man pages and the
# API reference also chromium (headless), man-db and doxygen. Installs with
# apt-get when run as root (or with passwordless sudo); otherwise prints the
# exact command to run and fails.
#   bash scripts/deps.sh [build|docs|test]   (default test: everything)
# build: what building and `make demo` need; docs: that and doxygen; test:
# that and what the test suite runs (clang, valgrind, the sanitizers'
# runtime, SIMDe, chromium, man-db, python3).
set -euo pipefail

build_pkgs=(cmake make gcc pkg-config libopenblas-openmp-dev zlib1g-dev libjansson-dev openmpi-bin libopenmpi-dev dataset-fashion-mnist)
if [ $# -gt 1 ]; then
  echo "ampc: scripts/deps.sh: expected one of build, docs or test, got $# arguments" >&2
  exit 2
fi
if ! command -v dpkg-query >/dev/null; then
  echo "ampc: scripts/deps.sh: no dpkg-query: this checks Debian's packages; elsewhere install the equivalents of: cmake make gcc pkg-config OpenBLAS (OpenMP) zlib jansson Open MPI" >&2
  exit 1
fi
case "${1:-test}" in
  build) pkgs=("${build_pkgs[@]}") ;;
  docs) pkgs=("${build_pkgs[@]}" doxygen python3) ;;
  test) pkgs=("${build_pkgs[@]}" clang python3 valgrind libclang-rt-14-dev libsimde-dev chromium man-db doxygen) ;;
  *)
    echo "ampc: scripts/deps.sh: expected build, docs or test, got '$1'" >&2
    exit 2
    ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  # (the status's last word: "install ok installed", or "hold ok installed" for a held package)
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q " ok installed$" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" = 0 ]; then
  sudo=""
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo="sudo"
else
  echo "ampc: missing packages: ${missing[*]}" >&2
  if command -v sudo >/dev/null; then
    echo "ampc: install them with: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  else
    echo "ampc: install them as root with: su -c 'apt-get update && apt-get install -y ${missing[*]}'" >&2
  fi
  exit 1
fi
echo "ampc: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >&2
$sudo apt-get install -y -qq "${missing[@]}" >&2
