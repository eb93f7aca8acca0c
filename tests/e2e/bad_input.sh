#!/usr/bin/env bash
# The CLI on bad input: every case in bad_input_cases.txt must fail cleanly --
# a non-zero exit status that is not a signal (< 128), the one it lists, and
# on stderr exactly one line, "ampc: error: ...", containing the listed text.
#
#   bash tests/e2e/bad_input.sh <path-to-ampc> <scratch-dir>
#
# The bad files the cases read are made here, in the scratch folder, from
# nothing but bash: a small valid Fashion-MNIST-like set (IDX), broken copies
# of it, broken CIFAR batches, broken safetensors headers, and weights of the
# mlp and cnn models saved by a short training run on the small set.
# The byte writers below build printf formats out of \xHH escapes on purpose.
# shellcheck disable=SC2059
set -uo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 <path-to-ampc> <scratch-dir>" >&2
  exit 2
fi
AMPC=$1
D=$2
case $D in "" | / | . | "$HOME") echo "bad_input: refusing scratch dir '$D'" >&2; exit 2 ;; esac
CASES="$(cd "$(dirname "$0")" && pwd)/bad_input_cases.txt"
[ -x "$AMPC" ] || { echo "bad_input: $AMPC is not executable" >&2; exit 2; }
rm -rf "$D"
mkdir -p "$D"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
start=$SECONDS

# ---- byte writers (escape text for printf, so no NUL passes through $(...)) --

be32() { printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255)); }
le64() {
  local i s=""
  for i in 0 1 2 3 4 5 6 7; do s+=$(printf '\\x%02x' $(($1 >> (8 * i) & 255))); done
  printf '%s' "$s"
}
# n bytes of one value (octal escape for tr)
bytes() { head -c "$1" /dev/zero | tr '\0' "${2:-\\0}"; }
# labels 0..9 repeating, n of them
labels() { local i; for ((i = 0; i < $1; i++)); do printf "\\x$(printf %02x $((i % 10)))"; done; }

# idx_images FILE N H W [MAGIC]: header, then N*H*W pixels of 0x40
idx_images() {
  { printf "$(be32 "${5:-2051}")$(be32 "$2")$(be32 "$3")$(be32 "$4")"; bytes $(($2 * $3 * $4)) '\100'; } >"$1"
}
# idx_labels FILE N [MAGIC]: header, then labels 0..9 repeating
idx_labels() { { printf "$(be32 "${3:-2049}")$(be32 "$2")"; labels "$2"; } >"$1"; }

# fmnist DIR NTRAIN NTEST: a valid small Fashion-MNIST-like folder
fmnist() {
  mkdir -p "$1"
  idx_images "$1/train-images-idx3-ubyte" "$2" 28 28
  idx_labels "$1/train-labels-idx1-ubyte" "$2"
  idx_images "$1/t10k-images-idx3-ubyte" "$3" 28 28
  idx_labels "$1/t10k-labels-idx1-ubyte" "$3"
}

