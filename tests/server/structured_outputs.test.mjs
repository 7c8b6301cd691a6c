// Structured outputs through the official `openai` npm client against `longctx serve` on the CPU
// with models/needle: random JSON schemas (nested objects, arrays with bounds, enums, required
// fields, integers and numbers with ranges, strings with lengths, anyOf) sent as
// response_format json_schema with max_tokens down to the shortest document; every response
// parses and validates with ajv (a validator we did not write). Also json_object, a streamed
// schema, /v1/completions, tool_choice "required" / a named function (a well-formed call of a
// declared tool, streamed and not), vLLM's choice / regex, and the 400 naming an unsupported
// keyword. Some strings carry a `pattern`, which ajv checks with JavaScript's own RegExp.
// Environment: LONGCTX_BIN (the longctx binary), LONGCTX_MODEL_DIR (models/needle),
// LONGCTX_NPM_DIR (the folder whose node_modules holds openai and ajv; tools/fetch_test_data.sh).
import { createRequire } from "node:module";
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { env, startServer } from "./serve_helper.mjs";

const require = createRequire(env("LONGCTX_NPM_DIR") + "/package.json");
const OpenAI = require("openai");
const Ajv = require("ajv");

// The 1,000 random schemas: 41 s on a 2-core machine shared with other builds (16 in
// flight; 90 % end by the grammar, the rest at max_tokens with a complete document).
const kNumSchemas = 1000;
const kInFlight = 16;

// A small deterministic generator (mulberry32), so a failure names a reproducible schema.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// `pattern`s (ECMA-262, unanchored unless ^...$) and their shortest match in characters.
const kPatterns = [["^[a-z]{2,5}$", 2], ["^\\d{3}-\\d{2}$", 6], ["ab", 2],
                   ["^(red|green|blue)$", 3], ["[A-Z]\\d", 2], ["^\\w+@\\w+\\.com$", 7],
                   ["^[^\"\\\\]?x\\s*$", 1]];
const kPatternMin = new Map(kPatterns);

function randomSchema(r, depth) {
  const pick = (n) => Math.floor(r() * n);
  const kind = depth <= 0 ? pick(6) : pick(10);
  switch (kind) {
    case 0: {
      if (pick(3) === 0) return { type: "string", pattern: kPatterns[pick(kPatterns.length)][0] };
      const s = { type: "string" };
      if (pick(2)) s.minLength = pick(4);
      if (pick(2)) s.maxLength = (s.minLength ?? 0) + pick(10);
      return s;
    }
    case 1: {
      const s = { type: "integer" };
      if (pick(2)) s.minimum = pick(2000) - 1000;
      if (pick(2)) s.maximum = (s.minimum ?? -1000) + pick(3000);
      return s;
    }
    case 2: {
      const s = { type: "number" };
      if (pick(2)) { s.minimum = pick(200) - 100 + 0.5; s.maximum = s.minimum + pick(50) + 1; }
      return s;
    }
    case 3:
      return { type: "boolean" };
    case 4:
      return { enum: ["red", "green", "blue", 7, null].slice(pick(3)) };
    case 5:
      return { type: ["string", "null"], maxLength: 8 };
    case 6:
    case 7: {
      const properties = {};
      const required = [];
      const n = 1 + pick(4);
      for (let i = 0; i < n; i++) {
        const name = ["id", "name", "items", "score", "tags", "meta"][pick(6)] + i;
        properties[name] = randomSchema(r, depth - 1);
        if (pick(3)) required.push(name);
      }
      const s = { type: "object", properties, required };
      if (pick(2)) s.additionalProperties = false;
      return s;
    }
    case 8: {
      const s = { type: "array", items: randomSchema(r, depth - 1) };
      if (pick(2)) s.minItems = pick(3);
      if (pick(2)) s.maxItems = (s.minItems ?? 0) + pick(4);
      return s;
    }
    default:
      return { anyOf: [randomSchema(r, depth - 1), randomSchema(r, depth - 1)] };
  }
}

