// openai_client.mjs - drives `zs serve` with the official `openai` npm
// client (tests/serve/test_serve_openai.sh starts the server and installs
// the package). Usage: node openai_client.mjs BASE_URL API_KEY MODEL.
// Prints "ok NAME" / "FAIL NAME: detail" per check and a summary line;
// exits 1 when a check failed.
import OpenAI from 'openai';

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
let passed = 0;
let failed = 0;

function check(name, cond, detail = '') {
  if (cond) {
    passed++;
    console.log(`ok ${name}`);
  } else {
    failed++;
    console.log(`FAIL ${name}: ${typeof detail === 'string' ? detail : JSON.stringify(detail)}`);
  }
}

function usageOk(u, maxCompletion) {
  return u && u.prompt_tokens > 0 && u.completion_tokens >= 0 &&
    u.completion_tokens <= maxCompletion &&
    u.total_tokens === u.prompt_tokens + u.completion_tokens;
}

// Calls fn, which must throw the given error class with this status.
async function expectError(name, fn, cls, status, pattern) {
  try {
    await fn();
    check(name, false, 'no error thrown');
  } catch (e) {
    check(name, e instanceof cls && e.status === status && pattern.test(e.message) &&
      typeof e.error === 'object', `${e.constructor.name} ${e.status} ${e.message}`);
  }
}

async function streamText(params) {
  const s = await client.completions.create({ ...params, stream: true });
  let text = '';
  let finish = null;
  let chunks = 0;
  let usage = null;
  for await (const c of s) {
    chunks++;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      text += ch.text;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { text, finish, chunks, usage };
}

async function chatStream(params) {
  const s = await client.chat.completions.create({ ...params, stream: true });
  let text = '';
  let role = null;
  let finish = null;
  for await (const c of s) {
    const d = c.choices[0];
    if (!d) continue;
    if (d.delta.role) role = d.delta.role;
    text += d.delta.content ?? '';
    if (d.finish_reason) finish = d.finish_reason;
  }
  return { text, role, finish };
}

// ---- models --------------------------------------------------------------
const list = await client.models.list();
check('models.list has the model', list.data.some((m) => m.id === model && m.object === 'model'),
  list.data);
const one = await client.models.retrieve(model);
check('models.retrieve', one.id === model);

// ---- completions -----------------------------------------------------------
const base = { model, prompt: 'In the beginning was the', max_tokens: 12 };
const greedy = await client.completions.create({ ...base, temperature: 0 });
check('completion shape', greedy.object === 'text_completion' && greedy.id.startsWith('cmpl-') &&
  greedy.model === model && greedy.choices.length === 1 &&
  typeof greedy.choices[0].text === 'string' && greedy.choices[0].index === 0 &&
  ['stop', 'length'].includes(greedy.choices[0].finish_reason), greedy);
check('completion usage', usageOk(greedy.usage, 12), greedy.usage);

const a = await client.completions.create({ ...base, temperature: 1, seed: 42 });
const b = await client.completions.create({ ...base, temperature: 1, seed: 42 });
check('same seed, same text', a.choices[0].text === b.choices[0].text,
  [a.choices[0].text, b.choices[0].text]);

const two = await client.completions.create({ ...base, temperature: 1, seed: 7, n: 2 });
const seed8 = await client.completions.create({ ...base, temperature: 1, seed: 8 });
check('n=2 gives two choices', two.choices.length === 2 &&
  two.choices.map((c) => c.index).join() === '0,1', two.choices);
check('n=2: sample 1 draws with seed + 1', two.choices[1].text === seed8.choices[0].text,
  [two.choices[1].text, seed8.choices[0].text]);
check('n=2 usage counts both', usageOk(two.usage, 24), two.usage);

// a list of prompts: n choices per prompt, prompt-major, each as if alone
const pair = await client.completions.create({ ...base, prompt: ['a', 'b'], temperature: 1,
  seed: 11 });
const aloneB = await client.completions.create({ ...base, prompt: 'b', temperature: 1, seed: 11 });
check('prompt list gives a choice per prompt', pair.choices.length === 2 &&
  pair.choices.map((c) => c.index).join() === '0,1', pair.choices);
check('prompt list: choice 1 = prompt "b" alone', pair.choices[1]?.text === aloneB.choices[0].text,
  [pair.choices[1]?.text, aloneB.choices[0].text]);
check('prompt list usage sums the prompts',
  pair.usage.prompt_tokens === 2 * aloneB.usage.prompt_tokens, [pair.usage, aloneB.usage]);

// stop: cut the greedy text at a piece of it
const g40 = await client.completions.create({ ...base, temperature: 0, max_tokens: 40 });
const full = g40.choices[0].text;
const stopAt = full.indexOf(' ', 3);
if (stopAt > 0) {
  const word = full.slice(stopAt, stopAt + 3);
  const cut = full.slice(0, full.indexOf(word));
  const st = await client.completions.create({ ...base, temperature: 0, max_tokens: 40,
    stop: [word, 'zzzz'] });
  check('stop cuts before the stop string', st.choices[0].text === cut &&
    st.choices[0].finish_reason === 'stop', { full, word, got: st.choices[0].text });
  const ss = await streamText({ ...base, temperature: 0, max_tokens: 40, stop: word });
  check('stop while streaming', ss.text === cut && ss.finish === 'stop', { cut, got: ss.text });
} else {
  check('greedy text long enough for the stop check', false, full);
}

const s1 = await streamText({ ...base, temperature: 1, seed: 42,
  stream_options: { include_usage: true } });
check('stream = whole answer (same seed)', s1.text === a.choices[0].text,
  [s1.text, a.choices[0].text]);
check('stream sends a chunk per token', s1.chunks >= 3, s1.chunks);
check('stream usage (include_usage)', usageOk(s1.usage, 12), s1.usage);

const lp = await client.completions.create({ ...base, temperature: 0, logprobs: 2, echo: true });
const l = lp.choices[0].logprobs;
check('completion logprobs and echo', lp.choices[0].text.startsWith(base.prompt) &&
  l.tokens.length === lp.usage.prompt_tokens + lp.usage.completion_tokens &&
  l.token_logprobs.length === l.tokens.length && l.token_logprobs[0] === null &&
  l.token_logprobs[l.tokens.length - 1] <= 0 &&
  Object.keys(l.top_logprobs[l.tokens.length - 1]).length >= 1, l);

// ---- chat ------------------------------------------------------------------
const messages = [{ role: 'system', content: 'Answer briefly.' },
  { role: 'user', content: 'In the beginning' }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 10, seed: 5 });
