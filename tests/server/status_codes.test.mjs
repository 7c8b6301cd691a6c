// Every row of status_codes.json (the status OpenAI and vLLM answer per invalid request; the
// file's _source says where each comes from) against a `longctx serve` process on loopback
// (CPU, models/needle): the status, OpenAI's error body {"error": {"message", "type", "param",
// "code"}} with the named field, and the Allow header of a 405.
// Environment: LONGCTX_BIN (the longctx binary), LONGCTX_MODEL_DIR (models/needle).
import { readFileSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { startServer } from "./serve_helper.mjs";

const table = JSON.parse(readFileSync(new URL("./status_codes.json", import.meta.url), "utf8"));

describe("status codes of longctx serve (status_codes.json)", () => {
  let server;
  before(async () => { server = await startServer(["--max-request-body", "64KiB"]); });
  after(async () => {
    const { code } = await server.stop();
    assert.equal(code, 0, "serve exits 0 on SIGTERM");
  });

  test("the table is not empty and every row names a case and a status", () => {
    assert.ok(table.cases.length >= 50);
    for (const row of table.cases) assert.ok(row.case && row.method && row.path && row.status);
  });

  for (const row of table.cases) {
    test(`${row.method} ${row.path}: ${row.case} -> ${row.status}`, async () => {
      const init = { method: row.method, headers: {} };
      if (row.raw_body !== undefined || row.body !== undefined) {
        init.headers["Content-Type"] = "application/json";
        let body = row.body;
        if (row.fill) {
          const { field, item, count } = row.fill;
          body = { ...body, [field]: typeof item === "string" ? item.repeat(count) : Array(count).fill(item) };
        }
        init.body = row.raw_body !== undefined ? row.raw_body : JSON.stringify(body);
      }
      const r = await fetch(server.url + row.path, init);
      const text = await r.text();
      assert.equal(r.status, row.status, `body: ${text.slice(0, 300)}`);
      if (row.status < 400) return;
      const j = JSON.parse(text);
      const e = j.error;
      assert.equal(typeof e.message, "string");
      assert.ok(e.message.length > 0);
      assert.equal(e.type, "invalid_request_error");
      assert.ok("param" in e && "code" in e, text);
      if (row.param !== undefined) assert.equal(e.param, row.param, text);
      if (row.code !== undefined) assert.equal(e.code, row.code, text);
      if (row.status === 405) assert.ok(r.headers.get("allow"), "a 405 names the allowed method");
    });
  }
});
