#!/usr/bin/env bash
# Model parallelism in the trainer (issue 28, src/train/parallel3d.c and
# gpt_par.c): `mpirun -np N zs train gpt --tp T --pp P [--dp D]` gives,
# step by step for 10 steps, the losses and gradient norms of one process
# on the same global batch within 1e-5 relative (f32): tensor parallel
# (gpt2 and bloom, with and without sequence parallelism), pipeline
# parallel (GPipe and 1F1B, pp 2 and pp 4 with 8 micro-batches), and
# tp 2 x pp 2 x dp 2 with and without ZeRO-1 and sequence parallelism.
# Each combination runs once: a run that differs from another only by a
# flag that a third covers is left out (GPipe at pp 2 and pp 4 runs with
# recomputation, plain tp 2 x pp 2 x dp 2 as 3d-sel, gpt2 sequence
# parallelism as tp2-sel); every ok line gives the run's wall time.
# No rank keeps a copy of the whole model: the parameters a rank reports
# are its shard, and its allocator holds little beyond its model state.
# Checkpoints are written in the one-process layout: a run stopped at
# tp 2 (and at tp 2 x pp 2 x dp 2 with ZeRO-1) resumes in one process, and
# one process's in 3D and at pp 4, with the uninterrupted losses. Bad
# layouts are refused with a message. Issue 29 on the split model:
# --recompute full|selective (and --recompute-layers), --attention sparse
# and --precision bf16|fp16|fp8 at tp 2, pp 2 and in 8-rank 3D runs give
# the losses of one process with the same flags (f32: 1e-5; mixed
# precision: 1e-3, see below), and full recomputation lowers the step's
# peak memory (both printed).
set -uo pipefail
zs="$ZS_BIN"
if ! command -v mpirun >/dev/null; then
  echo "mpirun not installed: model-parallel test not run"; exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do
  echo "In the beginning was the word $i, and the word was with the light; and the light shone."
done > "$tmp/corpus.txt"
# 4 blocks of width 64, 4 heads, vocabulary 300 (divisible by 2 and 4)
common=(--data "$tmp/corpus.txt" --preset tiny --layers 4 --vocab 300 --batch 8 --seq 32
        --seed 5 --threads 1 --eval-every 4 --warmup 3 --steps 10)
mpi=(mpirun --allow-run-as-root --oversubscribe)
fail=0
# OpenMPI's plugins keep memory until exit: no leak check for MPI runs.
export ASAN_OPTIONS=detect_leaks=0
for arch in gpt2 bloom; do
  "$zs" train gpt "${common[@]}" --arch $arch --out "$tmp/one-$arch" >/dev/null 2>"$tmp/log" \
    || { cat "$tmp/log"; exit 1; }
