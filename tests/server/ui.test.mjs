// The chat page at / in a real browser: Debian's chromium, headless, driven by puppeteer-core.
// A message typed and sent gets a streamed answer with a tok/s readout; a long generation is
// stopped from the page (the server ends the request); the page loads nothing from elsewhere;
// it works behind --root-path and with an API key; `serve --no-ui` answers 404 at /.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { http, startServer, waitFor } from './harness.mjs';

const require = createRequire(path.resolve(process.env.PG_NODE_MODULES, 'node_modules', 'noop.js'));
const puppeteer = require('puppeteer-core');
const chromium = ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => fs.existsSync(p));

let server, browser;
before(async () => {
    assert.ok(chromium, 'chromium is not installed (scripts/install-deps.sh installs it)');
    server = await startServer(['--root-path', '/chat-proxy', '--api-key', 'sk-ui-test']);
    browser = await puppeteer.launch({
        executablePath: chromium,
        headless: true,
        args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
    });
});
after(async () => {
    browser && (await browser.close());
    server && (await server.stop());
});

// A page on `url` with the API key set, every request it makes recorded.
async function open(url) {
    const page = await browser.newPage();
    const requests = [];
    page.on('request', (r) => requests.push(r.url()));
    await page.goto(url, { waitUntil: 'load' });
    await page.evaluate(() => {
        document.getElementById('api_key').value = 'sk-ui-test';
        document.getElementById('temperature').value = '0';
    });
    return { page, requests };
}

const assistantText = (page) =>
    page.$$eval('.msg.assistant .text', (els) => (els.length ? els[els.length - 1].textContent : ''));

test('a message gets a streamed answer and a tok/s readout', async () => {
    const { page, requests } = await open(`${server.url}/chat-proxy/`);
    await page.type('#input', 'Once upon a time');
    await page.click('#send');
    await page.waitForFunction(() => !document.getElementById('send').disabled &&
        document.querySelectorAll('.msg.assistant').length === 1, { timeout: 30000 });
    const answer = await assistantText(page);
    assert.ok(answer.length > 0, 'empty answer');
    assert.match(await page.$eval('#rate', (e) => e.textContent), /^\d+(\.\d+)? tok\/s$/);
    assert.equal(await page.$$eval('.msg.error', (els) => els.length), 0);
    // The page's model name came from /v1/models through the proxy prefix.
    assert.equal(await page.$eval('#model', (e) => e.textContent), 'stories260K');
    // The same answer as the API gives for the same chat, greedy.
    const api = await http(`${server.url}/v1/chat/completions`, {
        headers: { authorization: 'Bearer sk-ui-test' },
        body: { messages: [{ role: 'user', content: 'Once upon a time' }], temperature: 0, top_p: 1 },
    });
    assert.equal(api.status, 200);
    assert.equal(answer, api.json.choices[0].message.content);
    // Nothing from elsewhere: every request went to this server.
    const origin = new URL(server.url).origin;
    assert.ok(requests.length >= 3, requests.join(' '));
    for (const r of requests) assert.equal(new URL(r).origin, origin, r);
    await page.close();
});

test('Stop ends a long generation on the page, and its connection', async () => {
    const { page } = await open(`${server.url}/chat-proxy`);
    // The embedded model answers 500 tokens in well under a second: a slow link (DevTools'
    // throttling) keeps the stream coming long enough to stop it. That the server aborts a
    // request whose client leaves is server_disconnect's test.
    await page.emulateNetworkConditions({ offline: false, download: 2048, upload: 65536, latency: 20 });
    await page.type('#input', 'Tell me a very long story about a dragon');
    await page.click('#send');
    await page.waitForFunction(() => {
        const els = document.querySelectorAll('.msg.assistant .text');
        return els.length && els[els.length - 1].textContent.length > 20;
    }, { timeout: 30000 });
    assert.equal(await page.$eval('#stop', (b) => !b.disabled), true, 'the answer ended before Stop');
    {
        await page.click('#stop');
        await page.waitForSelector('.msg.stopped', { timeout: 10000 });
        const stopped = await assistantText(page);
        await new Promise((r) => setTimeout(r, 500));
        assert.equal(await assistantText(page), stopped, 'text kept coming after Stop');
        assert.equal(await page.$eval('#send', (b) => b.disabled), false);
        const idle = await waitFor(async () => {
            const m = (await http(`${server.url}/metrics`, { method: 'GET' })).text;
            return /^vllm:num_requests_running\{[^}]*\} 0(\.0)?$/m.test(m);
        }, 10000, 100);
        assert.ok(idle, 'a request still runs on the server after Stop');
    }
    await page.close();
});

test('the page is served at / with a content security policy, and under the root path', async () => {
    const r = await fetch(`${server.url}/`);
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /^text\/html/);
    assert.match(r.headers.get('content-security-policy'), /default-src 'self'/);
    assert.equal((await fetch(`${server.url}/chat-proxy`)).status, 200);
    assert.match(await (await fetch(`${server.url}/chat-proxy/`)).text(), /<title>Peregrine<\/title>/);
});

test('serve --no-ui: 404 at /, the API unchanged', async () => {
    const plain = await startServer(['--no-ui']);
    try {
        assert.equal((await fetch(`${plain.url}/`)).status, 404);
        assert.equal((await fetch(`${plain.url}/health`)).status, 200);
    } finally {
        await plain.stop();
    }
});
