// lmserve serve driven by the official `openai` npm client: chat and completions, streaming
// and not. LMSERVE_URL points at a running server (tests/e2e/run.sh starts one).
import test from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: `${process.env.LMSERVE_URL}/v1`, apiKey: process.env.LMSERVE_API_KEY ?? 'unused' });
const model = 'demo';

test('models lists the served model', async () => {
  const list = await client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), [model]);
});

test('chat completion', async () => {
  const r = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'What does "kernel" mean?' }], max_tokens: 24, temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(r.choices[0].message.content.length > 0);
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test('chat completion streamed equals the same request unstreamed', async () => {
  const params = { model, messages: [{ role: 'user', content: '背诵《静夜思》。' }], max_tokens: 30, temperature: 0 };
  const whole = await client.chat.completions.create(params);
  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage = null;
  let finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
  assert.ok(!text.includes('\uFFFD'), 'multi-byte characters were split');
});

test('text completion, streamed and not', async () => {
  const whole = await client.completions.create({ model, prompt: 'The hacker', max_tokens: 12, temperature: 0 });
  assert.equal(whole.object, 'text_completion');
  const stream = await client.completions.create({ model, prompt: 'The hacker', max_tokens: 12, temperature: 0, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, whole.choices[0].text);
});

test('errors come back as OpenAI errors', async () => {
  await assert.rejects(
    client.chat.completions.create({ model, messages: [], max_tokens: 5 }),
    (e) => e.status === 400 && typeof e.message === 'string',
  );
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e.status === 404,
  );
});