done
# col FILE KEY: the values of KEY on the step lines of metrics.jsonl.
col() { grep '"loss"' "$1" | sed "s/.*\"$2\":\([-0-9.e+]*\).*/\1/"; }
# same NAME REF DIR: DIR's 10 step losses and gradient norms equal REF's
# within $tol relative (the losses) and $ntol (the norms); 1e-5 in f32.
tol=1e-5 ntol=1e-5
same() {
  local worst
  worst=$(paste <(col "$2/metrics.jsonl" loss) <(col "$3/metrics.jsonl" loss) \
                <(col "$2/metrics.jsonl" grad_norm) <(col "$3/metrics.jsonl" grad_norm) |
          awk '{for (k = 1; k <= 3; k += 2) {d = ($k - $(k+1)) / $k; if (d < 0) d = -d;
                if (d > w[k]) w[k] = d}; n++}
               END {if (n != 10) print "missing"; else printf "%.2e %.2e\n", w[1], w[3]}')
  if [ "$worst" != "missing" ] &&
     awk -v t="$tol" -v nt="$ntol" "BEGIN{split(\"$worst\", w, \" \"); exit !(w[1] <= t && w[2] <= nt)}"; then
    echo "ok $1: 10 step losses and gradient norms equal one process's within" \
         "${worst% *} and ${worst#* } relative (bounds $tol, $ntol)${took:+; ran $took s}"
  else
    echo "FAIL $1: worst relative differences (losses, norms) $worst (bounds $tol, $ntol)" \
         "${took:+; ran $took s}"; fail=1
  fi
}
# now: seconds since the epoch, to the millisecond; since T0: seconds
# from T0 to now, one decimal (the runs' times on the ok lines).
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b - a}'; }
# par ARCH NP NAME FLAGS...: mpirun -np NP zs train gpt FLAGS, compared
# with the one-process run $ref (default: one-ARCH).
par() {
  local arch=$1 np=$2 name=$3 t0 took; shift 3
  t0=$(now)
  if "${mpi[@]}" -np "$np" "$zs" train gpt "${common[@]}" --arch $arch "$@" \
      --out "$tmp/$name" >/dev/null 2>"$tmp/$name.log"; then
    took=$(since "$t0") same "$name ($arch, $np ranks: $*)" "$tmp/${ref:-one-$arch}" "$tmp/$name"
  else
    echo "FAIL $name (mpirun -np $np $*, $(since "$t0") s):"; cat "$tmp/$name.log"; fail=1
  fi
}
# one NAME FLAGS...: the one-process reference run with FLAGS.
one() {
  local name=$1; shift
  "$zs" train gpt "${common[@]}" "$@" --out "$tmp/$name" >/dev/null 2>"$tmp/$name.log" \
    || { echo "FAIL one-process $name:"; cat "$tmp/$name.log"; fail=1; }
}
par gpt2 2 tp2 --tp 2
par bloom 2 tp2-bloom --tp 2
par bloom 2 tp2-sp-bloom --tp 2 --sequence-parallel
par gpt2 2 pp2-1f1b --pp 2 --micro-batches 4 --pp-schedule 1f1b
par gpt2 2 pp2-split --pp 2 --micro-batches 2 --pp-layers 1,3
par gpt2 4 pp4-1f1b --pp 4 --micro-batches 8 --pp-schedule 1f1b
par gpt2 8 3d-zero1 --tp 2 --pp 2 --dp 2 --micro-batches 2 --zero 1 --pp-schedule 1f1b
par gpt2 8 3d-sp --tp 2 --pp 2 --micro-batches 2 --sequence-parallel --pp-schedule 1f1b
par bloom 8 3d-bloom --tp 2 --pp 2 --dp 2 --micro-batches 2 --zero 1 --sequence-parallel

# Issue 29 in the split model, each against one process with the same
# flags: recomputation (the regions under tp replay their collectives;
# under pp each micro-batch keeps its own inputs), block-sparse attention
# on each rank's heads, mixed precision.
one one-full --recompute full
ref=one-full par gpt2 2 tp2-full --tp 2 --recompute full
ref=one-full par gpt2 2 pp2-full --pp 2 --micro-batches 4 --pp-schedule 1f1b --recompute full
ref=one-full par gpt2 8 3d-full --tp 2 --pp 2 --dp 2 --micro-batches 2 --zero 1 --recompute full
one one-sel --recompute selective
ref=one-sel par gpt2 2 tp2-sel --tp 2 --sequence-parallel --recompute selective
ref=one-sel par gpt2 2 pp2-sel --pp 2 --micro-batches 4 --recompute selective
ref=one-sel par gpt2 8 3d-sel --tp 2 --pp 2 --dp 2 --micro-batches 2 --recompute selective
# The rank layout is printed at the start (the bubble at the end: below).
if grep -q "tp groups: \[0 1\] \[2 3\] \[4 5\] \[6 7\]" "$tmp/3d-sel.log" &&
   grep -q "dp groups: \[0 2\] \[1 3\] \[4 6\] \[5 7\]" "$tmp/3d-sel.log" &&
   grep -q "pp groups: \[0 4\] \[1 5\] \[2 6\] \[3 7\]" "$tmp/3d-sel.log"; then
  echo "ok the rank layout of tp 2 x pp 2 x dp 2 is printed"
else
  echo "FAIL no rank layout"; cat "$tmp/3d-sel.log"; fail=1
fi
one one-full1 --recompute full --recompute-layers 3
ref=one-full1 par gpt2 4 pp4-full1 --pp 4 --micro-batches 4 --recompute full --recompute-layers 3
# 64 tokens in blocks of 16: 9 of the 16 blocks (local 0, global 1, random 1)
sparse=(--seq 64 --attention sparse --sparse-block 16 --local 0 --global 1 --random 1)
one one-sparse "${sparse[@]}"
ref=one-sparse par gpt2 2 tp2-sparse --tp 2 "${sparse[@]}"
ref=one-sparse par gpt2 2 pp2-sparse --pp 2 --micro-batches 2 "${sparse[@]}"
ref=one-sparse par gpt2 8 3d-sparse --tp 2 --pp 2 --dp 2 --micro-batches 2 --recompute full \
  "${sparse[@]}"