// The shortest compact document's length in bytes (independent of the server's grammar): the
// smallest max_tokens a byte-level vocabulary can always close in.
function shortest(s) {
  if (s.enum) return Math.min(...s.enum.map((v) => JSON.stringify(v).length));
  if (s.anyOf) return Math.min(...s.anyOf.map(shortest));
  const types = Array.isArray(s.type) ? s.type : [s.type];
  return Math.min(...types.map((t) => {
    switch (t) {
      case "string": return 2 + (s.pattern !== undefined ? kPatternMin.get(s.pattern)
                                                          : (s.minLength ?? 0));
      case "integer":
      case "number": {
        const lo = s.minimum === undefined ? -Infinity : Math.ceil(s.minimum);
        const hi = s.maximum === undefined ? Infinity : Math.floor(s.maximum);
        const v = lo > 0 ? lo : hi < 0 ? hi : 0;
        return String(v).length;
      }
      case "boolean": return 4;
      case "null": return 4;
      case "array": {
        const n = s.minItems ?? 0;
        return 2 + (n === 0 ? 0 : n * shortest(s.items) + n - 1);
      }
      case "object": {
        const req = s.required ?? [];
        return 2 + req.reduce((acc, k) => acc + JSON.stringify(k).length + 1 +
                                             shortest(s.properties[k]), 0) +
               Math.max(req.length - 1, 0);
      }
      default: throw new Error("unknown type " + t);
    }
  }));
}

async function pool(n, limit, fn) {
  let next = 0;
  const results = new Array(n);
  await Promise.all(Array.from({ length: limit }, async () => {
    while (next < n) {
      const i = next++;
      results[i] = await fn(i);
    }
  }));
  return results;
}

