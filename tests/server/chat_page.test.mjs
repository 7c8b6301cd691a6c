// The chat page (GET /) in headless Chromium against `longctx serve` on the CPU with models/needle:
// the page loads the model name, a message typed into the input and sent with Enter goes to
// /v1/chat/completions with stream: true and is answered as text/event-stream, the reply is seen
// at least twice while growing and ends non-empty with its stats line, no page errors or console
// errors, a screenshot (chat_page.png) is kept, and serve exits 0 on SIGTERM.
// Environment: LONGCTX_BIN (the longctx binary), LONGCTX_MODEL_DIR (models/needle),
// LONGCTX_NPM_DIR (the folder whose node_modules holds puppeteer-core; tools/fetch_test_data.sh),
// LONGCTX_ARTIFACT_DIR (where the screenshot goes), LONGCTX_CHROMIUM (the browser; default
// /usr/bin/chromium, Debian's `chromium` package, tools/install_deps.sh).
import { existsSync, mkdirSync, readFileSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";

import { env, needleQuestion as question, startServer } from "./serve_helper.mjs";


// Missing pieces fail the test (CI installs both), with what to install.
const chromium = process.env.LONGCTX_CHROMIUM || "/usr/bin/chromium";
assert.ok(existsSync(chromium),
          `no Chromium at ${chromium}: install Debian's chromium (tools/install_deps.sh, or ` +
          "apt-get install chromium) or point LONGCTX_CHROMIUM at a Chromium binary");
const require = createRequire(env("LONGCTX_NPM_DIR") + "/package.json");
let puppeteer;
try {
  puppeteer = require("puppeteer-core");
} catch (e) {
  assert.fail(`puppeteer-core not found under ${env("LONGCTX_NPM_DIR")} (${e.code || e.message}): ` +
              "run tools/fetch_test_data.sh");
}

describe("chat page in headless Chromium (needle, CPU)", () => {
  let server, browser, page;
  const pageErrors = [], consoleErrors = [], chatRequests = [], chatResponses = [];
  before(async () => {
    server = await startServer([]);
    browser = await puppeteer.launch({
      executablePath: chromium, headless: true, timeout: 60000, protocolTimeout: 120000,
      // CI runs as root (no sandbox there); a small /dev/shm in containers crashes the renderer.
      args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run"],
    });
    page = await browser.newPage();
    await page.setViewport({ width: 1000, height: 700 });
    page.setDefaultTimeout(120000);
    page.on("pageerror", (err) => pageErrors.push(err.message));
    page.on("console", (msg) => {
      if (msg.type() === "error") consoleErrors.push(`${msg.text()} (${msg.location().url || "?"})`);
    });
    page.on("request", (req) => {
      if (new URL(req.url()).pathname === "/v1/chat/completions") {
        chatRequests.push({ method: req.method(), body: req.postData() });
      }
    });
    page.on("response", (res) => {
      if (new URL(res.url()).pathname === "/v1/chat/completions") chatResponses.push(res);
    });
  });
  after(async () => {
    if (browser) await browser.close();
    if (server) assert.equal((await server.stop()).code, 0, "serve exits 0 on SIGTERM");
  });

  test("type a message, see the reply stream in", async (t) => {
    const response = await page.goto(server.url + "/", { waitUntil: "load" });
    assert.equal(response.status(), 200);
    assert.equal(await page.title(), "longctx chat");
    await page.waitForFunction(() => document.getElementById("model").textContent.includes("needle"));

    // A short, reproducible reply: max tokens 32 and temperature 0, set through the page's fields.
    for (const [id, value] of [["#max-tokens", "32"], ["#temperature", "0"]]) {
      await page.click(id, { clickCount: 3 });
      await page.type(id, value);
    }
    // Every text the reply shows, in order, and how many separate observer callbacks saw one.
    // The page sets the reply's textContent, a new text node each time, so each record's added
    // node keeps the text of that update, also when several updates land in one callback.
    await page.evaluate(() => {
      window.replyTexts = [];
      window.replyCallbacks = 0;
      new MutationObserver((records) => {
        let seen = false;
        for (const r of records) {
          if (!r.target.classList || !r.target.classList.contains("assistant")) continue;
          const text = Array.from(r.addedNodes, (n) => n.textContent).join("");
          if (text) { window.replyTexts.push(text); seen = true; }
        }
        if (seen) window.replyCallbacks++;
      }).observe(document.getElementById("log"), { childList: true, subtree: true });
    });

    await page.type("#input", question);
    await page.keyboard.press("Enter");
    await page.waitForSelector(".msg.assistant.done", { timeout: 120000 });

    const state = await page.evaluate(() => {
      const out = document.querySelector(".msg.assistant");
      return {
        user: document.querySelector(".msg.user").textContent,
        reply: out.textContent, error: out.classList.contains("error"),
        stats: (document.querySelector(".stats") || {}).textContent || "",
        texts: window.replyTexts, callbacks: window.replyCallbacks,
        input: document.getElementById("input").value,
        send: document.getElementById("send").textContent,
      };
    });
    assert.equal(state.user, question);
    assert.equal(state.error, false, `the reply is an error: ${state.reply}`);
    assert.ok(state.reply.length > 0, "the reply is empty");
    assert.match(state.stats, /^\d+ tokens, first after [\d.]+ s, [\d.]+ s in all$/);
    assert.equal(state.input, "", "the input is cleared after sending");
    assert.equal(state.send, "Send");

    // Streamed: the reply was seen at least twice while growing, each text extending the last.
    // Not asserted: that the updates came at separate times (state.callbacks >= 2). Here each
    // token comes in a callback of its own, but the whole reply takes ~60 ms, so a renderer slow
    // to start reading (a loaded machine) finds it all buffered and shows it in one callback.
    const texts = state.texts.filter((t, i, a) => t.length > 0 && t !== a[i - 1]);
    assert.ok(texts.length >= 2, `reply seen ${texts.length} time(s) while growing: ${JSON.stringify(texts)}`);
    for (let i = 1; i < texts.length; ++i) {
      assert.ok(texts[i].startsWith(texts[i - 1]) && texts[i].length > texts[i - 1].length,
                `update ${i} does not extend the one before: ${JSON.stringify(texts.slice(i - 1, i + 1))}`);
    }
    assert.equal(texts[texts.length - 1], state.reply);
    t.diagnostic(`reply ${JSON.stringify(state.reply)}: ${texts.length} updates in ` +
                 `${state.callbacks} observer callback(s)`);

    assert.equal(chatRequests.length, 1, "one request to /v1/chat/completions");
    assert.equal(chatRequests[0].method, "POST");
    const body = JSON.parse(chatRequests[0].body);
    assert.equal(body.stream, true);
    assert.equal(body.model, "needle");
    assert.equal(body.max_tokens, 32);
    assert.deepEqual(body.messages, [{ role: "user", content: state.user }]);
    assert.equal(chatResponses.length, 1);
    assert.equal(chatResponses[0].status(), 200);
    assert.match(chatResponses[0].headers()["content-type"], /^text\/event-stream/);

    const dir = env("LONGCTX_ARTIFACT_DIR");
    mkdirSync(dir, { recursive: true });
    const shot = path.join(dir, "chat_page.png");
    await page.screenshot({ path: shot, fullPage: true });
    assert.ok(statSync(shot).size > 0, `empty screenshot ${shot}`);
    assert.equal(readFileSync(shot).subarray(1, 4).toString(), "PNG");

    assert.deepEqual(pageErrors, [], "no page errors");
    assert.deepEqual(consoleErrors, [], "no console errors");
  });
});
