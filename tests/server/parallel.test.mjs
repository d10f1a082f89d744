// Tensor and pipeline parallel groups on the CPU (one process per rank, shared-memory
// collectives), through `peregrine serve` as users start it:
//   - greedy completions of TP 2, TP 4, PP 2 and TP 2 x PP 2 groups equal one rank's, on the
//     embedded model and the HF fixtures (llama3, qwen2 biases, qwen3 q/k norms);
//   - a worker rank killed (idle, or in the middle of a streamed request) makes `serve` exit
//     non-zero within 5 s with a line naming the rank;
//   - two `serve` commands joined by flags (and by PEREGRINE_* variables), as two hosts would be;
//   - `mpirun -np 2` with Debian's Open MPI;
//   - a stop on SIGTERM ends every rank with status 0.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { startServer } from './harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const data = path.resolve(here, '..', 'data');
const binary = path.resolve(process.env.PG_BINARY);
const cpu = ['--device', 'cpu', '--threads', '1'];

const models = [
    { name: 'stories260K', args: [], prompts: ['Once upon a time', 'The cat sat on', 'Lily and Ben went'] },
    { name: 'llama3-tiny', args: ['--model', path.join(data, 'llama3-tiny')], prompts: ['Hello world', 'abc def'] },
    { name: 'qwen2-tiny', args: ['--model', path.join(data, 'qwen2-tiny')], prompts: ['Hello world', 'abc def'] },
    { name: 'qwen3-tiny', args: ['--model', path.join(data, 'qwen3-tiny')], prompts: ['Hello world', 'abc def'] },
];

async function greedy(server, prompts) {
    const client = server.client();
    const out = [];
    for (const prompt of prompts) {
        const r = await client.completions.create({ model: 'm', prompt, max_tokens: 24, temperature: 0 });
        out.push(r.choices[0].text);
    }
    return out;
}

// Resolves {code, signal} when `proc` exits, or null after `ms`.
function exitWithin(proc, ms) {
    return new Promise((resolve) => {
        if (proc.exitCode !== null || proc.signalCode !== null)
            return resolve({ code: proc.exitCode, signal: proc.signalCode });
        const timer = setTimeout(() => resolve(null), ms);
        proc.on('exit', (code, signal) => {
            clearTimeout(timer);
            resolve({ code, signal });
        });
    });
}

function childPids(pid) {
    return readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number);
}

async function freePort() {
    const srv = net.createServer();
    await new Promise((r) => srv.listen(0, '127.0.0.1', r));
    const { port } = srv.address();
    await new Promise((r) => srv.close(r));
    return port;
}

const served = (m) => [...cpu, ...m.args, '--served-model-name', 'm'];

describe('greedy completions of a group equal one rank', () => {
    for (const m of models) {
        test(m.name, async () => {
            const one = await startServer(served(m));
            const want = await greedy(one, m.prompts);
            assert.deepEqual(await one.stop(), { code: 0, signal: null });
            for (const par of [['--tensor-parallel-size', '2'], ['--tensor-parallel-size', '4'],
                               ['--pipeline-parallel-size', '2'],
                               ['--tensor-parallel-size', '2', '--pipeline-parallel-size', '2']]) {
                const group = await startServer([...served(m), ...par]);
                try {
                    assert.deepEqual(await greedy(group, m.prompts), want, `${m.name} ${par.join(' ')}`);
                } finally {
                    assert.deepEqual(await group.stop(), { code: 0, signal: null }, group.log());
                }
            }
        });
    }
});

