#!/usr/bin/env bash
# zs serve driven by the official `openai` JavaScript client
# (openai_client.mjs): a tiny GPT trained here is served on a free loopback
# port with an API key; the client lists models, runs completions and chat,
# whole and streamed (stream text = whole text for a seed), n = 2, a list
# of prompts, stop strings, logprobs and echo, and surfaces the server's
# errors as its own error classes (BadRequestError for a prompt longer than
# the context, NotFoundError, AuthenticationError). Then SIGTERM: exit status 0, and the
# request log holds one JSON line per request.
#
# The client is tests/serve/vendor/openai-6.49.0.tgz, unpacked into a
# scratch node_modules (it has no dependencies). Skipped, with a message,
# only when Node.js (>= 18, for fetch) is missing.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null 2>&1; then
  echo "skipped: node not found (install Node.js >= 18 to run the openai client test)"
  exit 0
fi
if [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 18 ]; then
  echo "skipped: node $(node --version) is older than 18 (the openai client needs fetch)"
  exit 0
fi
zs="$ZS_BIN"
tmp=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail=0

mkdir -p "$tmp/node_modules/openai"
tar xzf "$here/vendor/openai-6.49.0.tgz" -C "$tmp/node_modules/openai" --strip-components=1 ||
  { echo "FAIL: cannot unpack the openai client"; exit 1; }
cp "$here/openai_client.mjs" "$tmp/"

for i in $(seq 1 300); do
  echo "In the beginning was the word $i, and the word was with the light; and the light shone."
done > "$tmp/corpus.txt"
"$zs" train gpt --data "$tmp/corpus.txt" --preset tiny --vocab 300 --batch 4 --seq 32 \
    --seed 5 --threads 2 --eval-every 10 --warmup 5 --steps 30 --out "$tmp/m" \
    >/dev/null 2>"$tmp/train.log" || { cat "$tmp/train.log"; exit 1; }

"$zs" serve --ckpt "$tmp/m" --port 0 --api-key testkey --kv-blocks 64 --threads 2 \
    --log "$tmp/requests.jsonl" >"$tmp/out" 2>"$tmp/err" &
pid=$!
port=
for _ in $(seq 1 300); do
  port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/out")
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$port" ]; then
  echo "FAIL: zs serve did not start"; cat "$tmp/out" "$tmp/err"; exit 1
fi
echo "ok zs serve listens on port $port"

(cd "$tmp" && node openai_client.mjs "http://127.0.0.1:$port/v1" testkey m) || fail=1

kill -TERM "$pid"
wait "$pid"; rc=$?
pid=
if [ $rc -eq 0 ]; then echo "ok SIGTERM: exit 0"; else echo "FAIL SIGTERM: exit $rc"; fail=1; fi
lines=$(wc -l <"$tmp/requests.jsonl")
# 23 requests: 2 model look-ups, 12 completions, 3 chats, 6 errors
if [ "$lines" -eq 23 ] && python3 -c '
import collections, json, sys
codes = collections.Counter()
for line in open(sys.argv[1]):
    r = json.loads(line)
    assert {"id", "status", "latency_s"} <= r.keys(), r
    codes[r["status"]] += 1
    if r["path"].endswith("completions") and r["status"] == 200:
        assert r["prompt_tokens"] > 0 and r["completion_tokens"] > 0 and r["ttft_s"] > 0, r
assert codes == {200: 17, 400: 4, 404: 1, 401: 1}, codes
' "$tmp/requests.jsonl"; then
  echo "ok request log: $lines JSON lines"
else
  echo "FAIL request log ($lines lines)"; head -3 "$tmp/requests.jsonl"; fail=1
fi
[ $fail -eq 0 ] || { echo "--- server stderr"; tail -20 "$tmp/err"; }
exit $fail
