#!/usr/bin/env bash
# The user documentation stays true to the program and the library:
# - every command of `ampc --help` has a man page, which renders without
#   warnings, and ampc(1) lists it;
# - every option a page documents exists, and every option a command's
#   --help lists is documented on its page (options shared with train may
#   be left to ampc-train(1) where the page says so);
# - the README names every public header;
# - Doxygen (where installed) builds the API reference from the headers
#   with no warnings and one page per public header.
#   bash docs.sh <path to the ampc binary in its build folder> <scratch dir>
set -u
ampc="$1"; dir="$2"
build=$(cd "$(dirname "$ampc")" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
man="$src/docs/man"
rm -rf "$dir"; mkdir -p "$dir"
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

commands=$("$ampc" --help | sed -n 's/^  \([a-z]\+\)  .*/\1/p')
[ -n "$commands" ] || bad "no commands in ampc --help"

# --- man pages -------------------------------------------------------------------
for page in "$man"/ampc.1 $(for c in $commands; do echo "$man/ampc-$c.1"; done); do
  name=$(basename "$page" .1)
  if [ ! -f "$page" ]; then bad "$name: no man page docs/man/$name.1"; continue; fi
  if command -v groff > /dev/null 2>&1; then
    warn=$(groff -man -Tutf8 -ww -z "$page" 2>&1)
    if [ -z "$warn" ] && groff -man -Tascii "$page" 2> /dev/null | sed 's/.\x08//g' | grep -q "^NAME"; then
      ok "$name(1) renders without warnings"
    else
      bad "$name(1): $warn"
    fi
  elif head -1 "$page" | grep -q '^\.TH ' && grep -q '^\.SH NAME' "$page"; then
    ok "$name(1) has .TH and NAME (no groff here to render it)"
  else
    bad "$name(1) is not a man page"
  fi
done
for c in $commands; do
  grep -q "^\.BR ampc\\\\-$c (1)" "$man/ampc.1" || bad "ampc(1) does not refer to ampc-$c(1)"
done
ok "ampc(1) refers to the page of each command: $(echo $commands)"

# The options of a --help text (the option column), and of a man page (the
# lines that start a .TP / .TQ item), one per line.
help_opts() { "$ampc" "$1" --help | sed -n 's/^  \(-[a-zA-Z], \)\?\(--[a-z0-9-]*\).*/\2/p' | sort -u; }
man_opts() { awk '/^\.T[PQ]/ {item = 1; next} item {print; item = 0}' "$1" | grep -o '\\-\\-[a-z0-9\\-]*' | sed 's/\\//g' | sort -u; }
man_opts "$man/ampc-train.1" > "$dir/train_page.txt"
for c in $commands; do
  page="$man/ampc-$c.1"
  [ -f "$page" ] || continue
  help_opts "$c" > "$dir/help_$c.txt"
  man_opts "$page" > "$dir/page_$c.txt"
  extra=$(comm -13 "$dir/help_$c.txt" "$dir/page_$c.txt" | tr '\n' ' ')
  undoc=$(comm -23 "$dir/help_$c.txt" "$dir/page_$c.txt")
  if grep -q 'Options shared with' "$page"; then # the rest is in ampc-train(1)
    undoc=$(echo "$undoc" | grep -vxF -f "$dir/train_page.txt" || true)
  fi
  undoc=$(echo $undoc)
  if [ -z "$extra" ] && [ -z "$undoc" ]; then
    ok "ampc-$c(1) documents the $(wc -l < "$dir/help_$c.txt") options of ampc $c --help, and no others"
  else
    bad "ampc-$c(1): ${extra:+documents options ampc $c does not take: $extra; }${undoc:+does not document: $undoc}"
  fi
done

# --- README: every public header ------------------------------------------------
missing=""
for h in "$src"/include/ampc/*.h; do
  grep -q "\`$(basename "$h")\`" "$src/README.md" || missing="$missing $(basename "$h")"
done
grep -q '`config.h`' "$src/README.md" || missing="$missing config.h"
[ -z "$missing" ] && ok "the README names every public header" || bad "the README does not name:$missing"

# --- the API reference -------------------------------------------------------------
if ! command -v doxygen > /dev/null 2>&1; then
  echo "skipped: no doxygen (apt-get install doxygen) to build the API reference"
elif [ ! -f "$build/docs/Doxyfile" ]; then
  bad "no $build/docs/Doxyfile (configure with doxygen installed)"
else
  # the build's configuration, written into the scratch folder
  if { cat "$build/docs/Doxyfile"; echo "OUTPUT_DIRECTORY = $dir/api"; echo "WARN_LOGFILE = $dir/doxygen-warnings.txt"; } |
    doxygen - > "$dir/doxygen.log" 2>&1; then
    ok "doxygen builds the API reference"
  else
    bad "doxygen"; tail -5 "$dir/doxygen.log"
  fi
  if [ -s "$dir/doxygen-warnings.txt" ]; then bad "doxygen warnings: $(head -5 "$dir/doxygen-warnings.txt")"; else ok "no doxygen warnings"; fi
  missing=""
  for h in "$src"/include/ampc/*.h "$build/include/ampc/config.h"; do
    b=$(basename "$h" .h)
    f="$dir/api/html/$(echo "$b" | sed 's/_/__/g')_8h.html"
    # the page exists and has the header's own first sentence
    first=$(sed -n '2s/^ \* [a-z_]*\.h -- \(.\{1,30\}\).*/\1/p' "$h")
    if [ ! -f "$f" ] || { [ -n "$first" ] && ! grep -qF "$first" "$f"; }; then missing="$missing $b.h"; fi
  done
  [ -z "$missing" ] && ok "a reference page for every public header, with its own description" || bad "no (or an empty) page for:$missing"
fi

echo "$pass passed, $fail failed"
[ $fail = 0 ]