# st FILE JSON [DATA_BYTES [HEADER_LEN]]: a safetensors file with this header
# and DATA_BYTES zero bytes of data; HEADER_LEN overrides the length field.
st() {
  { printf "$(le64 "${4:-${#2}}")"; printf '%s' "$2"; bytes "${3:-0}"; } >"$1"
}

# cifar_record LABEL [COARSE]: one CIFAR-10 (or, with COARSE, CIFAR-100) record
cifar_record() {
  [ $# -gt 1 ] && printf "\\x$(printf %02x "$2")"
  printf "\\x$(printf %02x "$1")"
  bytes 3072 '\100'
}

# ---- the files the cases use ------------------------------------------------

fmnist "$D/fm" 16 8

# IDX, each broken in one place (a copy of the small set otherwise)
for b in trunc magic lmagic label mismatch nolabels zerodim gz trailing; do fmnist "$D/idx_$b" 16 8; done
fmnist "$D/idx_huge" 16 8
# 65536 x 65536 pixels per image: over the reader's 2 GiB sanity limit
printf "$(be32 2051)$(be32 1)$(be32 65536)$(be32 65536)" >"$D/idx_huge/train-images-idx3-ubyte"
head -c 5000 "$D/fm/train-images-idx3-ubyte" >"$D/idx_trunc/train-images-idx3-ubyte"
idx_images "$D/idx_magic/train-images-idx3-ubyte" 16 28 28 2052
idx_labels "$D/idx_lmagic/train-labels-idx1-ubyte" 16 2051
{ printf "$(be32 2049)$(be32 16)"; labels 15; printf '\x0a'; } >"$D/idx_label/train-labels-idx1-ubyte"
idx_labels "$D/idx_mismatch/train-labels-idx1-ubyte" 15
rm "$D/idx_nolabels/train-labels-idx1-ubyte"
idx_images "$D/idx_zerodim/train-images-idx3-ubyte" 16 0 28
{ cat "$D/fm/train-images-idx3-ubyte"; printf 'x'; } >"$D/idx_trailing/train-images-idx3-ubyte"
# a gzip stream whose data is cut off (plain name removed so the .gz is read)
rm "$D/idx_gz/train-images-idx3-ubyte"
printf '\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\x01\x10\x00\xef\xff\x00\x00\x08\x03' \
  >"$D/idx_gz/train-images-idx3-ubyte.gz"

# CIFAR-10 / CIFAR-100 test sets (the cases use the test split through eval)
mkdir -p "$D/c10_partial" "$D/c10_label" "$D/c100_coarse" "$D/c10_empty" "$D/c10_train_missing"
{ cifar_record 1; cifar_record 2; cifar_record 3 | head -c 1000; } >"$D/c10_partial/test_batch.bin"
{ cifar_record 1; cifar_record 10; } >"$D/c10_label/test_batch.bin"
{ cifar_record 5 20; } >"$D/c100_coarse/test.bin"
: >"$D/c10_empty/test_batch.bin"
cifar_record 4 >"$D/c10_train_missing/data_batch_1.bin"

# safetensors, broken headers
st "$D/st_past_end.safetensors" '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}' 4 4096
st "$D/st_bad_json.safetensors" '{"a":{"dtype":"F32","shape":[1],' 4
st "$D/st_dtype.safetensors" '{"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}}' 4
st "$D/st_overlap.safetensors" \
  '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}' 12
st "$D/st_gap.safetensors" '{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}' 8
st "$D/st_size.safetensors" '{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}' 8
st "$D/st_missing.safetensors" '{"foo":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}' 4
printf 'abc' >"$D/st_short.safetensors"

# weights saved by ampc itself, for the model-mismatch cases
"$AMPC" train --model mlp --data "$D/fm" --epochs 1 --batch-size 8 --quiet --checkpoint-dir "$D/ck_mlp" \
  --save "$D/mlp.safetensors" >"$D/mlp.log" 2>&1 || { echo "bad_input: training mlp failed:" >&2; cat "$D/mlp.log" >&2; exit 1; }
"$AMPC" train --model cnn --data "$D/fm" --epochs 1 --batch-size 8 --quiet \
  --save "$D/cnn.safetensors" >"$D/cnn.log" 2>&1 || { echo "bad_input: training cnn failed:" >&2; cat "$D/cnn.log" >&2; exit 1; }

# st_edit IN OUT SED_EXPR [EXTRA_DATA_BYTES]: OUT is IN with its JSON header
# rewritten by sed and EXTRA_DATA_BYTES zero bytes appended to its data.
st_edit() {
  local hlen json
  hlen=$(od -An -t u8 -N 8 "$1" | tr -d ' ')
  json=$(head -c $((8 + hlen)) "$1" | tail -c "$hlen" | sed -e 's/ *$//' -e "$3")
  { printf "$(le64 "${#json}")"; printf '%s' "$json"; tail -c +$((9 + hlen)) "$1"; bytes "${4:-0}"; } >"$2"
}
dlen=$(($(stat -c %s "$D/mlp.safetensors") - 8 - $(od -An -t u8 -N 8 "$D/mlp.safetensors" | tr -d ' ')))
# a tensor the mlp does not have, after all of its own
st_edit "$D/mlp.safetensors" "$D/mlp_extra.safetensors" \
  "s/^{/{\"zz.extra\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[$dlen,$((dlen + 4))]},/" 4
# the last bias stored as I32: the same bytes, not a float
st_edit "$D/mlp.safetensors" "$D/mlp_i32.safetensors" 's/"5.bias":{"dtype":"F32"/"5.bias":{"dtype":"I32"/'
# the first layer's weight transposed: the same bytes, the wrong shape
st_edit "$D/mlp.safetensors" "$D/mlp_shape.safetensors" 's/"shape":\[256,784\]/"shape":[784,256]/'
# a dtype ampc knows but cannot hold
st_edit "$D/mlp.safetensors" "$D/mlp_u32.safetensors" 's/"dtype":"F32"/"dtype":"U32"/'

# grad's batch files: x without y, and x of the wrong rank
st "$D/batch_noy.safetensors" '{"x":{"dtype":"F32","shape":[2,1,28,28],"data_offsets":[0,6272]}}' 6272
st "$D/batch_rank.safetensors" \
  '{"x":{"dtype":"F32","shape":[2,784],"data_offsets":[0,6272]},"y":{"dtype":"I64","shape":[2],"data_offsets":[6272,6288]}}' 6288
st "$D/batch_empty.safetensors" \
  '{"x":{"dtype":"F32","shape":[0,1,28,28],"data_offsets":[0,0]},"y":{"dtype":"I64","shape":[0],"data_offsets":[0,0]}}'
st "$D/batch_yfloat.safetensors" \
  '{"x":{"dtype":"F32","shape":[2,1,28,28],"data_offsets":[0,6272]},"y":{"dtype":"F32","shape":[2],"data_offsets":[6272,6280]}}' 6280
# labels 50 and -3 for a 10-class model
st "$D/batch_label.safetensors" \
  '{"x":{"dtype":"F32","shape":[2,1,28,28],"data_offsets":[0,6272]},"y":{"dtype":"I64","shape":[2],"data_offsets":[6272,6288]}}' 6272
printf '\x32\0\0\0\0\0\0\0\xfd\xff\xff\xff\xff\xff\xff\xff' >>"$D/batch_label.safetensors"
# a NaN pixel (the first) and valid labels 1, 2
st "$D/batch_nan.safetensors" \
  '{"x":{"dtype":"F32","shape":[2,1,28,28],"data_offsets":[0,6272]},"y":{"dtype":"I64","shape":[2],"data_offsets":[6272,6288]}}'
{ printf '\x00\x00\xc0\x7f'; bytes 6268; printf '\x01\0\0\0\0\0\0\0\x02\0\0\0\0\0\0\0'; } >>"$D/batch_nan.safetensors"

# ---- inputs that disagree with each other (class 1 of issue 11) -------------
# test sets whose images differ from the training set's 28x28
# images too small for the cnn's two pools, in both sets
mkdir -p "$D/sh_3x3"
for f in train t10k; do idx_images "$D/sh_3x3/$f-images-idx3-ubyte" 4 3 3; idx_labels "$D/sh_3x3/$f-labels-idx1-ubyte" 4; done
for t in 32x32 1000x1000 28x29; do
  mkdir -p "$D/sh_$t"
  idx_images "$D/sh_$t/train-images-idx3-ubyte" 16 28 28
  idx_labels "$D/sh_$t/train-labels-idx1-ubyte" 16
  idx_images "$D/sh_$t/t10k-images-idx3-ubyte" 2 "${t%x*}" "${t#*x}"
  idx_labels "$D/sh_$t/t10k-labels-idx1-ubyte" 2
done
fmnist_32() {
  mkdir -p "$1"
  idx_images "$1/train-images-idx3-ubyte" 16 32 32
  idx_labels "$1/train-labels-idx1-ubyte" 16
  idx_images "$1/t10k-images-idx3-ubyte" 8 32 32
  idx_labels "$1/t10k-labels-idx1-ubyte" 8
}
fmnist_32 "$D/fm32"
# CIFAR test sets (read through eval) need weights made for 3x32x32 and 10 / 100 classes
mkdir -p "$D/c10_ok" "$D/c100_ok"
for i in 0 1 2 3 4 5 6 7; do cifar_record $i; done >"$D/c10_ok/data_batch_1.bin"
cp "$D/c10_ok/data_batch_1.bin" "$D/c10_ok/test_batch.bin"
for i in 0 1 2 3 4 5 6 7; do cifar_record $((i * 11)) $i; done >"$D/c100_ok/train.bin"
cp "$D/c100_ok/train.bin" "$D/c100_ok/test.bin"
for ds in c10 c100; do
  name=cifar10; [ $ds = c100 ] && name=cifar100
  "$AMPC" train --model cnn --dataset $name --data "$D/${ds}_ok" --train-limit 8 --epochs 1 --batch-size 4 --quiet \
    --save "$D/cnn_$ds.safetensors" >"$D/cnn_$ds.log" 2>&1 || { echo "bad_input: training cnn on $ds failed:" >&2; cat "$D/cnn_$ds.log" >&2; exit 1; }
done
ckpt=$(ls "$D"/ck_mlp/ckpt-step-*.safetensors | head -n 1)
# an O2 checkpoint (f16 model tensors beside their f32 masters, Adam's state)
"$AMPC" train --model mlp --opt-level O2 --data "$D/fm" --epochs 1 --batch-size 8 --quiet --checkpoint-dir "$D/ck_o2" \
  >"$D/o2.log" 2>&1 || { echo "bad_input: training mlp at O2 failed:" >&2; cat "$D/o2.log" >&2; exit 1; }
ckpt2=$(ls "$D"/ck_o2/ckpt-step-*.safetensors | head -n 1)
# the model's own f16 copy of a weight transposed beside its master; a master of
# no parameter; a state Adam does not keep (each name's tensor otherwise the
# file's own: the header renamed, the data as it was)
st_edit "$ckpt2" "$D/ck_o2_own.safetensors" 's/"1.weight":{"dtype":"F16","shape":\[256,784\]/"1.weight":{"dtype":"F16","shape":[784,256]/'
st_edit "$ckpt2" "$D/ck_o2_master.safetensors" 's/"master.5.bias":/"master.9.bias":/'
st_edit "$ckpt2" "$D/ck_o2_optim.safetensors" 's/"5.bias":{"dtype":"F16"/"optim.momentum_buffer.5.bias":{"dtype":"F16"/'
# a grad batch of 32x32 images, and the mlp's weights without the shapes they were made for
st "$D/batch_32.safetensors" \
  '{"x":{"dtype":"F32","shape":[2,1,32,32],"data_offsets":[0,8192]},"y":{"dtype":"I64","shape":[2],"data_offsets":[8192,8208]}}' 8208
st_edit "$D/mlp.safetensors" "$D/mlp_nometa.safetensors" 's/"input":"1x28x28",//; s/,"input":"1x28x28"//; s/"classes":"10",//; s/,"classes":"10"//'
# the checkpoint with a transposed tensor (same bytes, another shape)
st_edit "$ckpt" "$D/ck_shape.safetensors" 's/"1.weight":{"dtype":"F32","shape":\[256,784\]/"1.weight":{"dtype":"F32","shape":[784,256]/'
# preprocessing records that say nothing sound: 9 channels, not JSON, a std of 0
st_edit "$D/mlp.safetensors" "$D/mlp_pre_shape.safetensors" 's/\\"shape\\":\[1,28,28\]/\\"shape\\":[9,28,28]/'
st_edit "$D/mlp.safetensors" "$D/mlp_pre_json.safetensors" 's/"preprocessing":"{/"preprocessing":"{{/'
st_edit "$ckpt" "$D/ck_pre_std.safetensors" 's/\\"std\\":\[[0-9.]*\]/\\"std\\":[0]/'
# a weights format of another version
st_edit "$D/mlp.safetensors" "$D/mlp_fmt.safetensors" 's/"ampc-weights-1"/"ampc-weights-999"/'
# a checkpoint folder whose only file merely looks like a checkpoint (a sign, a step past int64)
mkdir -p "$D/ck_names"
cp "$ckpt" "$D/ck_names/ckpt-step-+9.safetensors"
cp "$ckpt" "$D/ck_names/ckpt-step-99999999999999999999999.safetensors"

# ---- counts out of range (class 2) ------------------------------------------
# one 46340x46340 image (just under the IDX reader's 2 GiB limit), gzipped: its
# header is sound and the compressed size could hold it, so only the model's
# memory need refuses it -- before any pixel is read
mkdir -p "$D/huge_img"
{ printf "$(be32 2051)$(be32 1)$(be32 46340)$(be32 46340)"; head -c 2200000 /dev/urandom; } | gzip -1 >"$D/huge_img/train-images-idx3-ubyte.gz"
idx_labels "$D/huge_img/train-labels-idx1-ubyte" 1
cp "$D/huge_img/train-images-idx3-ubyte.gz" "$D/huge_img/t10k-images-idx3-ubyte.gz"
cp "$D/huge_img/train-labels-idx1-ubyte" "$D/huge_img/t10k-labels-idx1-ubyte"
# checkpoints whose numbers are out of range in their full width (the run
# state is JSON inside a metadata string, so its quotes are escaped)
st_edit "$ckpt" "$D/ck_epoch.safetensors" 's/\\"epoch\\":1,/\\"epoch\\":4294967297,/'
st_edit "$ckpt" "$D/ck_hyst.safetensors" 's/\\"hysteresis_left\\":1,/\\"hysteresis_left\\":4294967297,/'
st_edit "$ckpt" "$D/ck_seen.safetensors" 's/\\"seen\\":0,/\\"seen\\":-5,/'
st_edit "$ckpt" "$D/ck_secs.safetensors" 's/\\"train_seconds\\":[0-9.e+-]*/\\"train_seconds\\":1e308/'
st_edit "$ckpt" "$D/ck_batch.safetensors" 's/\\"epoch\\":1,/\\"epoch\\":0,/; s/\\"batch\\":0,/\\"batch\\":99,/'
st_edit "$ckpt" "$D/ck_input.safetensors" 's/"input":"1x28x28"/"input":"1x28x99999999999"/'
# numbers each in range, but not with each other: a scaler's skipped steps past
# its steps; an optimizer whose step count is not the run's applied steps
st_edit "$ckpt" "$D/ck_skipped.safetensors" 's/\\"skipped_steps\\":0,/\\"skipped_steps\\":100,/'
st_edit "$ckpt" "$D/ck_optstep.safetensors" 's/\\"optimizer_step\\":[0-9]*/\\"optimizer_step\\":0/'
# a preprocessing record that is no object; another mean than the dataset's
st_edit "$ckpt" "$D/ck_pre_num.safetensors" 's/\\"preprocessing\\":{[^}]*}/\\"preprocessing\\":5/'
st_edit "$ckpt" "$D/ck_pre_mean.safetensors" 's/\\"mean\\":\[[0-9.]*\]/\\"mean\\":[0.5]/'

# ---- special files (class 3) -------------------------------------------------
mkfifo "$D/fifo.safetensors" "$D/fifo.jsonl"
mkdir -p "$D/fifo_idx" "$D/fifo_gz" "$D/fifo_c10" "$D/dir_idx"
fmnist "$D/fifo_idx" 16 8; rm "$D/fifo_idx/train-images-idx3-ubyte"; mkfifo "$D/fifo_idx/train-images-idx3-ubyte"
fmnist "$D/fifo_gz" 16 8; rm "$D/fifo_gz/train-labels-idx1-ubyte"; mkfifo "$D/fifo_gz/train-labels-idx1-ubyte.gz"
mkfifo "$D/fifo_c10/test_batch.bin"
fmnist "$D/dir_idx" 16 8; rm "$D/dir_idx/t10k-images-idx3-ubyte"; mkdir "$D/dir_idx/t10k-images-idx3-ubyte"
# a data folder nobody but its owner may read (the case runs as nobody under root)
fmnist "$D/noperm" 16 8; chmod 000 "$D/noperm"

# ---- checkpoint folders (class 4) -------------------------------------------
# a folder another run holds: flock(1) keeps the lock, the file names pid 4242
mkdir -p "$D/ck_locked" "$D/ck_fifo"
echo 4242 >"$D/ck_locked/.lock"
# the subshell becomes the sleep, so $! is the one process holding the lock
(exec 9<>"$D/ck_locked/.lock"; flock 9; exec sleep 600) </dev/null >/dev/null 2>&1 &
holder=$!
trap 'kill $holder 2>/dev/null' EXIT
for _ in $(seq 1 50); do flock -n "$D/ck_locked/.lock" true 2>/dev/null || break; sleep 0.1; done
mkfifo "$D/ck_fifo/.lock"
mkdir -p "$D/ck_lockdir/.lock"
gen_secs=$((SECONDS - start))

# ---- the cases --------------------------------------------------------------

pass=0
fail=0
n=0
while IFS= read -r line || [ -n "$line" ]; do
  [[ -z "${line// /}" || $line == \#* ]] && continue
  IFS='|' read -r name want text cmd <<<"$line"
  name=$(echo "$name" | xargs)
  want=$(echo "$want" | xargs)
  text=$(echo "$text" | sed -e 's/^ *//' -e 's/ *$//')
  n=$((n + 1))
  # the command may use $D, and quotes for empty or spaced arguments
  args=()
  eval "args=($cmd)"
  # "@nobody ARGS": run as an unprivileged user (root passes every permission check)
  as=()
  if [ "${args[0]}" = "@nobody" ]; then
    args=("${args[@]:1}")
    [ "$(id -u)" = 0 ] && as=(setpriv --reuid=65534 --regid=65534 --clear-groups --)
  fi
  # BAD_INPUT_ONLY=REGEX runs only the cases whose names match (the sanitizer build runs the shape_ ones)
  if [ -n "${BAD_INPUT_ONLY:-}" ] && ! [[ $name =~ $BAD_INPUT_ONLY ]]; then n=$((n - 1)); continue; fi
  timeout 60 "${as[@]}" "$AMPC" "${args[@]}" >"$D/out.txt" 2>"$D/err.txt" </dev/null
  rc=$?
  lines=$(wc -l <"$D/err.txt")
  first=$(head -n 1 "$D/err.txt")
  why=""
  if [ $rc -eq 0 ]; then why="succeeded (exit 0)"
  elif [ $rc -eq 124 ]; then why="timed out after 60 s"
  elif [ $rc -ge 128 ]; then why="killed by signal $((rc - 128))"
  elif [ "$want" != "$rc" ]; then why="exit status $rc, expected $want"
  elif [ "$lines" -ne 1 ] || [ -n "$(tail -c 1 "$D/err.txt")" ]; then why="stderr is $lines lines, expected exactly one"
  elif [[ $first != "ampc: error: "* ]]; then why="stderr does not start with 'ampc: error: '"
  elif [[ $first != *"$text"* ]]; then why="error does not contain '$text'"
  fi
  if [ -z "$why" ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL $name: $why" >&2
    echo "  command: ampc ${args[*]}" >&2
    sed 's/^/  stderr: /' "$D/err.txt" | head -n 5 >&2
  fi
done <"$CASES"

echo "bad_input: $n cases in $((SECONDS - start)) s (files made in $gen_secs s)"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ] && { [ $n -ge 30 ] || { [ -n "${BAD_INPUT_ONLY:-}" ] && [ $n -ge 1 ]; }; }
