// Hugging Face's Rust tokenizer (the `tokenizers` npm package, Node bindings with prebuilt
// binaries) encoding one file as one string: the peer of `peregrine tokenize --bench`.
//   node bench/tokenizer_peer.js TOKENIZER_JSON TEXT_FILE [REPEATS]
// Needs `npm install tokenizers` in this folder or on NODE_PATH.
const fs = require('fs');
const { Tokenizer } = require('tokenizers');

async function main() {
    const [tokPath, textPath, repeatsArg] = process.argv.slice(2);
    const repeats = Number(repeatsArg || 5);
    const tok = Tokenizer.fromFile(tokPath);
    const text = fs.readFileSync(textPath, 'utf8');
    const bytes = Buffer.byteLength(text, 'utf8');
    let best = Infinity, tokens = 0;
    for (let i = 0; i < repeats; ++i) {
        const t0 = process.hrtime.bigint();
        const enc = await tok.encode(text, null, { addSpecialTokens: false });
        const s = Number(process.hrtime.bigint() - t0) / 1e9;
        tokens = enc.getLength();
        best = Math.min(best, s);
    }
    console.log(`${bytes} bytes -> ${tokens} tokens; best of ${repeats}: ${(best * 1e3).toFixed(1)} ms, ` +
                `${(bytes / best / 1e6).toFixed(2)} MB/s (Hugging Face tokenizers ${require('tokenizers/package.json').version})`);
}
main();