describe("structured outputs against longctx serve (needle, CPU)", () => {
  let server, api;
  const ajv = new Ajv({ strict: false, allErrors: true });
  before(async () => {
    server = await startServer([]);
    api = new OpenAI({ baseURL: server.url + "/v1", apiKey: "unused", maxRetries: 0,
                       timeout: 120000 });
  });
  after(async () => {
    const { code } = await server.stop();
    assert.equal(code, 0);
  });

  test(`${kNumSchemas} random schemas: every response parses and validates`, async () => {
    const r = rng(49);
    const cases = Array.from({ length: kNumSchemas }, (_, i) => {
      const schema = randomSchema(r, 3);
      return { schema, max: shortest(schema) + Math.floor(r() * 40), chat: i % 4 !== 3 };
    });
    const started = Date.now();
    let stopped = 0;
    await pool(cases.length, kInFlight, async (i) => {
      const { schema, max, chat } = cases[i];
      const response_format = { type: "json_schema",
                                json_schema: { name: "s" + i, schema, strict: true } };
      let text, finish;
      if (chat) {
        const res = await api.chat.completions.create({
          model: "needle", messages: [{ role: "user", content: "Reply in JSON " + i }],
          response_format, max_tokens: max, temperature: 1.0, seed: i });
        text = res.choices[0].message.content;
        finish = res.choices[0].finish_reason;
      } else {
        const res = await api.completions.create({
          model: "needle", prompt: "JSON " + i + ":", response_format, max_tokens: max,
          temperature: 1.0, seed: i });
        text = res.choices[0].text;
        finish = res.choices[0].finish_reason;
      }
      const where = `schema ${i} ${JSON.stringify(schema)} max_tokens ${max}: ${text}`;
      let doc;
      assert.doesNotThrow(() => { doc = JSON.parse(text); }, where);
      const validate = ajv.compile(schema);
      assert.ok(validate(doc), where + " " + JSON.stringify(validate.errors));
      assert.ok(finish === "stop" || finish === "length", where);
      if (finish === "stop") stopped++;
    });
    const seconds = (Date.now() - started) / 1000;
    console.log(`${cases.length} schemas in ${seconds.toFixed(1)} s (${stopped} ended by the ` +
                "grammar, the rest at max_tokens with a complete document)");
  });

  test("json_object, streamed json_schema", async () => {
    for (let seed = 0; seed < 8; seed++) {
      const res = await api.chat.completions.create({
        model: "needle", messages: [{ role: "user", content: "Any object" }],
        response_format: { type: "json_object" }, max_tokens: 24, temperature: 1.0, seed });
      const doc = JSON.parse(res.choices[0].message.content);
      assert.ok(doc !== null && typeof doc === "object" && !Array.isArray(doc));
    }
    const schema = { type: "object",
                     properties: { city: { type: "string", maxLength: 10 },
                                   days: { type: "array", items: { type: "integer", minimum: 1,
                                                                   maximum: 31 },
                                           minItems: 1, maxItems: 3 } },
                     required: ["city", "days"], additionalProperties: false };
    const stream = await api.chat.completions.create({
      model: "needle", messages: [{ role: "user", content: "Trip" }], stream: true,
      response_format: { type: "json_schema", json_schema: { name: "trip", schema } },
      max_tokens: 40, temperature: 1.0, seed: 3 });
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
    const doc = JSON.parse(text);
    assert.ok(ajv.compile(schema)(doc), text);
    // Schema order: city before days.
    assert.ok(text.startsWith('{"city":'), text);
  });

  test("tool_choice required / named: a well-formed call to a declared tool, streamed or not",
       async () => {
    const tools = [
      { type: "function", function: { name: "get_weather", description: "Weather of a city",
        parameters: { type: "object", additionalProperties: false, required: ["city", "days"],
                      properties: { city: { type: "string", maxLength: 12 },
                                    days: { type: "integer", minimum: 1, maximum: 7 } } } } },
      { type: "function", function: { name: "search",
        parameters: { type: "object", required: ["query"],
                      properties: { query: { type: "string", minLength: 1, maxLength: 20 },
                                    limit: { type: "integer", minimum: 1, maximum: 50 } } } } },
      { type: "function", function: { name: "now" } },
    ];
    const byName = Object.fromEntries(tools.map((t) => [t.function.name, t.function]));
    const check = (call, where) => {
      assert.equal(call.type, "function", where);
      assert.ok(typeof call.id === "string" && call.id.length > 0, where);
      const fn = byName[call.function.name];
      assert.ok(fn, `${where}: undeclared tool ${call.function.name}`);
      const args = JSON.parse(call.function.arguments);
      assert.ok(ajv.compile(fn.parameters ?? { type: "object" })(args), where + " " +
                call.function.arguments);
      return call.function.name;
    };
    const seen = new Set();
    for (let seed = 0; seed < 24; seed++) {
      const tool_choice = seed % 3 === 0 ? { type: "function", function: { name: "search" } }
                                         : "required";
      const request = { model: "needle", messages: [{ role: "user", content: "Call " + seed }],
                        tools, tool_choice, max_tokens: 60, temperature: 1.0, seed };
      if (seed % 2 === 0) {
        const res = await api.chat.completions.create(request);
        const msg = res.choices[0].message;
        assert.equal(res.choices[0].finish_reason, "tool_calls", JSON.stringify(res));
        assert.equal(msg.content, null);
        assert.equal(msg.tool_calls.length, 1);
        const name = check(msg.tool_calls[0], `seed ${seed}`);
        if (seed % 3 === 0) assert.equal(name, "search");
        seen.add(name);
      } else {
        // Streamed as OpenAI streams calls: id, type and name first, then argument fragments.
        const stream = await api.chat.completions.create({ ...request, stream: true });
        let call = null, finish = null, content = "";
        for await (const chunk of stream) {
          const choice = chunk.choices[0];
          if (!choice) continue;
          content += choice.delta?.content ?? "";
          for (const d of choice.delta?.tool_calls ?? []) {
            assert.equal(d.index, 0);
            if (call === null) {
              assert.ok(d.id && d.type === "function" && d.function.name, JSON.stringify(d));
              call = { id: d.id, type: d.type,
                       function: { name: d.function.name, arguments: d.function.arguments ?? "" } };
            } else {
              assert.equal(d.id, undefined);
              call.function.arguments += d.function?.arguments ?? "";
            }
          }
          if (choice.finish_reason) finish = choice.finish_reason;
        }
        assert.equal(content, "");
        assert.equal(finish, "tool_calls");
        const name = check(call, `seed ${seed} streamed`);
        if (seed % 3 === 0) assert.equal(name, "search");
        seen.add(name);
      }
    }
    assert.ok(seen.size >= 2, [...seen].join(","));
    // tool_choice auto (the default) is refused until a parser of the model's format exists.
    await assert.rejects(
      api.chat.completions.create({ model: "needle", messages: [{ role: "user", content: "x" }],
                                    tools }),
      (err) => err.status === 400 && err.error.param === "tool_choice");
  });

  test("vLLM's choice and regex: every output is a choice / matches", async () => {
    const choices = ["positive", "negative", "neutral", "n/a"];
    const re = /^[A-Z][a-z]{1,6}-\d{2,4}( ok| no)?$/u;
    const seen = new Set();
    for (let seed = 0; seed < 24; seed++) {
      const chat = seed % 2 === 0;
      const extra = [{ structured_outputs: { choice: choices } }, { guided_choice: choices },
                     { structured_outputs: { regex: re.source.slice(1, -1) } },
                     { guided_regex: re.source.slice(1, -1) }][seed % 4];
      const res = chat
        ? await api.chat.completions.create({
          model: "needle", messages: [{ role: "user", content: "Sentiment " + seed }],
          max_tokens: 24, temperature: 1.5, seed, ...extra })
        : await api.completions.create({ model: "needle", prompt: "Sentiment " + seed,
                                         max_tokens: 24, temperature: 1.5, seed, ...extra });
      const text = chat ? res.choices[0].message.content : res.choices[0].text;
      if (seed % 4 < 2) {
        assert.ok(choices.includes(text), `${seed}: ${JSON.stringify(text)}`);
        assert.equal(res.choices[0].finish_reason, "stop");
        seen.add(text);
      } else {
        assert.match(text, re, `${seed}`);
      }
    }
    assert.ok(seen.size >= 2, [...seen].join(","));
    await assert.rejects(
      api.completions.create({ model: "needle", prompt: "x", guided_regex: "a",
                               guided_choice: ["a"] }),
      (err) => err.status === 400 && err.error.param === "guided_choice" &&
               err.error.message.includes("cannot be combined"));
    await assert.rejects(
      api.completions.create({ model: "needle", prompt: "x", guided_regex: "(a)\\1" }),
      (err) => err.status === 400 && err.error.param === "guided_regex" &&
               err.error.message.includes("backreference '\\1' at offset 3"));
  });

  test("an unsupported keyword is a 400 naming it", async () => {
    for (const [schema, keyword] of [
      [{ type: "string", pattern: "^a+(?=b)" }, "'pattern' (at #): lookahead '(?=' at offset 3"],
      [{ type: "object", properties: { x: { not: { type: "null" } } } }, "'not'"],
      [{ type: "array", uniqueItems: true }, "'uniqueItems'"]]) {
      await assert.rejects(
        api.chat.completions.create({
          model: "needle", messages: [{ role: "user", content: "x" }],
          response_format: { type: "json_schema", json_schema: { name: "bad", schema } } }),
        (err) => {
          assert.ok(err instanceof OpenAI.BadRequestError, err.message);
          assert.equal(err.status, 400);
          assert.ok(err.error.message.includes(keyword), err.error.message);
          assert.equal(err.error.param, "response_format");
          return true;
        });
    }
  });
});
