// Hugging Face's Rust tokenizer (the `tokenizers` npm package, Node bindings with prebuilt
// binaries) encoding one file as one string: the peer of `peregrine tokenize --bench`.
//   node bench/tokenizer_peer.js TOKENIZER_JSON TEXT_FILE [REPEATS] [--per-line]
// --per-line: encodeBatch() over the lines (one thread with TOKENIZERS_PARALLELISM=false).
// Needs `npm install tokenizers` in this folder or on NODE_PATH.
const fs = require('fs');
const { Tokenizer } = require('tokenizers');

async function main() {
    const [tokPath, textPath, repeatsArg, mode] = process.argv.slice(2);
    const perLine = mode === '--per-line';
    const repeats = Number(repeatsArg || 5);
    const tok = Tokenizer.fromFile(tokPath);
    const text = fs.readFileSync(textPath, 'utf8');
    const bytes = Buffer.byteLength(text, 'utf8');
    const lines = text.split('\n');
    let best = Infinity, tokens = 0;
    for (let i = 0; i < repeats; ++i) {
        const t0 = process.hrtime.bigint();
        if (perLine) {
            const encs = await tok.encodeBatch(lines, { addSpecialTokens: false });
            tokens = encs.reduce((n, e) => n + e.getLength(), 0);
        } else {
            tokens = (await tok.encode(text, null, { addSpecialTokens: false })).getLength();
        }
        const s = Number(process.hrtime.bigint() - t0) / 1e9;
        best = Math.min(best, s);
    }
    console.log(`${bytes} bytes${perLine ? ' (one call per line)' : ''} -> ${tokens} tokens; best of ${repeats}: ${(best * 1e3).toFixed(1)} ms, ` +
                `${(bytes / best / 1e6).toFixed(2)} MB/s (Hugging Face tokenizers ${require('tokenizers/package.json').version})`);
}
main();