// The KV host tier in a group: every rank keeps its slice of each host slot, and the copies go
// to every rank like a step. Embedded model, TP 2 x PP 2: a block is 6,144 bytes on stage 0's
// ranks (3 of 5 layers, 2 of 4 kv heads) and 4,096 on stage 1's (20,480 together); the group
// keeps the fewest slots.
describe('the KV host tier in a group', () => {
    test('TP 2 x PP 2 in a tiny pool swaps to the host tier and gives one rank\'s greedy text', async () => {
        const prompts = Array.from({ length: 5 }, (_, i) => `Story ${i}: the little ${['dog', 'cat', 'bird', 'fox', 'owl'][i]} went`);
        const one = (s, prompt) => s.client().completions.create(
            { model: 'stories260K', prompt, max_tokens: 64, temperature: 0, ignore_eos: true });
        const alone = await startServer(cpu);
        const want = [];
        for (const p of prompts) want.push((await one(alone, p)).choices[0].text);
        assert.deepEqual(await alone.stop(), { code: 0, signal: null });

        const group = await startServer([...cpu, '--tensor-parallel-size', '2', '--pipeline-parallel-size', '2',
                                         '--kv-cache-memory', String(12 * 6144), '--kv-offload-memory',
                                         String(64 * 6144)]);
        try {
            assert.match(group.log(), /KV host tier: 64 blocks/);
            // Bytes over every rank's slice: 64 slots of a whole block (20,480 bytes, as one rank's).
            const health = await (await fetch(`${group.url}/health`)).json();
            assert.equal(health.host_kv_blocks_total, 64);
            assert.equal(health.host_kv_bytes_total, 64 * 20480);
            const together = await Promise.all(prompts.map((p) => one(group, p)));
            assert.deepEqual(together.map((r) => r.choices[0].text), want);
            const m = await (await fetch(`${group.url}/metrics`)).text();
            const metric = (name) => Number((m.match(new RegExp(`^${name}\\{[^}]*\\} (\\S+)$`, 'm')) ?? [])[1]);
            assert.ok(metric('peregrine:num_swap_preemptions_total') > 0, 'the pool is small enough to swap');
            assert.ok(metric('peregrine:kv_swapped_in_bytes_total') > 0);
        } finally {
            assert.deepEqual(await group.stop(), { code: 0, signal: null }, group.log());
        }
    });

    test('a host tier the host cannot hold for every rank is refused at start', async () => {
        const bytes = Math.floor((await import('node:os')).totalmem() / 2) + (1 << 20);  // fits once, not twice
        const r = spawn(binary, ['serve', ...cpu, '--tensor-parallel-size', '2', '--kv-offload-memory',
                                 String(bytes)]);
        let err = '';
        r.stderr.on('data', (d) => { err += d; });
        const exit = await exitWithin(r, 10000);
        assert.ok(exit && exit.code !== 0, err);
        assert.match(err, /--kv-offload-memory \d+ bytes x 2 ranks on this host is more than its memory/);
    });

    test('the disk tier is refused in a group, naming it', async () => {
        const r = spawn(binary, ['serve', ...cpu, '--tensor-parallel-size', '2', '--kv-offload-memory', '1000000',
                                 '--kv-offload-disk', '/tmp', '--kv-offload-disk-size', '1000000']);
        let err = '';
        r.stderr.on('data', (d) => { err += d; });
        const exit = await exitWithin(r, 10000);
        assert.ok(exit && exit.code !== 0, err);
        assert.match(err, /--kv-offload-disk is not supported with tensor or pipeline parallelism/);
    });
});

describe('a rank that dies stops the group', () => {
    test('idle: serve exits non-zero within 5 s naming the rank', async () => {
        const s = await startServer([...cpu, '--tensor-parallel-size', '2', '--pipeline-parallel-size', '2']);
        const ranks = childPids(s.proc.pid);
        assert.equal(ranks.length, 3);
        const t0 = Date.now();
        process.kill(ranks[1], 'SIGKILL');  // rank 2
        const exit = await exitWithin(s.proc, 5000);
        assert.ok(exit, `serve still running 5 s after rank 2 was killed:\n${s.log()}`);
        assert.notEqual(exit.code, 0);
        assert.match(s.log(), /rank 2 \(pid \d+ on [^)]+\) killed by signal 9.*stopping the group/);
        console.log(`serve exited ${Date.now() - t0} ms after rank 2 was killed`);
    });

    test('in the middle of a streamed request', async () => {
        const s = await startServer([...cpu, '--tensor-parallel-size', '2']);
        const [rank1] = childPids(s.proc.pid);
        const stream = await s.client().completions.create({
            model: 'stories260K', prompt: 'Once upon a time', max_tokens: 480, temperature: 1, stream: true,
            ignore_eos: true,
        });
        const reading = (async () => {
            let n = 0;
            try {
                for await (const c of stream) if (++n === 5) process.kill(rank1, 'SIGKILL');
            } catch {
                // the connection ends with the server
            }
            return n;
        })();
        const exit = await exitWithin(s.proc, 15000);
        assert.ok(exit, `serve still running after rank 1 was killed:\n${s.log()}`);
        assert.notEqual(exit.code, 0);
        assert.match(s.log(), /rank 1 \(pid \d+ on [^)]+\).*stopping the group/);
        const chunks = await reading;
        assert.ok(chunks >= 5 && chunks < 480, `${chunks} chunks: the stream was not cut by the failure`);
    });
});

