#!/usr/bin/env bash
# Model parallelism in the trainer, part 2 of 2 (test_parallel3d.sh: the
# layouts, recomputation, memory): block-sparse attention (issue 29) and
# --precision bf16|fp16|fp8 at tp 2, pp 2 and in 8-rank 3D runs give the
# losses of one process with the same flags (f32: 1e-5; mixed precision:
# 1e-3, see below). Checkpoints are written in the one-process layout: a
# run stopped at tp 2 (and at tp 2 x pp 2 x dp 2 with ZeRO-1) resumes in
# one process, and one process's in 3D and at pp 4, with the uninterrupted
# losses. Bad layouts are refused with a message; a stopped rank ends the
# job with a message naming the groups. Under ZS_TEST_QUICK (the sanitizer
# run) the runs marked slow are left out.
. "$(dirname "$0")/par3d_common.sh"

# 64 tokens in blocks of 16: 9 of the 16 blocks (local 0, global 1, random 1)
sparse=(--seq 64 --attention sparse --sparse-block 16 --local 0 --global 1 --random 1)
one one-sparse "${sparse[@]}"
ref=one-sparse par gpt2 2 tp2-sparse --tp 2 "${sparse[@]}"
ref=one-sparse slow par gpt2 2 pp2-sparse --pp 2 --micro-batches 2 "${sparse[@]}"
ref=one-sparse slow par gpt2 8 3d-sparse --tp 2 --pp 2 --dp 2 --micro-batches 2 --recompute full \
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
for p in bf16 fp8; do one "one-$p" --precision $p; done
slow one one-fp16 --precision fp16
ref=one-bf16 par gpt2 2 tp2-bf16 --tp 2 --precision bf16
ref=one-bf16 slow par gpt2 2 pp2-bf16 --pp 2 --micro-batches 2 --precision bf16
ref=one-bf16 par gpt2 8 3d-bf16 --tp 2 --pp 2 --dp 2 --micro-batches 2 --zero 1 \
  --precision bf16 --recompute selective
ref=one-fp16 slow par gpt2 8 3d-fp16 --tp 2 --pp 2 --dp 2 --micro-batches 2 --sequence-parallel \
  --precision fp16
ref=one-fp8 par gpt2 2 tp2-fp8 --tp 2 --precision fp8
tol=1e-5 ntol=1e-5
if grep -q '"precision":"bf16"' "$tmp/3d-bf16/metrics.jsonl" &&
   { [ -n "${ZS_TEST_QUICK:-}" ] ||
     grep -q '"precision":"fp16","loss_scale":65536' "$tmp/3d-fp16/metrics.jsonl"; }; then
  echo "ok the mixed-precision runs log their precision and loss scale"
else
  echo "FAIL no precision in metrics.jsonl"; head -2 "$tmp/3d-bf16/metrics.jsonl"; fail=1
fi
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
slow resume 3d-to-1 8 "--tp 2 --pp 2 --dp 2 --micro-batches 2 --zero 1" 1 ""
slow resume 1-to-3d 1 "" 8 "--tp 2 --pp 2 --micro-batches 2 --sequence-parallel"
slow resume tp2-to-pp4 2 "--tp 2 --sequence-parallel" 4 "--pp 4 --micro-batches 4 --pp-schedule 1f1b"

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

if [ -z "${ZS_TEST_QUICK:-}" ]; then
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
fi
exit $fail
