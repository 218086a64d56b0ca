// Tool calling and structured output (issue #33) through the official `openai` npm client:
// servers of models/demo with the real chat templates of Qwen2.5 (hermes), Llama 3.1
// (llama3_json) and Mistral Nemo (mistral); calls forced by tool_choice (a named function, or
// "required"), streamed and not, their results fed back through the template; response_format
// json_schema over 200+ sampled outputs, each parsed and checked by ajv, an independent
// validator. tests/e2e/run.sh sets LMSERVE_BIN and LMSERVE_ROOT.
import test from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import OpenAI from 'openai';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';

const root = process.env.LMSERVE_ROOT;
const templates = path.join(root, '..', 'shared', 'data', 'chat_templates');
const model = 'demo';

// `lmserve serve` of the demo model on port 0 with extra flags; resolves once it listens.
function serve(args) {
  return new Promise((resolve, reject) => {
    const p = spawn(process.env.LMSERVE_BIN, ['serve', '--model', path.join(root, 'models', 'demo'), '--port', '0', '--max-model-len', '2048', ...args]);
    let log = '';
    const timer = setTimeout(() => reject(new Error(`server did not start: ${log}`)), 30000);
    const look = (d) => {
      log += d;
      const m = log.match(/on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve({
          client: new OpenAI({ baseURL: `http://127.0.0.1:${m[1]}/v1`, apiKey: 'unused', maxRetries: 0 }),
          stop: () => new Promise((done) => { p.on('exit', done); p.kill('SIGTERM'); }),
        });
      }
    };
    p.stdout.on('data', look);
    p.stderr.on('data', look);
    p.on('exit', (code) => reject(new Error(`server exited ${code}: ${log}`)));
  });
}

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The weather in a city',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string', enum: ['Paris', 'Berlin', 'Tokyo'] }, unit: { type: 'string', enum: ['C', 'F'] } },
        required: ['city', 'unit'],
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'get_time',
      parameters: { type: 'object', properties: { tz: { type: 'string', pattern: '^[A-Z]{3}$' } }, required: ['tz'] },
    },
  },
];
const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);
const argsValid = Object.fromEntries(tools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));

function checkCall(call) {
  assert.equal(call.type, 'function');
  assert.match(call.id, /^(call_[A-Za-z0-9]{24}|[A-Za-z0-9]{9})$/);
  assert.ok(argsValid[call.function.name], `unknown function ${call.function.name}`);
  const args = JSON.parse(call.function.arguments);
  assert.ok(argsValid[call.function.name](args), `${call.function.arguments}: ${ajv.errorsText(argsValid[call.function.name].errors)}`);
  return args;
}

// A stream's tool calls put back together from OpenAI's deltas (name first, then arguments).
async function collect(stream) {
  const calls = [];
  let content = '';
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      content += c.delta?.content ?? '';
      for (const d of c.delta?.tool_calls ?? []) {
        if (!calls[d.index]) {
          assert.ok(d.id && d.function?.name, 'a call begins with its id and name');
          calls[d.index] = { id: d.id, type: d.type, function: { name: d.function.name, arguments: '' } };
        }
        calls[d.index].function.arguments += d.function?.arguments ?? '';
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { calls, content, finish };
}

const formats = [
  { template: 'Qwen-Qwen2.5-7B-Instruct.jinja', parser: 'hermes' },
  { template: 'meta-llama-Llama-3.1-8B-Instruct.jinja', parser: 'llama3_json' },
  { template: 'mistralai-Mistral-Nemo-Instruct-2407.jinja', parser: 'mistral' },
];

for (const { template, parser } of formats) {
  test(`tool calls round trip: ${parser} with ${template}`, async () => {
    const server = await serve(['--chat-template', path.join(templates, template), '--tool-call-parser', parser, '--enable-auto-tool-choice']);
    try {
      const { client } = server;
      const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
      const named = { model, messages, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, temperature: 0, max_tokens: 200 };
      const whole = await client.chat.completions.create(named);
      const msg = whole.choices[0].message;
      assert.equal(whole.choices[0].finish_reason, 'tool_calls');
      assert.equal(msg.content ?? '', '');
      assert.equal(msg.tool_calls.length, 1);
      assert.equal(msg.tool_calls[0].function.name, 'get_weather');
      const args = checkCall(msg.tool_calls[0]);

      // Streamed: the same call (greedy), no marker text in the content.
      const streamed = await collect(await client.chat.completions.create({ ...named, stream: true }));
      assert.equal(streamed.finish, 'tool_calls');
      assert.equal(streamed.content, '');
      assert.equal(streamed.calls.length, 1);
      assert.equal(streamed.calls[0].function.name, 'get_weather');
      assert.deepEqual(JSON.parse(streamed.calls[0].function.arguments), args);

      // "required" without parallel calls, sampled: exactly one call of a known function with
      // valid arguments, in every choice.
      const single = await client.chat.completions.create({ model, messages, tools, tool_choice: 'required', parallel_tool_calls: false, temperature: 1, seed: 5, n: 4, max_tokens: 300 });
      for (const c of single.choices) {
        assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
        assert.equal(c.message.tool_calls.length, 1);
        checkCall(c.message.tool_calls[0]);
      }
      // Parallel calls where the format has them: the demo model, never told to stop, writes call
      // after call until max_tokens; every call read is whole and valid.
      if (parser !== 'llama3_json') {
        const many = await client.chat.completions.create({ model, messages, tools, tool_choice: 'required', temperature: 1, seed: 3, n: 4, max_tokens: 300 });
        for (const c of many.choices) (c.message.tool_calls ?? []).forEach(checkCall);
        assert.ok(many.choices.some((c) => (c.message.tool_calls ?? []).length >= 2), 'parallel calls');
      }

      // The results go back through the template: the next prompt holds the call and its result.
      const call = msg.tool_calls[0];
      const followUp = await client.chat.completions.create({
        model, tools, temperature: 0, max_tokens: 16, tool_choice: 'none',
        messages: [...messages, { role: 'assistant', content: null, tool_calls: [call] }, { role: 'tool', tool_call_id: call.id, content: '{"temperature": 21, "sky": "clear"}' }],
      });
      assert.equal(followUp.choices[0].message.tool_calls, undefined);
      assert.ok(followUp.usage.prompt_tokens > whole.usage.prompt_tokens + 10, 'the call and its result are in the prompt');
    } finally {
      await server.stop();
    }
  });
}

// Schemas of the kinds extraction workflows send; every output must parse and validate.
const schemas = [
  {
    type: 'object',
    properties: {
      name: { type: 'string', minLength: 1, maxLength: 24 },
      age: { type: 'integer', minimum: 0, maximum: 120 },
      email: { type: 'string', format: 'email', maxLength: 40 },
      tags: { type: 'array', items: { type: 'string', enum: ['vip', 'new', 'churn'] }, maxItems: 3 },
    },
    required: ['name', 'age', 'tags'],
    additionalProperties: false,
  },
  {
    type: 'object',
    properties: {
      invoice: {
        type: 'object',
        properties: { id: { type: 'string', pattern: '^INV-[0-9]{4}$' }, total: { type: 'number', minimum: 0, maximum: 10000 }, date: { type: 'string', format: 'date' } },
        required: ['id', 'total', 'date'],
      },
      lines: {
        type: 'array', minItems: 1, maxItems: 3,
        items: { type: 'object', properties: { sku: { type: 'string', maxLength: 8 }, qty: { type: 'integer', minimum: 1, maximum: 99 } }, required: ['sku', 'qty'] },
      },
      paid: { type: 'boolean' },
    },
    required: ['invoice', 'lines', 'paid'],
  },
  {
    anyOf: [
      { type: 'object', properties: { kind: { const: 'person' }, first: { type: 'string', maxLength: 12 } }, required: ['kind', 'first'] },
      { type: 'object', properties: { kind: { const: 'company' }, vat: { type: 'string', pattern: '^[A-Z]{2}[0-9]{6}$' } }, required: ['kind', 'vat'] },
      { type: 'null' },
    ],
  },
  {
    $defs: { node: { type: 'object', properties: { label: { type: 'string', maxLength: 6 }, children: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 2 } }, required: ['label'] } },
    type: 'object', properties: { root: { $ref: '#/$defs/node' }, id: { type: 'string', format: 'uuid' } }, required: ['root', 'id'],
  },
  { type: 'array', items: { type: ['number', 'string', 'null'], maxLength: 5, exclusiveMinimum: -1, exclusiveMaximum: 1 }, minItems: 2, maxItems: 4 },
];

