#!/usr/bin/env bash
# kill -9 of `zs train gpt` while it checkpoints (--eval-every 1: a save
# after every step), at staggered moments and, by watching for the
# temporary file, in the middle of a save: the checkpoint on disk is always
# absent (killed before the first save) or complete (zs generate loads it),
# its step never goes back, the temporary files a kill leaves do not
# disturb a restart, and --resume continues from the last checkpoint.
set -uo pipefail
zs="$ZS_BIN"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if eval "$2"; then echo "ok $1"; else echo "FAIL $1"; fail=1; fi; }

for i in $(seq 1 120); do
  echo "line $i: the quick brown fox jumps over the lazy dog; and the dog slept, $((i * 7)) times."
done > "$tmp/corpus.txt"
common=(--data "$tmp/corpus.txt" --preset tiny --vocab 300 --batch 2 --seq 16 --seed 7
        --threads 2 --eval-every 1 --warmup 2)

# Runs `zs train gpt ARGS... --out DIR` in the background and kills it
# with SIGKILL after WHEN seconds, or (WHEN = save) as soon as its
# temporary checkpoint file appears. Sets mid_save=1 when that file was
# still there after the kill.
run_and_kill() { # WHEN DIR ARGS...
  local when=$1 out=$2 pid i
  shift 2
  "$zs" train gpt "$@" --out "$out" >/dev/null 2>&1 &
  pid=$!
  if [ "$when" = save ]; then
    for i in $(seq 1 3000); do
      [ -e "$out/checkpoint.safetensors.tmp.$pid" ] && break
      kill -0 $pid 2>/dev/null || break
      sleep 0.005
    done
  else
    sleep "$when"
  fi
  kill -9 $pid 2>/dev/null
  wait $pid 2>/dev/null
  mid_save=0
  [ -e "$out/checkpoint.safetensors.tmp.$pid" ] && mid_save=1
  return 0
}

# The "step" of a checkpoint's metadata (its JSON header), or -1.
ckpt_step() {
  head -c 65536 "$1/checkpoint.safetensors" 2>/dev/null |
    grep -ao '"step":"[0-9]*"' | grep -o '[0-9]*' || echo -1
}

loads() { "$zs" generate --ckpt "$1" --max-new 2 --prompt x >/dev/null 2>"$tmp/gen.err"; }

# 1. The first run of a directory killed early, at its first save and
# later; then the directory is used again: --resume when a checkpoint
# made it to disk, a fresh run otherwise.
k=0 caught=0 bad=""
for when in 0.05 save 0.4 save 0.8; do
  k=$((k + 1))
  out="$tmp/first$k"
  run_and_kill "$when" "$out" "${common[@]}" --steps 1000
  caught=$((caught + mid_save))
  if [ -e "$out/checkpoint.safetensors" ]; then
    loads "$out" || bad+=" $when:load($(head -1 "$tmp/gen.err"))"
    again=(--resume)
  else
    again=()
  fi
  "$zs" train gpt "${common[@]}" --steps 4 "${again[@]}" --out "$out" >/dev/null 2>"$tmp/err" ||
    bad+=" $when:restart($(tail -1 "$tmp/err"))"
  loads "$out" || bad+=" $when:after-restart"
done
check "first run killed at 0.05 s, first save, 0.4 s, save, 0.8 s: no broken checkpoint, restart works${bad:+ ($bad)}" \
      '[ -z "$bad" ]'

# 2. Resumed runs killed while they train and save every step.
out="$tmp/run"
"$zs" train gpt "${common[@]}" --steps 2 --out "$out" >/dev/null 2>"$tmp/err" || { cat "$tmp/err"; exit 1; }
prev=$(ckpt_step "$out") bad=""
for when in 0.3 save 0.6 0.9 save 1.3; do
  run_and_kill "$when" "$out" "${common[@]}" --steps 1000 --resume
  caught=$((caught + mid_save))
  step=$(ckpt_step "$out")
  loads "$out" || bad+=" $when:load($(head -1 "$tmp/gen.err"))"
  [ "$step" -ge "$prev" ] || bad+=" $when:step $prev->$step"
  prev=$step
done
check "resumed run killed 6 times: checkpoint loads, step never goes back (now $prev)${bad:+ ($bad)}" \
      '[ -z "$bad" ] && [ "$prev" -ge 2 ]'
left=$(find "$tmp" -name '*.tmp.*' | wc -l)
echo "note: $caught of 11 kills landed inside a save; $left temporary files left by kills"

# 3. --resume continues from the last checkpoint to the end of its steps,
# beside whatever temporary files the kills left.
last=$((prev + 2))
"$zs" train gpt "${common[@]}" --steps 1000 --stop-after $last --resume --out "$out" \
  >/dev/null 2>"$tmp/err"
rc=$?
check "--resume after the kills continues from step $prev to $last (exit $rc)" \
      '[ $rc -eq 0 ] && grep -q "resuming .* at step $prev" "$tmp/err" && [ "$(ckpt_step "$out")" -eq $last ]'
check "the final checkpoint loads" 'loads "$out"'
exit $fail