check('chat shape', chat.object === 'chat.completion' && chat.id.startsWith('chatcmpl-') &&
  chat.choices[0].message.role === 'assistant' &&
  typeof chat.choices[0].message.content === 'string' &&
  ['stop', 'length'].includes(chat.choices[0].finish_reason), chat);
check('chat usage', usageOk(chat.usage, 10), chat.usage);
const cs = await chatStream({ model, messages, max_tokens: 10, seed: 5 });
check('chat stream = whole answer', cs.text === chat.choices[0].message.content &&
  cs.role === 'assistant' && cs.finish === chat.choices[0].finish_reason,
  [cs, chat.choices[0].message.content]);
const chat2 = await client.chat.completions.create({ model, messages, max_tokens: 6, n: 2,
  logprobs: true, top_logprobs: 2, temperature: 0 });
const c0 = chat2.choices[0].logprobs.content;
check('chat n=2 with logprobs', chat2.choices.length === 2 && c0.length >= 1 &&
  c0.every((t) => typeof t.token === 'string' && t.logprob <= 0 && t.top_logprobs.length === 2 &&
    Array.isArray(t.bytes)), chat2.choices[0]);
check('greedy samples agree', chat2.choices[0].message.content ===
  chat2.choices[1].message.content, chat2.choices);

// ---- errors the client surfaces ----------------------------------------------
const tooLong = 'light '.repeat(400);
await expectError('too-long prompt: BadRequestError 400',
  () => client.completions.create({ model, prompt: tooLong, max_tokens: 4 }),
  OpenAI.BadRequestError, 400, /context/);
await expectError('too-long prompt, streaming: BadRequestError 400',
  () => client.completions.create({ model, prompt: tooLong, max_tokens: 4, stream: true }),
  OpenAI.BadRequestError, 400, /context/);
await expectError('temperature 5: BadRequestError 400',
  () => client.completions.create({ model, prompt: 'x', temperature: 5 }),
  OpenAI.BadRequestError, 400, /temperature/);
await expectError('unknown model: NotFoundError 404',
  () => client.completions.create({ model: 'gpt-9', prompt: 'x' }),
  OpenAI.NotFoundError, 404, /does not exist/);
const stranger = new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 });
await expectError('wrong key: AuthenticationError 401',
  () => stranger.models.list(), OpenAI.AuthenticationError, 401, /API key/);

try {
  await client.completions.create({ model, prompt: 'x', temperature: -1 });
} catch (e) {
  check('error object fields', e.param === 'temperature' && e.type === 'invalid_request_error',
    { param: e.param, type: e.type });
}

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
