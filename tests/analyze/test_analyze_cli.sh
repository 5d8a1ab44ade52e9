#!/usr/bin/env bash
# zs analyze end to end: the chapter's BLOOM-176B numbers in the tables and
# in --json (34.8 PFLOP per batch of 16, 3525 GB of fp32 AdamW state, 45
# devices of 80 GB), every preset, a JSON config and --set flags, and bad
# input (unknown flag or model, bad number, missing or malformed config,
# impossible layout): one clear message on stderr and exit status 2.
set -uo pipefail
zs="$ZS_BIN"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if eval "$2"; then echo "ok $1"; else echo "FAIL $1"; fail=1; fi; }
expect2() { # name, command...: exit status 2 and a short message on stderr
  local name=$1; shift
  "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  if [ $rc -eq 2 ] && [ -s "$tmp/err" ] && [ "$(wc -l <"$tmp/err")" -le 3 ] &&
     grep -q "^zs analyze: " "$tmp/err"; then
    echo "ok $name: $(head -1 "$tmp/err")"
  else
    echo "FAIL $name: exit $rc, stderr: $(cat "$tmp/err")"; fail=1
  fi
}

"$zs" analyze --model bloom-176b --batch 16 --micro-batch 2 >"$tmp/bloom" 2>"$tmp/err" ||
  { echo "FAIL bloom run: $(cat "$tmp/err")"; exit 1; }
check "bloom: 34.8 PFLOP per batch of 16 (decoder blocks)" \
      'grep -E "^decoder blocks \(chapter\).* 34\.8 PF" "$tmp/bloom" >/dev/null'
check "bloom: 3525 GB of fp32 AdamW state" 'grep -E "^subtotal +3525 GB N\*20" "$tmp/bloom" >/dev/null'
check "bloom: 705 / 2115 GB rows" \
      'grep -qE "^weights +705 GB" "$tmp/bloom" && grep -qE "^optimizer states +2115 GB" "$tmp/bloom"'
check "bloom: at least 45 devices of 80 GB" 'grep -E "^min devices +45 .*80 GB" "$tmp/bloom" >/dev/null'
check "bloom: per-operator table with the chapter's intensities" \
      'grep -qE "^x W_Q .*5213\.1" "$tmp/bloom" && grep -qE "^Q K\^T .*227\.6 .*memory" "$tmp/bloom" &&
       grep -qE "^MLP up .*6036\.2 .*compute" "$tmp/bloom"'
grep -E "^(decoder blocks|subtotal|min devices)" "$tmp/bloom"

"$zs" analyze --model bloom-176b --batch 16 --micro-batch 2 --json >"$tmp/bloom.json" 2>"$tmp/err"
check "bloom --json: valid, 34.8 P, 3525 GB, 45 devices" 'python3 - "$tmp/bloom.json" <<EOF
import json, sys
j = json.load(open(sys.argv[1]))
assert round(j["flops"]["total"] / 1e15, 1) == 34.8, j["flops"]["total"]
assert round(j["memory"]["fp32"]["total"] / 1e9) == 3525
assert j["memory"]["min_devices_fp32"] == 45
assert j["model"]["params"] == 176247271424
assert len(j["block_ops"]) >= 8 and j["layout"]["micro_batches"] == 8
assert any(d["name"] == "cpu" and d["measured"] for d in j["devices"])
EOF'

bad_presets=""
for m in gpt2-small gpt2-medium gpt2-large gpt2-xl gpt3-175b llama-65b llama2-70b; do
  "$zs" analyze --model $m --json >"$tmp/m.json" 2>"$tmp/err" &&
    python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/m.json" ||
    bad_presets="$bad_presets $m"
done
check "every preset gives valid JSON${bad_presets:+ (not:$bad_presets)}" '[ -z "$bad_presets" ]'

