// tool_choice "auto" and the reasoning parser through the official `openai` npm client against
// `longctx serve --tool-call-parser hermes --reasoning-parser qwen3` on the CPU with
// models/needle. The tiny model writes no tool calls of its own, so this checks the shape of a
// reply that has none (streamed and not), parallel_tool_calls, tool_choice "none", the 400s and
// the parser found in a --chat-template showing <tool_call>;
// the formats themselves are tests/server/test_tool_parsers.cpp's.
// Environment: LONGCTX_BIN, LONGCTX_MODEL_DIR (models/needle), LONGCTX_NPM_DIR (openai).
import { createRequire } from "node:module";
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { env, needleQuestion, startServer } from "./serve_helper.mjs";

const require = createRequire(env("LONGCTX_NPM_DIR") + "/package.json");
const OpenAI = require("openai");

const tools = [{
  type: "function",
  function: {
    name: "get_weather", description: "The weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
}];
const messages = [{ role: "user", content: needleQuestion }];

describe("tool_choice auto with --tool-call-parser hermes (needle, CPU)", () => {
  let server, api;
  before(async () => {
    server = await startServer(["--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"]);
    api = new OpenAI({ baseURL: server.url + "/v1", apiKey: "unused", maxRetries: 0 });
  });
  after(async () => {
    const { code } = await server.stop();
    assert.equal(code, 0);
  });

  test("a reply without calls: content, no tool_calls, reasoning_content null", async () => {
    for (const extra of [{}, { tool_choice: "auto" }, { parallel_tool_calls: false },
                         { tool_choice: "none" }]) {
      const r = await api.chat.completions.create({
        model: "needle", messages, tools, max_tokens: 8, temperature: 0, ...extra });
      const { message, finish_reason } = r.choices[0];
      assert.ok(["stop", "length"].includes(finish_reason), JSON.stringify(extra));
      assert.equal(message.role, "assistant");
      assert.equal(typeof message.content, "string");
      assert.ok(message.content.length > 0);
      assert.equal(message.tool_calls, undefined);
      assert.equal(message.reasoning_content, null);
    }
  });

  test("streamed: the same content as not streamed", async () => {
    const full = await api.chat.completions.create({
      model: "needle", messages, tools, max_tokens: 8, temperature: 0 });
    const stream = await api.chat.completions.create({
      model: "needle", messages, tools, max_tokens: 8, temperature: 0, stream: true });
    let content = "", finish = null, calls = 0;
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (!c) continue;
      content += c.delta.content ?? "";
      calls += c.delta.tool_calls?.length ?? 0;
      if (c.finish_reason) finish = c.finish_reason;
    }
    assert.equal(content, full.choices[0].message.content);
    assert.equal(calls, 0);
    assert.equal(finish, full.choices[0].finish_reason);
  });

  test("a wrong parallel_tool_calls is a 400", async () => {
    await assert.rejects(
      api.chat.completions.create({ model: "needle", messages, tools, parallel_tool_calls: "no" }),
      (err) => err.status === 400 && err.error.param === "parallel_tool_calls");
  });
});

describe("tool_choice auto without a tool parser (needle's template shows none)", () => {
  let server;
  before(async () => { server = await startServer([]); });
  after(async () => { await server.stop(); });

  test("a 400 naming --tool-call-parser", async () => {
    const api = new OpenAI({ baseURL: server.url + "/v1", apiKey: "unused", maxRetries: 0 });
    await assert.rejects(
      api.chat.completions.create({ model: "needle", messages, tools }),
      (err) => err.status === 400 && err.error.param === "tool_choice" &&
               err.error.message.includes("--tool-call-parser"));
  });
});

describe("the tool parser detected from the chat template (--chat-template shows <tool_call>)", () => {
  let server;
  before(async () => {
    server = await startServer([
      "--chat-template",
      "{% for m in messages %}{{ m.content }}{% endfor %}{% if false %}<tool_call>{% endif %}"]);
  });
  after(async () => { await server.stop(); });

  test("auto is accepted without --tool-call-parser", async () => {
    const api = new OpenAI({ baseURL: server.url + "/v1", apiKey: "unused", maxRetries: 0 });
    const r = await api.chat.completions.create({
      model: "needle", messages, tools, max_tokens: 4, temperature: 0 });
    assert.ok(["stop", "length"].includes(r.choices[0].finish_reason));
    assert.equal(typeof r.choices[0].message.content, "string");
  });
});