test('response_format json_schema: 200+ sampled outputs all parse and validate (ajv)', async () => {
  const server = await serve([]);
  try {
    const { client } = server;
    let checked = 0;
    const jobs = [];
    for (let s = 0; s < schemas.length; ++s) {
      const validate = ajv.compile(schemas[s]);
      for (let k = 0; k < 6; ++k) {
        jobs.push((async () => {
          const r = await client.chat.completions.create({
            model, messages: [{ role: 'user', content: `Extract the record (${k}).` }], temperature: 1, top_p: 0.95, seed: 100 * s + k, n: 7, max_tokens: 700,
            response_format: { type: 'json_schema', json_schema: { name: `s${s}`, strict: true, schema: schemas[s] } },
          });
          for (const c of r.choices) {
            assert.equal(c.finish_reason, 'stop', `schema ${s}: ${c.message.content}`);
            const doc = JSON.parse(c.message.content);
            assert.ok(validate(doc), `schema ${s}: ${c.message.content}: ${ajv.errorsText(validate.errors)}`);
            ++checked;
          }
        })());
      }
    }
    await Promise.all(jobs);
    assert.ok(checked >= 200, `${checked} outputs`);

    // Streamed: the chunks make the same kind of document.
    const stream = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'Stream it.' }], temperature: 1, seed: 9, max_tokens: 700, stream: true,
      response_format: { type: 'json_schema', json_schema: { name: 's0', schema: schemas[0] } },
    });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    assert.ok(ajv.validate(schemas[0], JSON.parse(text)), text);

    // json_object and vLLM's extras on the completions API.
    const obj = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'JSON please' }], temperature: 0, max_tokens: 300, response_format: { type: 'json_object' } });
    if (obj.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(obj.choices[0].message.content), 'object');
    else assert.ok(obj.choices[0].message.content.startsWith('{'));
    const choice = await client.completions.create({ model, prompt: 'Answer:', max_tokens: 10, temperature: 1, n: 8, guided_choice: ['yes', 'no', 'not sure'] });
    for (const c of choice.choices) assert.ok(['yes', 'no', 'not sure'].includes(c.text), c.text);
    const regex = await client.completions.create({ model, prompt: 'Code:', max_tokens: 20, temperature: 1, n: 4, guided_regex: '[A-Z]{3}-[0-9]{2,4}' });
    for (const c of regex.choices) assert.match(c.text, /^[A-Z]{3}-[0-9]{2,4}$/);

    // What cannot be followed is refused, naming it.
    await assert.rejects(
      client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], response_format: { type: 'json_schema', json_schema: { name: 'bad', schema: { type: 'object', properties: { a: { not: { type: 'string' } } } } } } }),
      (e) => e.status === 400 && /'not' \(at \/properties\/a\) is not supported/.test(e.message),
    );
  } finally {
    await server.stop();
  }
});
