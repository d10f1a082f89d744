#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace peregrine {

const char* const kGpt2SplitRegex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

pcre2_code* as_code(void* p) {
    return static_cast<pcre2_code*>(p);
}

}  // namespace

struct RegexSplitter::Scratch {
    pcre2_match_data* md = nullptr;
    pcre2_jit_stack* jit_stack = nullptr;
    pcre2_match_context* mctx = nullptr;
    Scratch() { md = pcre2_match_data_create(1, nullptr); }
    ~Scratch() {
        pcre2_match_data_free(md);
        if (mctx) pcre2_match_context_free(mctx);
        if (jit_stack) pcre2_jit_stack_free(jit_stack);
    }
    // A larger JIT stack, for a pattern whose backtracking outgrew the default 32 KiB.
    bool grow() {
        if (jit_stack) return false;
        jit_stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
        mctx = pcre2_match_context_create(nullptr);
        if (!jit_stack || !mctx) return false;
        pcre2_jit_stack_assign(mctx, nullptr, jit_stack);
        return true;
    }
};

RegexSplitter::RegexSplitter(std::vector<SplitRule> rules, const std::string& where) {
    for (auto& r : rules) {
        int err = 0;
        PCRE2_SIZE off = 0;
        pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(r.pattern.data()), r.pattern.size(),
                                         PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
        if (!code) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof(msg));
            fail(where, ": pre-tokenizer regex does not compile at offset ", off, ": ", reinterpret_cast<char*>(msg),
                 " (pattern: ", r.pattern, ")");
        }
        Entry e{std::move(r), code, pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0};
        rules_.push_back(std::move(e));
    }
}

RegexSplitter::~RegexSplitter() {
    for (auto& e : rules_) pcre2_code_free(as_code(e.code));
}

RegexSplitter::RegexSplitter(RegexSplitter&& o) noexcept : rules_(std::move(o.rules_)) {
    o.rules_.clear();
}

RegexSplitter& RegexSplitter::operator=(RegexSplitter&& o) noexcept {
    if (this != &o) {
        for (auto& e : rules_) pcre2_code_free(as_code(e.code));
        rules_ = std::move(o.rules_);
        o.rules_.clear();
    }
    return *this;
}

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& out) const {
    if (text.empty()) return;
    if (rules_.empty()) {
        out.push_back(text);
        return;
    }
    Scratch sc;
    split_level(0, text, out, sc);
}

void RegexSplitter::split_level(size_t level, std::string_view s, std::vector<std::string_view>& out,
                                Scratch& sc) const {
    if (s.empty()) return;
    if (level == rules_.size()) {
        out.push_back(s);
        return;
    }
    const Entry& e = rules_[level];
    const auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    const size_t n = s.size();
    auto piece = [&](size_t a, size_t b) {
        if (b > a) split_level(level + 1, s.substr(a, b - a), out, sc);
    };
    size_t pos = 0;       // where the next search starts
    size_t gap = 0;       // start of the text not yet handed out
    size_t last_end = 0;  // end of the previous match (Contiguous)
    bool have_run = false;
    size_t run_start = 0;
    auto flush_run = [&] {
        if (have_run) piece(run_start, last_end);
        have_run = false;
    };
    while (pos < n) {
        int rc = e.jit && !sc.mctx ? pcre2_jit_match(as_code(e.code), subject, n, pos, 0, sc.md, nullptr)
                                   : pcre2_match(as_code(e.code), subject, n, pos, PCRE2_NO_UTF_CHECK, sc.md, sc.mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && sc.grow())
            rc = pcre2_match(as_code(e.code), subject, n, pos, PCRE2_NO_UTF_CHECK, sc.md, sc.mctx);
        if (rc < 0) break;  // no match (or a limit hit): the rest is one gap
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(sc.md);
        size_t a = ov[0], b = ov[1];
        if (b <= a) {
            // An empty match delimits nothing; step over one character.
            pos = a + 1;
            while (pos < n && (static_cast<unsigned char>(s[pos]) & 0xc0) == 0x80) ++pos;
            continue;
        }
        if (e.rule.invert) {
            // The matches are the kept text; everything between them is a delimiter.
            if (e.rule.behavior == SplitBehavior::Removed) {
                piece(a, b);
            } else {
                piece(gap, a);
                piece(a, b);
            }
            gap = b;
            pos = b;
            continue;
        }
        switch (e.rule.behavior) {
            case SplitBehavior::Isolated:
                piece(gap, a);
                piece(a, b);
                gap = b;
                break;
            case SplitBehavior::Removed:
                piece(gap, a);
                gap = b;
                break;
            case SplitBehavior::MergedWithPrevious:
                piece(gap, b);
                gap = b;
                break;
            case SplitBehavior::MergedWithNext:
                piece(gap, a);
                gap = a;
                break;
            case SplitBehavior::Contiguous:
                if (have_run && a == last_end) {
                    last_end = b;
                } else {
                    flush_run();
                    piece(gap, a);
                    have_run = true;
                    run_start = a;
                    last_end = b;
                }
                gap = b;
                break;
        }
        pos = b;
    }
    flush_run();
    if (e.rule.invert && e.rule.behavior == SplitBehavior::Removed) return;
    piece(gap, n);
}

