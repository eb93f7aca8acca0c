#!/usr/bin/env bash
# End-to-end: `ampc report`. Trains the cnn briefly on the real Fashion-MNIST
# (O2 with --amp-report, and O0), draws one run and then both on one page,
# checks that the page is self-contained and that every chart's data equal
# the metrics (report_check.py), draws per-step charts from step records,
# checks the errors for bad input, and renders the two-run page in headless
# Chromium and checks that the screenshot shows the charts (skipped where
# chromium is not installed).
#   bash report.sh <path to the ampc binary> <scratch dir>
set -u
ampc="$1"; dir="$2"
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dir"; mkdir -p "$dir"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
data=/usr/share/datasets/fashion-mnist
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
if [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then
  echo "skipped: $data not installed (apt-get install dataset-fashion-mnist)"
  echo "0 passed, 0 failed"
  exit 0
fi
cd "$dir" || exit 1

# Two short real runs (relative file names: the page names the files as given).
for run in "O2 --amp-report" "O0"; do
  set -- $run
  if "$ampc" train --model cnn --epochs 2 --train-limit 2048 --test-limit 512 --opt-level "$@" --quiet \
       --metrics "$1.jsonl" > "train_$1.log" 2>&1 && [ "$(wc -l < "$1.jsonl")" -eq 2 ]; then
    ok "train cnn $1 on Fashion-MNIST: 2 epoch records"
  else
    bad "train cnn $1"; cat "train_$1.log"
  fi
done

# $1: page; the rest: the metrics files in the page's order
check_page() {
  local page=$1; shift
  if python3 "$here/report_check.py" page "$page" "$@" > "check_$page.log" 2>&1; then
    ok "$page: self-contained, and every chart's data equal the metrics ($(grep -c '^ok' "check_$page.log") checks)"
  else
    bad "$page"; grep -v '^ok' "check_$page.log"
  fi
}

if "$ampc" report O2.jsonl -o one.html 2> one.err && [ -s one.html ] && grep -q 'wrote one.html' one.err; then
  ok "ampc report O2.jsonl -o one.html"
else
  bad "report of one run"; cat one.err
fi
check_page one.html O2.jsonl
if "$ampc" report O2.jsonl O0.jsonl -o two.html --title "cnn: O2 against O0" 2> two.err; then
  ok "ampc report O2.jsonl O0.jsonl: two runs on one page"
else
  bad "report of two runs"; cat two.err
fi
check_page two.html O2.jsonl O0.jsonl
grep -q '<h1>cnn: O2 against O0</h1>' two.html && ok "--title sets the heading" || bad "--title"
"$ampc" report O2.jsonl -o - > stdout.html 2> /dev/null && cmp -s stdout.html one.html && ok "-o - writes the same page to standard output" || bad "-o -"

# Step records (what `train --log-every` adds): lines with "step" and no
# "epoch" give per-step loss, loss-scale (skipped steps marked) and gradient
# norm charts. Here made from the O2 run's epochs.
python3 - O2.jsonl steps.jsonl <<'PY'
import json, sys
epochs = [json.loads(l) for l in open(sys.argv[1])]
out, scale, step = open(sys.argv[2], "w"), 65536.0, 0
for e in epochs:
    first = step
    while step < e["steps"]:
        step += 1
        skipped = step in (3, 11)
        scale = scale / 2 if skipped else scale
        out.write(json.dumps({"step": step, "loss": 2.5 / step, "loss_scale": scale, "skipped": skipped,
                              "lr": e["lr"], "grad_norm": 1.0 + step / 100}) + "\n")
    out.write(json.dumps(e) + "\n")
PY
if "$ampc" report steps.jsonl O0.jsonl -o steps.html 2> steps.err; then ok "report with step records"; else bad "report with step records"; cat steps.err; fi
check_page steps.html steps.jsonl O0.jsonl
grep -q 'id="chart-step_loss"' steps.html && grep -q 'id="chart-grad_norm"' steps.html && ok "per-step loss and gradient norm charts" || bad "per-step charts missing"
# and the step records of a real run (train --log-every, with clipping: grad_norm)
if "$ampc" train --model cnn --epochs 2 --train-limit 2048 --test-limit 512 --opt-level O2 --quiet --metrics real.jsonl \
     --log-every 4 --clip-grad-norm 5 > train_real.log 2>&1 && "$ampc" report real.jsonl -o real.html 2> real.err; then
  ok "report of a real run with --log-every 4: $(grep -c '"step"' real.jsonl) records"
else
  bad "report of a real run with step records"; cat train_real.log real.err
fi
check_page real.html real.jsonl
grep -q 'id="chart-step_loss"' real.html && grep -q 'id="chart-grad_norm"' real.html && ok "its per-step loss and gradient norm charts" || bad "per-step charts of a real run"
# a resumed run appends: the later record of an epoch counts
{ cat O0.jsonl; tail -1 O0.jsonl | sed 's/"test_acc":[0-9.e-]*/"test_acc":0.5/'; } > resumed.jsonl
"$ampc" report resumed.jsonl -o resumed.html 2> /dev/null
if python3 - resumed.html <<'PY'
import re, sys
m = re.search(r'data-series="test_acc" data-x="([^"]*)" data-y="([^"]*)"', open(sys.argv[1]).read())
sys.exit(0 if m and m.group(1) == "1,2" and m.group(2).endswith(",0.5") else 1)
PY
then ok "a repeated epoch counts once, with its last record"; else bad "repeated epoch"; fi

# A long run: 60000 step records (and a skipped step in every 40) are drawn
# thinned -- at most 4 points in each of 1000 columns, one mark a column
# standing for its skipped steps -- with each column's lowest and highest
# loss kept, while the data block keeps every record verbatim.
python3 - long.jsonl <<'PY'
import json, math, sys
with open(sys.argv[1], "w") as out:
    for s in range(1, 60001):
        out.write(json.dumps({"step": s, "loss": 2.0 + math.sin(s * 0.37), "loss_scale": 1024.0, "skipped": s % 40 == 0}) + "\n")
PY
if "$ampc" report long.jsonl -o long.html 2> long.err && python3 - long.html long.jsonl <<'PY'
import json, re, sys
page, lines = open(sys.argv[1]).read(), open(sys.argv[2]).read().splitlines()
m = re.search(r'data-series="step_loss" data-x="([^"]*)" data-y="([^"]*)"', page)
xs, ys = [float(v) for v in m.group(1).split(",")], [float(v) for v in m.group(2).split(",")]
loss = {json.loads(l)["step"]: json.loads(l)["loss"] for l in lines}
ok = 1000 <= len(xs) <= 4004 and all(loss[int(x)] == y for x, y in zip(xs, ys))
ok = ok and min(ys) == min(loss.values()) and max(ys) == max(loss.values()) and xs[0] == 1 and xs[-1] == 60000
marks = re.search(r'data-series="step_loss_scale_skipped" data-x="([^"]*)" data-count="([^"]*)"', page)
counts = [float(v) for v in marks.group(2).split(",")]
ok = ok and len(counts) <= 1001 and sum(counts) == 1500
data = json.loads(re.search(r'id="ampc-report-data">(.*?)</script>', page, re.S).group(1))
ok = ok and data["runs"][0]["records"] == [json.loads(l) for l in lines]
print(len(xs), "points,", len(counts), "marks,", len(page) // 1024, "KB")
sys.exit(0 if ok else 1)
PY
then ok "60000 steps drawn thinned (each column's extremes kept), every record in the data block"; else bad "a long run's page"; cat long.err; fi

# Bad input: one line on stderr naming the file (and line), nothing on
# stdout; exit 1 for bad data, 2 for usage.
printf '{"epoch": 1, "train_loss": 1.0}\n{"epoch": 2, "train_loss": \n' > malformed.jsonl
: > empty.jsonl
printf '[1, 2]\n' > array.jsonl
printf '{"epoch": 1, "test_acc": "high"}\n' > badtype.jsonl
printf '{"note": "no records here"}\n\n' > norecords.jsonl
# a metrics file whose tail a crash left zero-filled
{ cat O2.jsonl; head -c 4096 /dev/zero; } > nul.jsonl
expect() { # expected exit, pattern of the message, args...
  local want=$1 pat=$2; shift 2
  "$ampc" report "$@" > err.out 2> err.txt
  local rc=$? lines
  lines=$(wc -l < err.txt)
  if [ $rc -eq "$want" ] && [ "$lines" -eq 1 ] && grep -Eq "^ampc: error: .*$pat" err.txt && [ ! -s err.out ]; then
    ok "report $*: exit $rc, $(cat err.txt)"
  else
    bad "report $*: exit $rc (want $want), $lines lines: $(cat err.txt)"
  fi
}
expect 1 "missing.jsonl: cannot open: No such file" missing.jsonl
expect 1 "malformed.jsonl:2: malformed JSON" malformed.jsonl
expect 1 "empty.jsonl: no records" empty.jsonl
expect 1 "norecords.jsonl: no records" norecords.jsonl
expect 1 "array.jsonl:1: not a JSON object" array.jsonl
expect 1 "nul.jsonl:3: not text \\(a NUL byte\\)" nul.jsonl
expect 1 'badtype.jsonl:1: "test_acc" is not a number' badtype.jsonl
expect 1 "missing.jsonl: cannot open" O2.jsonl missing.jsonl
expect 1 "no-such-dir/r.html" O2.jsonl -o no-such-dir/r.html
# the memory breakdown is drawn to scale: every count an integer of at least
# 0, no type past its category's total, no categories past the record's total
mem() { # FILE MEMORY: the O2 run's first record with this memory
  python3 -c 'import json, sys; r = json.loads(open("O2.jsonl").readline()); r["memory"] = json.loads(sys.argv[2])
open(sys.argv[1], "w").write(json.dumps(r) + "\n")' "$1" "$2"
}
mem mem_negative.jsonl '{"parameters":{"f32":-5,"total":5},"total":5}'
mem mem_real.jsonl '{"parameters":{"f32":2.5,"total":5},"total":5}'
mem mem_part.jsonl '{"parameters":{"f32":4611686018427387904,"total":1}}'
mem mem_parts.jsonl '{"parameters":{"f32":6,"f16":6,"total":10},"total":10}'
mem mem_nototal.jsonl '{"parameters":{"f32":6}}'
mem mem_grand.jsonl '{"parameters":{"f32":6,"total":6},"gradients":{"f16":6,"total":6},"total":10}'
mem mem_cat.jsonl '{"parameters":-5,"total":0}'
expect 1 'mem_negative.jsonl:1: "memory.parameters.f32" is not an integer of at least 0' mem_negative.jsonl
expect 1 'mem_real.jsonl:1: "memory.parameters.f32" is not an integer of at least 0' mem_real.jsonl
expect 1 'mem_part.jsonl:1: "memory.parameters.f32" \(4611686018427387904 bytes\) is more than the category.s "total" \(1\)' mem_part.jsonl
expect 1 'mem_parts.jsonl:1: the types of "memory.parameters" add up to more than its "total" \(10 bytes\)' mem_parts.jsonl
expect 1 'mem_nototal.jsonl:1: "memory.parameters.total" is not an integer of at least 0' mem_nototal.jsonl
expect 1 'mem_grand.jsonl:1: the categories of "memory" add up to more than its "total" \(10 bytes\)' mem_grand.jsonl
expect 1 'mem_cat.jsonl:1: "memory.parameters" is not an object' mem_cat.jsonl
expect 2 "no metrics file given"
expect 2 "unknown option '--bogus'" O2.jsonl --bogus
expect 2 "-o: missing value" O2.jsonl -o
[ ! -e report.html ] && ok "no page written on errors" || bad "a page was written despite an error"
# standard output that fails: one line with the reason, exit 1
if [ -w /dev/full ] && [ -c /dev/full ]; then
  "$ampc" report O2.jsonl -o - > /dev/full 2> full.txt
  rc=$?
  if [ $rc = 1 ] && [ "$(wc -l < full.txt)" = 1 ] && grep -q '^ampc: error: standard output: write error: No space left on device$' full.txt; then
    ok "report -o - > /dev/full: exit 1, $(cat full.txt)"
  else bad "report -o - > /dev/full: exit $rc, '$(cat full.txt)'"; fi
fi

# Names from the file are text on the page, never markup: memory categories
# and storage types that hold HTML
python3 - <<'PY'
import json
r = json.loads(open("O2.jsonl").readline())
r["memory"] = {"<img src=x onerror=alert(1)>": {"\"><script>alert(2)</script>": 5, "total": 5}, **r["memory"]}
r["memory"]["total"] += 5  # (the record's total counts the added category)
open("markup.jsonl", "w").write(json.dumps(r) + "\n")
PY
if grep -q '<script>alert' markup.jsonl && "$ampc" report markup.jsonl -o markup.html 2> markup.err; then
  if grep -q '<img src=x\|<script>alert\|"><script' markup.html; then bad "markup from the metrics reached the page"; grep -o '.\{40\}<script>alert.\{20\}\|.\{40\}<img src=x.\{20\}' markup.html | head -3
  else ok "names from the metrics are escaped on the page"; fi
else
  bad "report of markup.jsonl: $(cat markup.err)"
fi

# A file name and a --title that are not UTF-8 (any bytes, as a shell gives
# them): the page stays UTF-8 (U+FFFD for the bad bytes) and its data block
# names the run (a run whose name jansson refused was dropped from it before).
badname=$(printf 'run\377.jsonl')
cp O2.jsonl "$badname"
if "$ampc" report "$badname" --title "$(printf 'a\303\050b')" -o badname.html 2> badname.err && python3 - badname.html <<'PY'
import json, re, sys
page = open(sys.argv[1], "rb").read().decode("utf-8")  # strict: raises on a bad byte
data = json.loads(re.search(r'id="ampc-report-data">(.*?)</script>', page, re.S).group(1))
sys.exit(0 if data["runs"][0]["file"] == "run\ufffd.jsonl" and "<title>a\ufffd(b: run\ufffd.jsonl</title>" in page else 1)
PY
then ok "a file name and title that are not UTF-8: the page is UTF-8, its data names the run"; else bad "non-UTF-8 names"; cat badname.err; fi
# and names from the file cut to their room at a whole character: an
# opt_level and a memory category whose multi-byte letter lies across the cut
python3 - cut.jsonl <<'PY'
import json, sys
rec = {"epoch": 1, "train_loss": 1.0, "opt_level": "O" * 14 + "\u00e9", "half": "bf16-" + "\u20ac" * 4,
       "memory": {"a" * 254 + "\u00e9": {"f32": 5, "total": 5}, "total": 5}}
open(sys.argv[1], "w").write(json.dumps(rec, ensure_ascii=False) + "\n")
PY
if "$ampc" report cut.jsonl -o cut.html 2> cut.err && python3 -c 'import sys; open(sys.argv[1], "rb").read().decode("utf-8")' cut.html; then
  ok "names cut at a whole character: the page is UTF-8"
else
  bad "names cut inside a character"; cat cut.err
fi

# Headless Chromium: the page renders, and the screenshot shows the charts.
chrome=""
for c in chromium chromium-browser google-chrome; do command -v "$c" > /dev/null 2>&1 && { chrome=$c; break; }; done
if [ -z "$chrome" ]; then
  echo "skipped: no chromium (apt-get install chromium) to render the page"
else
  mkdir -p chrome-profile
  HOME="$dir" timeout 120 "$chrome" --headless --no-sandbox --disable-gpu --user-data-dir="$dir/chrome-profile" \
    --screenshot="$dir/two.png" --window-size=1200,2400 "file://$dir/two.html" > chrome.log 2>&1
  if [ -s two.png ]; then
    ok "$chrome --headless renders two.html into two.png"
    if python3 "$here/report_check.py" png two.png > png.log 2>&1; then
      ok "the screenshot shows the charts: $(grep -v '^ok   screenshot [0-9]' png.log | sed 's/^ok   //' | tr '\n' ';')"
    else
      bad "screenshot"; cat png.log
    fi
  else
    bad "$chrome wrote no screenshot"; tail -5 chrome.log
  fi
fi

# values at the ends of a double's range: no coordinate is NaN (an axis from
# -1e308 to 1e308 spans inf); what lies past 1e300 is left out, the rest drawn
printf '{"epoch":1,"train_loss":-1e308}\n{"epoch":2,"train_loss":1e308}\n{"epoch":3,"train_loss":1e300,"test_loss":-1e300}\n' > "$dir/huge.jsonl"
if "$ampc" report "$dir/huge.jsonl" -o "$dir/huge.html" > /dev/null 2>&1 && ! grep -qi 'nan' "$dir/huge.html" &&
  grep -q 'points="[0-9]' "$dir/huge.html"; then
  ok "losses of +-1e308 and +-1e300: no NaN coordinates, the drawable points drawn"
else bad "extreme values: $(grep -o 'points="[^"]*"' "$dir/huge.html" | head -3)"; fi

# values too small for a double to divide by: a single loss of 5e-324 (an
# axis of no span) and a loss scale of 5e-324 (log2 -1074, whose ticks below
# it exp2 gives as 0): no coordinate is NaN or infinite
printf '{"epoch":1,"train_loss":5e-324,"loss_scale":5e-324}\n{"step":3,"loss":5e-324,"loss_scale":5e-324}\n' > "$dir/tiny.jsonl"
if "$ampc" report "$dir/tiny.jsonl" -o "$dir/tiny.html" > /dev/null 2>&1 && ! grep -qi 'nan\|inf"' "$dir/tiny.html" &&
  grep -q 'data-series="train_loss"' "$dir/tiny.html" && grep -q 'data-series="step_loss_scale"' "$dir/tiny.html"; then
  ok "values of 5e-324 on a linear and a log axis: no NaN or infinite coordinates"
else bad "tiny values: $(grep -o '[a-z0-9]*="[^"]*\(nan\|inf\)[^"]*"' "$dir/tiny.html" | head -3)"; fi

# losses that were not finite (null in the file): the table says so, and the
# loss charts say how many they left out (they vanished without a trace)
printf '%s\n' '{"epoch":1,"train_loss":2.3,"test_loss":2.2,"test_acc":0.1,"steps":4}' \
  '{"epoch":2,"train_loss":null,"test_loss":null,"test_acc":0.1,"steps":8}' \
  '{"step":3,"loss":null,"skipped":true,"loss_scale":1024}' '{"step":4,"loss":2.0,"loss_scale":1024}' > "$dir/nonfinite.jsonl"
if "$ampc" report "$dir/nonfinite.jsonl" -o "$dir/nonfinite.html" > /dev/null 2>&1 && grep -q '>not finite / not finite<' "$dir/nonfinite.html" &&
  grep -q '1 epoch with a loss that was not finite, not drawn' "$dir/nonfinite.html" &&
  grep -q '1 step with a loss that was not finite, not drawn' "$dir/nonfinite.html"; then
  ok "losses that were not finite: 'not finite' in the table, counted in the loss charts' notes"
else bad "non-finite losses: $(grep -o 'not finite[^<]*' "$dir/nonfinite.html" | head -3)"; fi

# ... and the line breaks there rather than joining its neighbours: the
# polyline keeps the values (not stroked), a path draws the pieces
printf '%s\n' '{"epoch":1,"train_loss":2.3,"steps":4}' '{"epoch":2,"train_loss":2.1,"steps":8}' '{"epoch":3,"train_loss":null,"steps":12}' \
  '{"epoch":4,"train_loss":1.9,"steps":16}' '{"epoch":5,"train_loss":null,"steps":20}' '{"epoch":6,"train_loss":1.7,"steps":24}' > "$dir/broken.jsonl"
if "$ampc" report "$dir/broken.jsonl" -o "$dir/broken.html" > /dev/null 2>&1 &&
  python3 - "$dir/broken.html" <<'EOF'
import re, sys
page = open(sys.argv[1]).read()
poly = re.search(r'<polyline [^>]*data-series="train_loss"[^>]*>', page).group(0)
assert 'stroke="none"' in poly and 'data-x="1,2,4,6"' in poly and 'data-breaks="4,6"' in poly, poly
d = re.search(r'<path class="line-drawn"[^>]*d="([^"]*)"', page).group(1)
# epochs 1-2 a line, 4 a dot alone, 6 a dot alone
assert re.fullmatch(r'M[-0-9. ]+ L[-0-9. ]+ M[-0-9. ]+ l0 0 M[-0-9. ]+ l0 0', d), d
assert re.search(r'"breaks_before_x": ?\[4(\.0)?, ?6(\.0)?\]', page)
EOF
then ok "a loss that was not finite breaks the line there (the polyline keeps the values, data-breaks the x it starts again at)"
else bad "the line over a non-finite loss: $(grep -o '<path class="line-drawn"[^>]*>' "$dir/broken.html" | head -1)"; fi

# more runs than the ten colours: each its own
for i in $(seq 1 13); do printf '{"epoch":1,"train_loss":%s}\n' "$i" > "$dir/many$i.jsonl"; done
if "$ampc" report "$dir"/many{1..13}.jsonl -o "$dir/many.html" > /dev/null 2>&1 &&
  [ "$(grep -o 'class="swatch" style="background:[^"]*"' "$dir/many.html" | sort -u | wc -l)" = 13 ]; then
  ok "13 runs: 13 colours"
else bad "13 runs: $(grep -o 'class="swatch" style="background:[^"]*"' "$dir/many.html" | sort -u | wc -l) colours"; fi

echo "$pass passed, $fail failed"
[ $fail = 0 ]
