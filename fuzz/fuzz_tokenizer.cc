// libFuzzer target for the tokenizer: encode, decode, the streaming detokenizer and the stop
// matcher on arbitrary bytes, with the fixture vocabularies (byte-level BPE from GGUF and
// tokenizer.json, SentencePiece by score and by merge rank).
//
// Input: byte 0 picks the tokenizer, byte 1 the flags, the rest is the text (or, with flag
// 0x08, little-endian 16-bit token ids for the decoders).
//
// Checked: no crash, leak or UB; ids inside the vocabulary; decode(encode(text)) == text where
// the tokenizer is lossless; the streamed text equals decode() and is valid UTF-8 piece by
// piece; the stop matcher shows exactly the text before the first stop string.
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

using namespace peregrine;

struct Entry {
    std::unique_ptr<Tokenizer> tok;
    bool lossless;  // decode(encode(text)) == text for valid UTF-8 text without special parsing
    // Hugging Face's Metaspace (prepend_scheme "first") adds no "▁" before a leading space,
    // and its decoder still strips one: " x" comes back as "x", as in Hugging Face.
    bool drops_leading_space = false;
    // Bytes the vocabulary has a token for: a character using another one cannot come back
    // (StarCoder's and MPT's vocabularies lack 0xF1, the lead byte of planes 4-7).
    std::array<bool, 256> has_byte{};
};

// Whether the vocabulary has a token for the single byte `b`.
bool vocab_has_byte(const Tokenizer& tok, int b) {
    const std::string s(1, static_cast<char>(b));
    if (tok.kind() == TokenizerKind::ByteLevelBpe) return tok.token_to_id(utf8::byte_level_encode(s)) >= 0;
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    return tok.token_to_id(name) >= 0;
}

std::vector<Entry>& tokenizers() {
    static std::vector<Entry> v;
    return v;
}

[[noreturn]] void die(const char* what, const std::string& detail) {
    std::fprintf(stderr, "fuzz_tokenizer: %s\n%s\n", what, detail.c_str());
    std::abort();
}

void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
    const std::string whole = tok.decode(ids, skip_special);
    if (!utf8::is_valid(whole)) die("decode() is not valid UTF-8", whole);
    IncrementalDetokenizer detok(tok, skip_special);
    std::string streamed;
    for (int32_t id : ids) {
        const std::string d = detok.push(id);
        if (!utf8::is_valid(d)) die("a streamed delta is not valid UTF-8", d);
        streamed += d;
    }
    streamed += detok.finish();
    if (streamed != whole) die("streamed text differs from decode()", streamed + "\n---\n" + whole);
}

void check_stops(const std::string& text, const uint8_t* data, size_t size) {
    // Two stop strings cut out of the input itself, so that they do occur.
    std::vector<std::string> stops;
    if (size >= 4 && !text.empty()) {
        const size_t a = data[2] % text.size(), la = 1 + data[3] % 6;
        stops.push_back(text.substr(a, la));
    }
    stops.push_back("\n\n");
    // The stream ends at the first push that completes a stop string; the text shown is what
    // comes before the earliest stop string inside the text seen so far.
    const size_t step = size > 0 ? 1 + data[0] % 7 : 1;
    size_t first = std::string::npos;
    for (size_t end = step; first == std::string::npos; end += step) {
        const std::string_view seen = std::string_view(text).substr(0, end);
        for (const auto& s : stops) first = std::min(first, seen.find(s));
        if (end >= text.size()) break;
    }
    StopMatcher m(stops);
    std::string shown;
    bool matched = false;
    for (size_t i = 0; i < text.size() && !matched; i += step) {
        const auto r = m.push(std::string_view(text).substr(i, step));
        shown += r.emit;
        matched = r.matched;
        if (first != std::string::npos && shown.size() > first) die("stop matcher leaked past a stop string", text);
    }
    if (!matched) shown += m.flush();
    if (shown != text.substr(0, first)) die("stop matcher output differs", text);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    const std::string dir = PG_FUZZ_TOKENIZER_DIR;
    const struct {
        std::string path;
        bool lossless;
        bool drops_leading_space = false;
    } files[] = {
        {dir + "/ggml-vocab-gpt-2.gguf", true},
        {dir + "/ggml-vocab-llama-spm.gguf", true},
        {dir + "/ggml-vocab-deepseek-coder.gguf", true},
        {dir + "/ggml-vocab-starcoder.gguf", true},
        {std::string(PG_MODELS_DIR) + "/stories260K/tokenizer.json", true, true},
        {dir + "/llama3/tokenizer.json", true},
        {dir + "/qwen3/tokenizer.json", false},  // NFC
    };
    for (const auto& f : files) {
        try {
            Entry e{std::make_unique<Tokenizer>(Tokenizer::load(f.path)), f.lossless, f.drops_leading_space};
            for (int b = 0; b < 256; ++b) e.has_byte[b] = vocab_has_byte(*e.tok, b);
            tokenizers().push_back(std::move(e));
        } catch (const Error& e) {
            die("cannot load a fuzzing tokenizer (the fuzz build unpacks tests/data/tokenizers.tar.xz)", e.what());
        }
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 2) return 0;
    const Entry& e = tokenizers()[data[0] % tokenizers().size()];
    const Tokenizer& tok = *e.tok;
    const uint8_t flags = data[1];
    const bool add_special = flags & 1, parse_special = flags & 2, skip_special = flags & 4;
    const std::string input(reinterpret_cast<const char*>(data + 2), size - 2);

    if (flags & 8) {
        // Arbitrary id sequences through decode() and the detokenizer.
        std::vector<int32_t> ids;
        for (size_t i = 0; i + 1 < input.size(); i += 2) {
            const int v = static_cast<uint8_t>(input[i]) | static_cast<uint8_t>(input[i + 1]) << 8;
            ids.push_back(v % tok.size());
        }
        check_stream(tok, ids, skip_special);
        return 0;
    }

    const std::vector<int32_t> ids = tok.encode(input, add_special, parse_special);
    for (int32_t id : ids)
        if (!tok.valid_id(id)) die("encode() produced an id outside the vocabulary", input);
    check_stream(tok, ids, skip_special);

    const std::string text = utf8::sanitize(input);
    if (e.lossless && !add_special && !parse_special) {
        // A SentencePiece vocabulary reads a literal "▁" as a space.
        const bool spm_meta =
            tok.kind() == TokenizerKind::SentencePieceBpe && text.find("\xe2\x96\x81") != std::string::npos;
        const bool lead = e.drops_leading_space && !text.empty() && text[0] == ' ';
        bool bytes_ok = true;
        for (char c : text) bytes_ok = bytes_ok && e.has_byte[static_cast<unsigned char>(c)];
        if (!spm_meta && !lead && bytes_ok) {
            const std::string back = tok.decode(ids, false);
            if (back != text) die("decode(encode(text)) != text", text + "\n---\n" + back);
        }
    }
    check_stops(text, data, size);
    return 0;
}