describe('launch across hosts', () => {
    const want = ', there was a little girl named Lily. She loved to play outside in the park. One day,';

    test('two commands joined by --nnodes / --node-rank / --master-port', async () => {
        const port = String(await freePort());
        const flags = [...cpu, '--tensor-parallel-size', '2', '--nnodes', '2', '--master-port', port];
        let log1 = '';
        const node1 = spawn(binary, ['serve', '--port', '0', ...flags, '--node-rank', '1'], {
            stdio: ['ignore', 'ignore', 'pipe'],
        });
        node1.stderr.on('data', (d) => (log1 += d));
        const node0 = await startServer([...flags, '--node-rank', '0']);
        const r = await node0.client().completions.create({
            model: 'stories260K', prompt: 'Once upon a time', max_tokens: 20, temperature: 0,
        });
        assert.equal(r.choices[0].text, want.slice(0, r.choices[0].text.length));
        assert.equal(r.usage.completion_tokens, 20);
        assert.deepEqual(await node0.stop(), { code: 0, signal: null });
        assert.deepEqual(await exitWithin(node1, 5000), { code: 0, signal: null }, log1);
    });

    test('the second host configured by PEREGRINE_* variables (a LeaderWorkerSet pod)', async () => {
        const port = String(await freePort());
        const node1 = spawn(binary, ['serve', '--port', '0', ...cpu, '--tensor-parallel-size', '2'], {
            stdio: ['ignore', 'ignore', 'inherit'],
            env: { ...process.env, PEREGRINE_NNODES: '2', PEREGRINE_NODE_RANK: '1', PEREGRINE_MASTER_ADDR: 'localhost',
                   PEREGRINE_MASTER_PORT: port },
        });
        const node0 = await startServer(
            [...cpu, '--tensor-parallel-size', '2', '--nnodes', '2', '--node-rank', '0', '--master-port', port]);
        const r = await node0.client().completions.create({
            model: 'stories260K', prompt: 'Once upon a time', max_tokens: 20, temperature: 0,
        });
        assert.equal(r.choices[0].text, want.slice(0, r.choices[0].text.length));
        assert.deepEqual(await node0.stop(), { code: 0, signal: null });
        assert.deepEqual(await exitWithin(node1, 5000), { code: 0, signal: null });
    });

    test('mpirun -np 2 (Open MPI)', async () => {
        const mpirun = ['mpirun', '-np', '2', '--oversubscribe'];
        if (process.getuid() === 0) mpirun.push('--allow-run-as-root');
        const port = String(await freePort());
        const s = await startServer([...cpu, '--tensor-parallel-size', '2', '--master-port', port],
                                    { command: [...mpirun, binary, 'serve'] });
        assert.match(s.log(), /tensor parallel 2 x pipeline parallel 1: 2 ranks, 2 launched processes on 1 host/);
        const r = await s.client().completions.create({
            model: 'stories260K', prompt: 'Once upon a time', max_tokens: 20, temperature: 0,
        });
        assert.equal(r.choices[0].text, want.slice(0, r.choices[0].text.length));
        // mpirun itself exits 1 when it is signalled; the group stops when its rank 0 does.
        const rank0 = childPids(s.proc.pid).find((pid) =>
            readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0').includes('OMPI_COMM_WORLD_RANK=0'));
        process.kill(rank0, 'SIGTERM');
        assert.deepEqual(await exitWithin(s.proc, 10000), { code: 0, signal: null }, s.log());
    });
});
