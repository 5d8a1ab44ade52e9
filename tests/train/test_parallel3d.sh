#!/usr/bin/env bash
# Model parallelism in the trainer (issue 28, src/train/parallel3d.c and
# gpt_par.c), part 1 of 2 (test_parallel3d_more.sh: sparse attention,
# mixed precision, checkpoints across layouts, refusals, a hung rank):
# `mpirun -np N zs train gpt --tp T --pp P [--dp D]` gives, step by step
# for 10 steps, the losses and gradient norms of one process on the same
# global batch within 1e-5 relative (f32): tensor parallel (gpt2 and
# bloom, with and without sequence parallelism), pipeline parallel (GPipe
# and 1F1B, pp 2 and pp 4 with 8 micro-batches), and tp 2 x pp 2 x dp 2
# with ZeRO-1 and with sequence parallelism (bloom). Each combination runs
# once: a run that differs from another only by a flag that a third covers
# is left out; every ok line gives the run's wall time. No rank keeps a
# copy of the whole model: the parameters a rank reports are its shard,
# and its allocator holds little beyond its model state. Issue 29 on the
# split model: --recompute full|selective (and --recompute-layers) at
# tp 2, pp 2 and in 8-rank 3D runs give the losses of one process with
# the same flags, and full recomputation lowers the step's peak memory.
# Under ZS_TEST_QUICK (the sanitizer run) the runs marked slow are left out.
. "$(dirname "$0")/par3d_common.sh"
"$zs" train gpt "${common[@]}" --arch bloom --out "$tmp/one-bloom" >/dev/null 2>"$tmp/log" \
  || { cat "$tmp/log"; exit 1; }

par gpt2 2 tp2 --tp 2
slow par bloom 2 tp2-bloom --tp 2
par bloom 2 tp2-sp-bloom --tp 2 --sequence-parallel
par gpt2 2 pp2-1f1b --pp 2 --micro-batches 4 --pp-schedule 1f1b
slow par gpt2 2 pp2-split --pp 2 --micro-batches 2 --pp-layers 1,3
slow par gpt2 4 pp4-1f1b --pp 4 --micro-batches 8 --pp-schedule 1f1b
par gpt2 8 3d-zero1 --tp 2 --pp 2 --dp 2 --micro-batches 2 --zero 1 --pp-schedule 1f1b
slow par bloom 8 3d-bloom --tp 2 --pp 2 --dp 2 --micro-batches 2 --zero 1 --sequence-parallel

# Issue 29 in the split model, each against one process with the same
# flags: recomputation (the regions under tp replay their collectives;
# under pp each micro-batch keeps its own inputs), block-sparse attention
# on each rank's heads, mixed precision.
one one-full --recompute full
ref=one-full par gpt2 2 tp2-full --tp 2 --recompute full
ref=one-full par gpt2 2 pp2-full --pp 2 --micro-batches 4 --pp-schedule 1f1b --recompute full
ref=one-full slow par gpt2 8 3d-full --tp 2 --pp 2 --dp 2 --micro-batches 2 --zero 1 \
  --pp-schedule 1f1b --recompute full
one one-sel --recompute selective
ref=one-sel par gpt2 2 tp2-sel --tp 2 --sequence-parallel --recompute selective
ref=one-sel slow par gpt2 2 pp2-sel --pp 2 --micro-batches 4 --recompute selective
ref=one-sel par gpt2 8 3d-sel --tp 2 --pp 2 --dp 2 --micro-batches 2 --recompute selective
# The rank layout is printed at the start (the bubble at the end: below).
if grep -q "tp groups: \[0 1\] \[2 3\] \[4 5\] \[6 7\]" "$tmp/3d-sel.log" &&
   grep -q "dp groups: \[0 2\] \[1 3\] \[4 6\] \[5 7\]" "$tmp/3d-sel.log" &&
   grep -q "pp groups: \[0 4\] \[1 5\] \[2 6\] \[3 7\]" "$tmp/3d-sel.log"; then
  echo "ok the rank layout of tp 2 x pp 2 x dp 2 is printed"
else
  echo "FAIL no rank layout"; cat "$tmp/3d-sel.log"; fail=1
fi
slow one one-full1 --recompute full --recompute-layers 3
ref=one-full1 slow par gpt2 4 pp4-full1 --pp 4 --micro-batches 4 --recompute full --recompute-layers 3
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
if [ -z "${ZS_TEST_QUICK:-}" ]; then
  bub=$(grep "measured bubble" "$tmp/pp4-1f1b.log")
  echo "$bub" | grep -q "formula (p-1)/m = 0.375" && echo "ok $bub" \
    || { echo "FAIL no bubble line: '$bub'"; fail=1; }
fi

exit $fail
