#!/usr/bin/env bash
# End-to-end: libampc as an installed library. Installs the build into a
# temporary prefix (cmake --install, and once more with DESTDIR), then builds
# the C example (examples/resnet18_cifar10.c) out of the tree against the
# installed copy -- with pkg-config (shared and --static) and with CMake's
# find_package(ampc) (ampc::ampc and ampc::ampc_static) -- and runs each
# build for two steps on a generated CIFAR-10 folder. Also checks the
# installed headers, `ampc --version`, `ampc_version()` and `man ampc-train`.
#   bash install.sh <path to the ampc binary in its build folder> <scratch dir>
set -u

ampc=${1:?usage: install.sh AMPC_BINARY SCRATCH_DIR}
scratch=${2:?usage: install.sh AMPC_BINARY SCRATCH_DIR}
build=$(cd "$(dirname "$ampc")" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
cc=${CC:-cc}

pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok: $1"; }
bad() { fail=$((fail + 1)); echo "FAIL: $1"; }
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit $?; }

rm -rf "$scratch"
mkdir -p "$scratch/cifar"
prefix="$scratch/prefix"
version=$(sed -n 's/^project(ampc VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")

# --- install ----------------------------------------------------------------
if cmake --install "$build" --prefix "$prefix" >"$scratch/install.log" 2>&1; then
  ok "cmake --install into a temporary prefix"
else
  bad "cmake --install"; cat "$scratch/install.log"; finish
fi
pcfile=$(find "$prefix" -name ampc.pc -path '*/pkgconfig/*' | head -1)
libdir=$(dirname "$(dirname "$pcfile")")
missing=""
for f in "$libdir/libampc.a" "$libdir/libampc.so" "$prefix/bin/ampc" "$pcfile" \
  "$libdir/cmake/ampc/ampcConfig.cmake" "$libdir/cmake/ampc/ampcConfigVersion.cmake" \
  "$prefix/include/ampc/config.h" "$prefix/share/man/man1/ampc.1"; do
  [ -e "$f" ] || missing="$missing $f"
done
for h in "$src"/include/ampc/*.h; do
  cmp -s "$h" "$prefix/include/ampc/$(basename "$h")" || missing="$missing include/ampc/$(basename "$h")"
done
for c in train eval grad summary bench report export; do
  [ -e "$prefix/share/man/man1/ampc-$c.1" ] || missing="$missing share/man/man1/ampc-$c.1"
done
if [ -z "$missing" ]; then
  ok "installed: libampc.a, libampc.so, every public header, config.h, ampc.pc, the CMake package, bin/ampc, 8 man pages"
else
  bad "not installed:$missing"
fi
soname=$(readelf -d "$libdir/libampc.so" 2>/dev/null | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
if [ -n "$soname" ] && [ -e "$libdir/$soname" ]; then ok "libampc.so has the SONAME $soname, installed"; else bad "SONAME '$soname'"; fi
# the shared library exports the public names only
internal=$(nm -D --defined-only "$libdir/libampc.so" | awk '{print $3}' | grep -v '^ampc_[a-z0-9]' | head -3)
if [ -z "$internal" ] && nm -D --defined-only "$libdir/libampc.so" | grep -q ' ampc_amp_initialize$'; then
  ok "libampc.so exports the ampc_* API and nothing else"
else
  bad "libampc.so exports non-API symbols: $internal"
fi

out=$("$prefix/bin/ampc" --version 2>&1)
if echo "$out" | grep -q "^ampc $version\$" && echo "$out" | grep -q '^build type: ' &&
  echo "$out" | grep -q '^backends: cpu' && echo "$out" | grep -Eq '^cpu paths: .*baseline'; then
  ok "ampc --version: $(echo "$out" | tr '\n' ';')"
else
  bad "ampc --version printed: $out"
fi

# The installed headers alone, strict C17, and ampc_version() against the
# compile-time macros.
cat >"$scratch/version.c" <<'EOF'
#include <stdio.h>
#include <string.h>
#include "ampc/ampc.h"
int main(void) {
  const ampc_version_info *v = ampc_version_get();
  printf("%s\n", ampc_version());
  return strcmp(v->version, AMPC_VERSION_STRING) != 0 || v->number != AMPC_VERSION_NUMBER ||
         strstr(ampc_version(), AMPC_BACKENDS) == NULL || strstr(AMPC_CPU_PATHS, v->cpu_path) == NULL;
}
EOF

# --- pkg-config -------------------------------------------------------------
export PKG_CONFIG_PATH="$(dirname "$pcfile")"
if [ "$(pkg-config --modversion ampc 2>&1)" = "$version" ]; then ok "pkg-config --modversion ampc = $version"; else bad "pkg-config --modversion ampc: $(pkg-config --modversion ampc 2>&1)"; fi
if $cc -std=c17 -Wall -Wextra -Werror -pedantic "$scratch/version.c" -o "$scratch/version" $(pkg-config --cflags --libs ampc) >"$scratch/version.log" 2>&1 &&
  LD_LIBRARY_PATH="$libdir" "$scratch/version" >"$scratch/version.out" 2>&1; then
  ok "the installed headers compile with -std=c17 -pedantic -Werror; ampc_version(): $(cat "$scratch/version.out")"
else
  bad "version program"; cat "$scratch/version.log" "$scratch/version.out" 2>/dev/null
fi
# the README's line: the library's folder in the run path, no LD_LIBRARY_PATH
if $cc "$scratch/version.c" $(pkg-config --cflags --libs ampc) -Wl,-rpath,"$(pkg-config --variable=libdir ampc)" -o "$scratch/version_rpath" \
     >"$scratch/version_rpath.log" 2>&1 && env -u LD_LIBRARY_PATH "$scratch/version_rpath" >/dev/null 2>&1; then
  ok "the README's pkg-config line (-Wl,-rpath from pkg-config --variable=libdir) builds a program that starts"
else
  bad "the README's pkg-config line"; cat "$scratch/version_rpath.log"
fi

# CIFAR-10 binary format: 1 label byte + 3072 pixel bytes per record.
make_batch() {
  local i
  for ((i = 0; i < 32; i++)); do
    printf "\\$(printf '%03o' $((i % 10)))"
    head -c 3072 /dev/urandom
  done >"$1"
}
for f in data_batch_1 data_batch_2 data_batch_3 data_batch_4 data_batch_5 test_batch; do
  make_batch "$scratch/cifar/$f.bin"
done

# $1: binary, $2: what it is. Two O2 steps and a short test pass.
run_example() {
  local log="$scratch/run_$(basename "$1").log"
  if LD_LIBRARY_PATH="${3:-}" "$1" --data "$scratch/cifar" --steps 2 --batch 8 --test-limit 16 >"$log" 2>&1 &&
    grep -Eq '^step 2/2 .*loss [0-9]+\.[0-9]+' "$log" && grep -Eq '^test: loss [0-9]+\.[0-9]+ accuracy' "$log"; then
    ok "$2: the example trains 2 steps and evaluates"
  else
    bad "$2: the example did not run"; cat "$log"
  fi
}
# $1: binary; $2: 1 if it must load the installed libampc.so, 0 if it must not need one
check_linkage() {
  local l
  l=$(LD_LIBRARY_PATH="${3:-}" ldd "$1" 2>&1 | grep 'libampc' || true)
  if [ "$2" = 1 ]; then
    case "$l" in *"$libdir/libampc.so"*) ok "$(basename "$1") loads the installed libampc.so" ;; *) bad "$(basename "$1") linkage: $l" ;; esac
  else
    if [ -z "$l" ]; then ok "$(basename "$1") has libampc linked in statically"; else bad "$(basename "$1") needs $l"; fi
  fi
}

if $cc -O2 "$src/examples/resnet18_cifar10.c" -o "$scratch/example_pc" $(pkg-config --cflags --libs ampc) >"$scratch/pc.log" 2>&1; then
  ok "pkg-config: cc example.c \$(pkg-config --cflags --libs ampc)"
  check_linkage "$scratch/example_pc" 1 "$libdir"
  run_example "$scratch/example_pc" "pkg-config, shared" "$libdir"
else
  bad "pkg-config build"; cat "$scratch/pc.log"
fi
# --static: libampc.a with what it needs (Libs.private, Requires.private)
static_libs=$(pkg-config --static --libs ampc | sed 's/-lampc\b/-l:libampc.a/')
if $cc -O2 "$src/examples/resnet18_cifar10.c" -o "$scratch/example_pc_static" $(pkg-config --cflags ampc) $static_libs >"$scratch/pcs.log" 2>&1; then
  ok "pkg-config --static: $static_libs"
  check_linkage "$scratch/example_pc_static" 0
  run_example "$scratch/example_pc_static" "pkg-config, static"
else
  bad "pkg-config --static build"; cat "$scratch/pcs.log"
fi

# ... and with the other compiler (gcc <-> clang) where there is one: libampc.a
# brings its own OpenMP runtime, not the user's compiler's
other=clang
$cc --version 2>/dev/null | grep -qi clang && other=gcc
if command -v $other >/dev/null 2>&1; then
  if $other -O2 "$src/examples/resnet18_cifar10.c" -o "$scratch/example_pc_static_$other" $(pkg-config --cflags ampc) $static_libs >"$scratch/pco.log" 2>&1; then
    ok "pkg-config --static with $other"
    run_example "$scratch/example_pc_static_$other" "pkg-config, static, $other"
  else
    bad "pkg-config --static build with $other"; cat "$scratch/pco.log"
  fi
fi

# --- CMake find_package ---------------------------------------------------------
mkdir -p "$scratch/user"
cp "$src/examples/resnet18_cifar10.c" "$scratch/user/"
cat >"$scratch/user/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.18)
project(ampc_user C)
find_package(ampc $version REQUIRED)
add_executable(example_cmake resnet18_cifar10.c)
target_link_libraries(example_cmake PRIVATE ampc::ampc)
add_executable(example_cmake_static resnet18_cifar10.c)
target_link_libraries(example_cmake_static PRIVATE ampc::ampc_static)
EOF
if cmake -S "$scratch/user" -B "$scratch/user/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >"$scratch/cmake.log" 2>&1 &&
  cmake --build "$scratch/user/build" -j 2 >>"$scratch/cmake.log" 2>&1; then
  ok "CMake: find_package(ampc $version) with ampc::ampc and ampc::ampc_static"
  check_linkage "$scratch/user/build/example_cmake" 1
  run_example "$scratch/user/build/example_cmake" "find_package, ampc::ampc"
  check_linkage "$scratch/user/build/example_cmake_static" 0
  run_example "$scratch/user/build/example_cmake_static" "find_package, ampc::ampc_static"
else
  bad "CMake find_package build"; tail -30 "$scratch/cmake.log"
fi

# the installed examples folder builds on its own, as its CMakeLists.txt says
docdir=$(find "$prefix" -type d -path '*/doc/ampc/examples' | head -1)
if [ -n "$docdir" ] && cmake -S "$docdir" -B "$scratch/exbuild" -DCMAKE_PREFIX_PATH="$prefix" >"$scratch/exbuild.log" 2>&1 &&
  cmake --build "$scratch/exbuild" -j 2 >>"$scratch/exbuild.log" 2>&1 && [ -x "$scratch/exbuild/examples/resnet18_cifar10" ]; then
  ok "the installed examples folder builds on its own (cmake -S share/doc/ampc/examples -DCMAKE_PREFIX_PATH=prefix)"
else
  bad "the installed examples folder on its own ($docdir)"; tail -20 "$scratch/exbuild.log"
fi

# a C++ project without C: the package is found (FindMPI's C component
# needs the C language; the MPI libraries come as the build found them)
mkdir -p "$scratch/userxx"
cat >"$scratch/userxx/p.cpp" <<'EOF'
#include <cstdio>
#include "ampc/ampc.h"
int main() {
  ampc_model *m = nullptr;
  ampc_model_opts mo = {};
  mo.batch = 2; mo.channels = 1; mo.height = 28; mo.width = 28; mo.classes = 10;
  if (ampc_model_create(&m, "mlp", &mo) < 0) { std::printf("%s\n", ampc_last_error()); return 1; }
  std::printf("%s %lld\n", ampc_model_name(m), (long long)ampc_model_param_count(m));
  ampc_model_free(m);
  return 0;
}
EOF
cat >"$scratch/userxx/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.18)
project(ampc_userxx CXX)
find_package(ampc $version REQUIRED)
add_executable(pxx p.cpp)
target_link_libraries(pxx PRIVATE ampc::ampc)
add_executable(pxx_static p.cpp)
target_link_libraries(pxx_static PRIVATE ampc::ampc_static)
EOF
if command -v g++ >/dev/null 2>&1; then
  if cmake -S "$scratch/userxx" -B "$scratch/userxx/build" -DCMAKE_PREFIX_PATH="$prefix" >"$scratch/cmakexx.log" 2>&1 &&
    cmake --build "$scratch/userxx/build" -j 2 >>"$scratch/cmakexx.log" 2>&1 &&
    [ "$("$scratch/userxx/build/pxx")" = "mlp 235146" ] && [ "$("$scratch/userxx/build/pxx_static")" = "mlp 235146" ]; then
    ok "CMake: a C++-only project finds the package; ampc::ampc and ampc::ampc_static link and run"
  else
    bad "C++-only find_package"; tail -20 "$scratch/cmakexx.log"
  fi
fi

# --- DESTDIR: a staged install is complete and its pkg-config file relocates ----
if DESTDIR="$scratch/stage" cmake --install "$build" --prefix /opt/ampc >"$scratch/stage.log" 2>&1 &&
  spc=$(find "$scratch/stage/opt/ampc" -name ampc.pc | head -1) && [ -n "$spc" ] &&
  inc=$(PKG_CONFIG_PATH=$(dirname "$spc") pkg-config --cflags-only-I ampc | sed 's/^ *-I//; s/ *$//') &&
  [ -f "$inc/ampc/ampc.h" ] && [ -f "$scratch/stage/opt/ampc/bin/ampc" ]; then
  ok "DESTDIR=stage cmake --install --prefix /opt/ampc: all under stage/opt/ampc, ampc.pc points at its own tree"
else
  bad "DESTDIR install"; cat "$scratch/stage.log"
fi

# --- man ampc-train --------------------------------------------------------------
page="$prefix/share/man/man1/ampc-train.1"
if command -v man >/dev/null 2>&1; then
  if MANWIDTH=80 man -M "$prefix/share/man" -P cat ampc-train >"$scratch/man.txt" 2>"$scratch/man.err" &&
    grep -q 'ampc-train - train a model with mixed precision' "$scratch/man.txt" && grep -q -- '--opt-level' "$scratch/man.txt"; then
    ok "man -M PREFIX/share/man ampc-train shows the page"
  else
    bad "man ampc-train"; cat "$scratch/man.err"; head -20 "$scratch/man.txt"
  fi
elif command -v groff >/dev/null 2>&1; then
  if groff -man -Tascii "$page" 2>/dev/null | grep -q 'train a model'; then ok "groff renders ampc-train.1 (no man here)"; else bad "groff ampc-train.1"; fi
else
  if head -1 "$page" | grep -q '^\.TH AMPC\\-TRAIN 1' && grep -q '^\.SH NAME' "$page" && grep -q '^\.SH SYNOPSIS' "$page"; then
    ok "ampc-train.1 is a man page (.TH, NAME, SYNOPSIS; neither man nor groff here to render it)"
  else
    bad "ampc-train.1 structure"
  fi
fi

finish
