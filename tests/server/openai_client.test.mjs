// The official `openai` npm client against `longctx serve` on the CPU with models/needle:
// completions and chat, streamed and not, usage, stop strings, seeds, the error statuses and
// bodies, the API key, and a clean exit on SIGTERM.
// Environment: LONGCTX_BIN (the longctx binary), LONGCTX_MODEL_DIR (models/needle),
// LONGCTX_NPM_DIR (the folder whose node_modules holds openai; tools/fetch_test_data.sh).
import { createRequire } from "node:module";
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { env, needleQuestion, startServer } from "./serve_helper.mjs";

const require = createRequire(env("LONGCTX_NPM_DIR") + "/package.json");
const OpenAI = require("openai");

const client = (server, apiKey = "unused") =>
  new OpenAI({ baseURL: server.url + "/v1", apiKey, maxRetries: 0, timeout: 60000 });

const question = needleQuestion;

async function expectApiError(promise, status, Class, check = () => {}) {
  await assert.rejects(promise, (err) => {
    assert.ok(err instanceof Class, `expected ${Class.name}, got ${err.constructor.name}: ${err.message}`);
    assert.equal(err.status, status);
    assert.equal(typeof err.error.message, "string");
    assert.ok(err.error.message.length > 0);
    assert.ok("param" in err.error && "code" in err.error && "type" in err.error);
    check(err);
    return true;
  });
}

describe("openai client against longctx serve (needle, CPU)", () => {
  let server, api;
  before(async () => {
    server = await startServer(["--max-request-body", "64KiB"]);
    api = client(server);
  });
  after(async () => {
    const { code } = await server.stop();
    assert.equal(code, 0, "serve exits 0 on SIGTERM");
  });

  test("models", async () => {
    const models = await api.models.list();
    assert.equal(models.data[0].id, "needle");
  });

  test("completions, streamed and not, with usage", async () => {
    const prompt = "The special magic number is 7710. The special magic number is";
    const full = await api.completions.create({ model: "needle", prompt, max_tokens: 8, temperature: 0 });
    assert.equal(full.object, "text_completion");
    assert.equal(typeof full.choices[0].text, "string");
    assert.ok(["stop", "length"].includes(full.choices[0].finish_reason));
    assert.equal(full.usage.total_tokens, full.usage.prompt_tokens + full.usage.completion_tokens);
    assert.ok(full.usage.completion_tokens >= 1 && full.usage.completion_tokens <= 8);

    const stream = await api.completions.create({
      model: "needle", prompt, max_tokens: 8, temperature: 0, stream: true,
      stream_options: { include_usage: true },
    });
    let text = "", usage = null, finish = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text += c.text;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(text, full.choices[0].text);
    assert.equal(finish, full.choices[0].finish_reason);
    assert.deepEqual(usage, full.usage);
  });

  test("chat, streamed and not, with usage", async () => {
    const messages = [{ role: "user", content: question }];
    const full = await api.chat.completions.create({ model: "needle", messages, max_tokens: 12, temperature: 0 });
    assert.equal(full.object, "chat.completion");
    assert.equal(full.choices[0].message.role, "assistant");
    const expected = full.choices[0].message.content;
    assert.ok(expected.length > 0);

    const stream = await api.chat.completions.create({
      model: "needle", messages, max_tokens: 12, temperature: 0, stream: true,
      stream_options: { include_usage: true },
    });
    let text = "", usage = null, role = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        if (c.delta.role) role = c.delta.role;
        if (c.delta.content) text += c.delta.content;
      }
    }
    assert.equal(role, "assistant");
    assert.equal(text, expected);
    assert.deepEqual(usage, full.usage);
  });

  test("stop strings end the text before them", async () => {
    const messages = [{ role: "user", content: question }];
    const base = await api.chat.completions.create({ messages, model: "needle", max_tokens: 12, temperature: 0 });
    const text = base.choices[0].message.content;
    assert.ok(text.length >= 4, `reply too short for the test: '${text}'`);
    const stop = text.slice(2, 4);  // inside the text: it ends the reply after text.slice(0, 2)
    const cut = await api.chat.completions.create({ messages, model: "needle", max_tokens: 12, temperature: 0, stop: [stop] });
    assert.equal(cut.choices[0].message.content, text.slice(0, text.indexOf(stop)));
    assert.equal(cut.choices[0].finish_reason, "stop");
  });

  test("a seed reproduces a sampled reply", async () => {
    const req = { model: "needle", prompt: "The special magic number is", max_tokens: 16, temperature: 1.0, seed: 99 };
    const a = await api.completions.create(req);
    const b = await api.completions.create(req);
    assert.equal(a.choices[0].text, b.choices[0].text);
  });

  test("error statuses and bodies", async () => {
    await expectApiError(api.completions.create({ model: "needle", prompt: "x", top_p: 1.5 }),
                         400, OpenAI.BadRequestError, (e) => assert.equal(e.param, "top_p"));
    await expectApiError(api.completions.create({ model: "needle", prompt: "x", temperature: "hot" }),
                         400, OpenAI.BadRequestError, (e) => assert.equal(e.param, "temperature"));
    await expectApiError(api.chat.completions.create({ model: "gpt-4o", messages: [{ role: "user", content: "x" }] }),
                         404, OpenAI.NotFoundError, (e) => assert.equal(e.code, "model_not_found"));
    await expectApiError(api.completions.create({ model: "needle", prompt: Array(5000).fill(7) }),
                         400, OpenAI.BadRequestError, (e) => assert.equal(e.code, "context_length_exceeded"));
    await expectApiError(api.completions.create({ model: "needle", prompt: "a".repeat(100000) }),
                         413, OpenAI.APIError);
    // What the client cannot send: malformed and too-deep JSON.
    for (const body of ['{"prompt": ', "[".repeat(200) + "]".repeat(200)]) {
      const r = await fetch(server.url + "/v1/completions", {
        method: "POST", headers: { "Content-Type": "application/json" }, body });
      assert.equal(r.status, 400);
      const j = await r.json();
      assert.equal(j.error.type, "invalid_request_error");
    }
    // The server still answers.
    const ok = await api.completions.create({ model: "needle", prompt: "x", max_tokens: 2 });
    assert.equal(ok.choices.length, 1);
  });
});

describe("API key (LONGCTX_API_KEY)", () => {
  let server;
  before(async () => { server = await startServer([], { LONGCTX_API_KEY: "sekret" }); });
  after(async () => { assert.equal((await server.stop()).code, 0); });

  test("refused without the key, served with it", async () => {
    await expectApiError(client(server, "wrong").models.list(), 401, OpenAI.AuthenticationError);
    await expectApiError(client(server, "wrong").completions.create({ model: "needle", prompt: "x" }),
                         401, OpenAI.AuthenticationError);
    const ok = await client(server, "sekret").completions.create({ model: "needle", prompt: "x", max_tokens: 2 });
    assert.equal(ok.choices.length, 1);
  });
});