"$zs" analyze --model llama2-70b --batch 1024 --micro-batch 1 --dp 16 --tp 8 --pp 4 \
  --zero 1 --recompute selective --device h100 --mfu 0.45 --tokens 2e12 >"$tmp/llama" 2>"$tmp/err"
check "3D layout on h100 with a token budget" \
      'grep -q "step time on 512 x h100-sxm at MFU 0.45" "$tmp/llama" && grep -q "tokens:" "$tmp/llama"'

printf '{"base": "gpt2-small", "n_layer": 6, "d_model": 512, "n_head": 8}\n' >"$tmp/cfg.json"
"$zs" analyze --config "$tmp/cfg.json" --json >"$tmp/cfg.out" 2>"$tmp/err"
check "JSON config: d_ff re-derived as 4h" \
      'python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j[\"model\"][\"d_ff\"]==2048 and j[\"model\"][\"n_layer\"]==6" "$tmp/cfg.out"'
"$zs" analyze --set n_layer=2 --set d_model=64 --set n_head=4 --set vocab=100 --set seq_len=32 \
  --batch 4 --micro-batch 2 >"$tmp/set.out" 2>"$tmp/err"
check "config from --set flags alone" 'grep -q "^Model custom: l=2 h=64 n=4" "$tmp/set.out"'
"$zs" analyze --help >"$tmp/help" 2>&1
check "--help exits 0" '[ $? -eq 0 ] && grep -q "usage: zs analyze" "$tmp/help"'

printf '{"n_layer": 2,\n "d_model": }\n' >"$tmp/bad.json"
printf '{"n_layer": 2, "widgets": 3}\n' >"$tmp/badkey.json"
expect2 "unknown flag" "$zs" analyze --model gpt2 --frobnicate 3
expect2 "unknown model" "$zs" analyze --model alexnet
expect2 "bad number" "$zs" analyze --model gpt2 --batch many
expect2 "negative number" "$zs" analyze --model gpt2 --tp -2
expect2 "bad mfu" "$zs" analyze --model gpt2 --mfu 1.5
expect2 "missing value" "$zs" analyze --model gpt2 --batch
expect2 "missing config file" "$zs" analyze --config "$tmp/nope.json"
expect2 "malformed config" "$zs" analyze --config "$tmp/bad.json"
expect2 "unknown config key" "$zs" analyze --config "$tmp/badkey.json"
expect2 "no model" "$zs" analyze --batch 4
expect2 "model and config" "$zs" analyze --model gpt2 --config "$tmp/cfg.json"
expect2 "ZeRO stage 5" "$zs" analyze --model gpt2 --zero 5
expect2 "bad recompute" "$zs" analyze --model gpt2 --recompute some
expect2 "unknown device" "$zs" analyze --model gpt2 --device tpu-v9
expect2 "batch not a multiple of micro-batch x dp" "$zs" analyze --model gpt2 --batch 10 --micro-batch 4
expect2 "heads do not split over tp" "$zs" analyze --model gpt2 --tp 5
expect2 "bad --set" "$zs" analyze --model gpt2 --set n_layer
expect2 "bad --set value" "$zs" analyze --model gpt2 --set n_layer=0
expect2 "fractional integer" "$zs" analyze --model gpt2 --tp 2.5
expect2 "integer too large" "$zs" analyze --model gpt2 --batch 1e30
expect2 "not finite" "$zs" analyze --model gpt2 --tokens inf
expect2 "stray argument" "$zs" analyze --model gpt2 extra
expect2 "bad precision" "$zs" analyze --model gpt2 --precision fp8
many=(); for i in $(seq 1 65); do many+=(--set n_layer=2); done
expect2 "too many --set flags" "$zs" analyze --model gpt2 "${many[@]}"
grep -q "malformed JSON at line 2, column 13" < <("$zs" analyze --config "$tmp/bad.json" 2>&1)
check "malformed config message names line and column" '[ $? -eq 0 ]'
exit $fail