namespace {

// llama.cpp's pre-tokenizer families, by `tokenizer.ggml.pre`.
const char* const kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
const char* const kCjk = R"([一-龥ࠀ-一가-퟿]+)";
// DeepSeek LLM's cased-letter class, as its tokenizer.json spells it (code points, since
// some of them, like U+1FD3 and U+212A, are not in NFC and editors may fold them).
const char* const kDeepseekLetters =
    R"(\s?[A-Za-z\x{b5}\x{c0}-\x{d6}\x{d8}-\x{f6}\x{f8}-\x{1ba}\x{1bc}-\x{1bf}\x{1c4}-\x{293}\x{295}-\x{2af}\x{370}-\x{373}\x{376}\x{377}\x{37b}-\x{37d}\x{37f}\x{386}\x{388}-\x{38a}\x{38c}\x{38e}-\x{3a1}\x{3a3}-\x{3f5}\x{3f7}-\x{481}\x{48a}-\x{52f}\x{531}-\x{556}\x{10a0}-\x{10c5}\x{13a0}-\x{13f5}\x{13f8}-\x{13fd}\x{1c90}-\x{1cba}\x{1cbd}-\x{1cbf}\x{1d00}-\x{1d2b}\x{1d6b}-\x{1d77}\x{1d79}-\x{1d9a}\x{1e00}-\x{1f15}\x{1f18}-\x{1f1d}\x{1f20}-\x{1f45}\x{1f48}-\x{1f4d}\x{1f50}-\x{1f57}\x{1f59}\x{1f5b}\x{1f5d}\x{1f5f}-\x{1f7d}\x{1f80}-\x{1fb4}\x{1fb6}-\x{1fbc}\x{1fbe}\x{1fc2}-\x{1fc4}\x{1fc6}-\x{1fcc}\x{1fd0}-\x{1fd3}\x{1fd6}-\x{1fdb}\x{1fe0}-\x{1fec}\x{1ff2}-\x{1ff4}\x{1ff6}-\x{1ffc}\x{2102}\x{2107}\x{210a}-\x{2113}\x{2115}\x{2119}-\x{211d}\x{2124}\x{2126}\x{2128}K-\x{212d}\x{212f}-\x{2134}\x{2139}\x{213c}-\x{213f}\x{2145}-\x{2149}\x{214e}\x{2183}\x{2184}\x{2c00}-\x{2c7b}\x{2c7e}-\x{2ce4}\x{2ceb}-\x{2cee}\x{2cf2}\x{2cf3}\x{a640}-\x{a66d}\x{a680}-\x{a69b}\x{a722}-\x{a76f}\x{a771}-\x{a787}\x{a78b}-\x{a78e}\x{ab70}-\x{abbf}\x{fb00}-\x{fb06}\x{fb13}-\x{fb17}\x{ff21}-\x{ff3a}\x{ff41}-\x{ff5a}\x{10400}-\x{1044f}\x{104b0}-\x{104d3}\x{104d8}-\x{104fb}\x{10c80}-\x{10cb2}\x{10cc0}-\x{10cf2}\x{118a0}-\x{118df}\x{1e900}-\x{1e943}]+)";
const char* const kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool one_of(const std::string& s, std::initializer_list<const char*> names) {
    for (const char* n : names)
        if (s == n) return true;
    return false;
}

}  // namespace

std::vector<SplitRule> gguf_pre_tokenizer_rules(const std::string& pre, bool* ignore_merges) {
    *ignore_merges = false;
    auto rules = [](std::initializer_list<const char*> pats) {
        std::vector<SplitRule> r;
        for (const char* p : pats) r.push_back({p, SplitBehavior::Isolated, false});
        return r;
    };
    if (one_of(pre, {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1"})) {
        *ignore_merges = true;
        return rules({kLlama3});
    }
    if (one_of(pre, {"smaug-bpe", "chatglm-bpe"})) return rules({kLlama3});
    if (one_of(pre, {"qwen2", "stablelm2", "hunyuan", "deepseek-r1-qwen", "megrez"})) return rules({kQwen2});
    if (one_of(pre, {"gpt-2", "gpt2", "mpt", "olmo", "jais", "phi-2", "trillion"})) return rules({kGpt2});
    if (one_of(pre, {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}))
        return rules({R"(\p{N})", kGpt2});
    if (pre == "deepseek-coder") return rules({R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjk, R"(\p{N})"});
    if (pre == "deepseek-llm")
        return rules(
            {R"([\r\n])", kDeepseekLetters, R"(\s?[!-/:-~！-／：-～‘-‟　-。]+)", R"(\s+$)", kCjk, R"(\p{N}+)"});
    if (pre == "deepseek-v3")
        return rules(
            {R"(\p{N}{1,3})", R"([一-龥぀-ゟ゠-ヿ]+)",
             R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"});
    if (pre == "falcon") return rules({R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, R"([0-9][0-9][0-9])"});
    if (one_of(pre, {"poro-chat", "bloom", "gpt3-finnish"})) return rules({R"( ?[^(\s|.,!?…。，、।۔،)]+)"});
    if (pre == "viking") return rules({R"( ?[^(\s|.,!?…。，、।۔،)]+)", R"(\p{N})"});
    if (pre == "tekken") {
        *ignore_merges = true;
        return rules({kTekken});
    }
    if (pre == "default") return rules({R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", R"([0-9][0-9][0-9])"});
    fail("unknown pre-tokenizer '", pre, "'");
}

}  // namespace peregrine