# Mixed precision against one process in the same precision. The split
# model rounds to the 16-bit type at other points (a row-parallel
# linear's partial sums are rounded before the all-reduce, bias, GeLU and
# residual applied after the rounding instead of in the GEMM's epilogue;
# fp8: the tile scales of each rank's weight shard), one rounding (2^-9
# relative in bf16) per activation: over 10 steps the losses move by up
# to ~5e-4 relative (measured; f32 and bf16 one-process runs differ by
# as much) and the gradient norms, a sum of squares dominated by few
# entries, by up to ~6e-3 (fp8). Bounds: 1e-3 for the losses, 2e-2 for
# the norms. The loss scaler's skips are checked by
# test_parallel3d_precision.
tol=1e-3 ntol=2e-2
for p in bf16 fp16 fp8; do one "one-$p" --precision $p; done
ref=one-bf16 par gpt2 2 tp2-bf16 --tp 2 --precision bf16
ref=one-bf16 par gpt2 2 pp2-bf16 --pp 2 --micro-batches 2 --precision bf16
ref=one-bf16 par gpt2 8 3d-bf16 --tp 2 --pp 2 --dp 2 --micro-batches 2 --zero 1 \
  --precision bf16 --recompute selective
ref=one-fp16 par gpt2 8 3d-fp16 --tp 2 --pp 2 --dp 2 --micro-batches 2 --sequence-parallel \
  --precision fp16
ref=one-fp8 par gpt2 2 tp2-fp8 --tp 2 --precision fp8
tol=1e-5 ntol=1e-5
if grep -q '"precision":"bf16"' "$tmp/3d-bf16/metrics.jsonl" &&
   grep -q '"precision":"fp16","loss_scale":65536' "$tmp/3d-fp16/metrics.jsonl"; then
  echo "ok the mixed-precision runs log their precision and loss scale"
else
  echo "FAIL no precision in metrics.jsonl"; head -2 "$tmp/3d-bf16/metrics.jsonl"; fail=1
fi
# Full recomputation keeps only each block's input: the step's peak (rank
# 0, above the step's start) falls.
for lay in tp2 pp2-1f1b; do
  full=${lay%-1f1b}-full
  a=$(sed -n 's/^step memory.*: peak \([0-9.]*\) MiB.*/\1/p' "$tmp/$lay.log")
  b=$(sed -n 's/^step memory.*: peak \([0-9.]*\) MiB.*/\1/p' "$tmp/$full.log")
  if [ -n "$a" ] && [ -n "$b" ] && awk "BEGIN{exit !($b < $a)}"; then
    echo "ok $lay: step peak $a MiB without recomputation, $b MiB with --recompute full"
  else
    echo "FAIL $lay: step peak '$a' MiB without recomputation, '$b' with"; fail=1
  fi
done

# No rank holds the whole model (the caller's copy is freed once the
# trainer has cut its part; checkpoints and validation work on the parts):
# at the end of the tp 2 x pp 2 x dp 2 run (3d-sel) world rank 0 (stage 0, tp 0)
# holds exactly its shard, counted here from the sizes (vocabulary 300,
# width 64, context 128; blocks 0 and 1): wte/2 + wpe + 2 x ((12 C^2 + 7 C)
# / 2 + 6 C) = 9600 + 8192 + 2 x 25184 = 68160 of the model's 227456; and
# no rank's allocator holds, beyond its model state, half the whole
# model's parameter bytes (a full copy would add all 909824 of them).
mem=$(grep "model parallel memory, world rank" "$tmp/3d-sel.log")
memck=$(echo "$mem" | sed 's/.*world rank \([0-9]*\): parameters \([0-9]*\) of the model.s \([0-9]*\); model state \([0-9]*\) B.*allocator now \([0-9]*\) B.*/\1 \2 \3 \4 \5/' |
        awk '{n++; extra = $5 - $4; if (extra > w) w = extra;
              if ($5 - $4 >= 2 * $3) bad = bad " rank " $1 " holds " extra " B beyond its state;";
              if ($1 == 0 && $2 != 68160) bad = bad " rank 0 has " $2 " parameters;"}
             END {if (n != 8) print "FAIL " n " memory lines"; else if (bad != "") print "FAIL" bad;
                  else print "ok each of 8 ranks holds its shard only: rank 0 68160 of 227456 " \
                             "parameters; at most " w " B beyond the model state (< 909824 / 2)"}')
echo "$memck"
case "$memck" in ok*) ;; *) echo "$mem"; fail=1 ;; esac
bub=$(grep "measured bubble" "$tmp/pp4-1f1b.log")
echo "$bub" | grep -q "formula (p-1)/m = 0.375" && echo "ok $bub" \
  || { echo "FAIL no bubble line: '$bub'"; fail=1; }

