// Shared by the server tests: start `peregrine serve` on a free port, the OpenAI client from the
// npm packages the setup installed (PG_NODE_MODULES), small HTTP helpers.
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';

const binary = process.env.PG_BINARY && path.resolve(process.env.PG_BINARY);
const modules = process.env.PG_NODE_MODULES;
if (!binary || !modules) throw new Error('PG_BINARY and PG_NODE_MODULES must be set (ctest sets them)');
const require = createRequire(path.resolve(modules, 'node_modules', 'noop.js'));
const openai = require('openai');
export const OpenAI = openai.OpenAI;
export const APIError = openai.APIError;

// Extra `serve` flags for every server a test file starts: PG_SERVE_ARGS (space separated), e.g.
// "--device cpu --tensor-parallel-size 2" to run the same API tests against a model-parallel group.
const extraArgs = (process.env.PG_SERVE_ARGS ?? '').split(' ').filter((a) => a);

// Starts the server with `args`; resolves once it is ready. stop() ends it (SIGTERM).
export async function startServer(args = [], { command = [binary, 'serve'] } = {}) {
    const [exe, ...pre] = command;
    const proc = spawn(exe, [...pre, '--port', '0', ...extraArgs, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    const ready = new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`server not ready in 60 s:\n${log}`)), 60000);
        proc.stderr.on('data', (d) => {
            log += d.toString();
            const m = log.match(/^ready: serving '[^']*' at (https?:\/\/[^\s]+)\/v1/m);  // not a replica's line
            if (m) {
                clearTimeout(timer);
                resolve(m[1]);
            }
        });
        proc.on('exit', (code) => {
            clearTimeout(timer);
            reject(new Error(`server exited with ${code} before it was ready:\n${log}`));
        });
    });
    const url = await ready;
    const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
    return {
        url,
        proc,
        log: () => log,
        client: (opts = {}) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'none', maxRetries: 0, ...opts }),
        async stop() {
            proc.kill('SIGTERM');
            return exited;
        },
    };
}

// A raw HTTP call: {status, headers, text, json}.
export async function http(url, { method = 'POST', body, headers = {} } = {}) {
    const init = { method, headers: { ...headers } };
    if (body !== undefined) {
        init.body = typeof body === 'string' ? body : JSON.stringify(body);
        init.headers['content-type'] ??= 'application/json';
    }
    const res = await fetch(url, init);
    const text = await res.text();
    let json;
    try {
        json = JSON.parse(text);
    } catch {
        json = undefined;
    }
    return { status: res.status, headers: res.headers, text, json };
}

// Runs `fn` (a client call) and returns the APIError it must throw.
export async function apiError(fn) {
    try {
        await fn();
    } catch (e) {
        if (!(e instanceof APIError)) throw new Error(`expected an APIError, got ${e}`);
        return e;
    }
    throw new Error('the call succeeded');
}

// Polls `fn` until it returns truthy or `ms` pass; returns the last value.
export async function waitFor(fn, ms, step = 10) {
    const end = Date.now() + ms;
    for (;;) {
        const v = await fn();
        if (v || Date.now() >= end) return v;
        await new Promise((r) => setTimeout(r, step));
    }
}