# Checkpoints in the one-process layout: stopped after 4 steps on one
# layout, resumed on another; the losses are the uninterrupted run's.
resume() {
  local name=$1 np1=$2 f1=$3 np2=$4 f2=$5 t0
  t0=$(now)
  run() { # NP FLAGS...
    local np=$1; shift
    if [ "$np" = 1 ]; then "$zs" train gpt "${common[@]}" "$@"
    else "${mpi[@]}" -np "$np" "$zs" train gpt "${common[@]}" "$@"; fi
  }
  run "$np1" $f1 --stop-after 4 --out "$tmp/$name" >/dev/null 2>"$tmp/$name.log" &&
  run "$np2" $f2 --resume --out "$tmp/$name" >/dev/null 2>>"$tmp/$name.log" \
    || { echo "FAIL resume $name:"; cat "$tmp/$name.log"; fail=1; return; }
  took=$(since "$t0") same "resume $name" "$tmp/one-gpt2" "$tmp/$name"
}
resume tp2-to-1 2 "--tp 2" 1 ""
resume 3d-to-1 8 "--tp 2 --pp 2 --dp 2 --micro-batches 2 --zero 1" 1 ""
resume 1-to-3d 1 "" 8 "--tp 2 --pp 2 --micro-batches 2 --sequence-parallel"
resume tp2-to-pp4 2 "--tp 2 --sequence-parallel" 4 "--pp 4 --micro-batches 4 --pp-schedule 1f1b"

# Layouts that cannot run are refused, naming why.
refused() { # NP PATTERN FLAGS...
  local np=$1 pat=$2; shift 2
  local out
  if [ "$np" = 1 ]; then out=$("$zs" train gpt "${common[@]}" "$@" --out "$tmp/bad" 2>&1)
  else out=$("${mpi[@]}" -np "$np" "$zs" train gpt "${common[@]}" "$@" --out "$tmp/bad" 2>&1); fi
  if [ $? -ne 0 ] && echo "$out" | grep -q "$pat"; then
    echo "ok refused ($*): $(echo "$out" | grep -m1 "$pat")"
  else
    echo "FAIL not refused ($*): $out"; fail=1
  fi
}
refused 1 "mpirun -np 2" --tp 2
refused 3 "heads and the vocabulary" --tp 3
refused 2 "sum to 3" --pp 2 --pp-layers 1,2
refused 1 "expected 2 counts" --pp 2 --pp-layers 1,x
refused 1 "need tp or pp > 1" --sequence-parallel
refused 2 "ZeRO 0 or 1" --tp 2 --zero 2
refused 2 "divisible by the 1 data-parallel ranks times --micro-batches" --pp 2 --micro-batches 3

# A hung rank (kill -STOP) in a tp 2 x pp 2 job: the others' transfers time
# out (--comm-timeout 5: long enough that a loaded 2-core machine does not
# time out a healthy transfer), the job ends within 60 s, and the message
# names the waiting rank's groups in world ranks.
run="$tmp/hung"
"${mpi[@]}" -np 4 "$zs" train gpt "${common[@]}" --steps 1000000 --eval-every 50 \
    --comm-timeout 5 --tp 2 --pp 2 --micro-batches 2 --out "$run" >"$run.log" 2>&1 &
job=$!
for _ in $(seq 1 600); do [ -s "$run/metrics.jsonl" ] && break; sleep 0.2; done
victim=$(pgrep -f "train gpt.*$run" | grep -v "^$job$" | tail -1)
if [ -n "$victim" ]; then
  start=$(date +%s)
  kill -STOP "$victim"
  for _ in $(seq 1 600); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
  kill -9 $job 2>/dev/null
  wait $job; rc=$?
  took=$(( $(date +%s) - start ))
  if [ $rc -ne 0 ] && [ $took -le 60 ] && grep -q "timed out.*its dp group is world ranks" "$run.log"; then
    echo "ok hung rank: job ended in ${took} s, exit $rc: $(grep -m1 "timed out" "$run.log")"
  else
    echo "FAIL hung rank: exit $rc after ${took} s"; tail -5 "$run.log"; fail=1
  fi
  for pid in $(pgrep -f "train gpt.*$run"); do kill -9 "$pid" 2>/dev/null; done
else
  echo "FAIL hung rank: no rank process found"; cat "$run.log"; fail=1
fi
exit $fail
