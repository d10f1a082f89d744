// libFuzzer target for structured output, the surface a client controls: a JSON schema
// (response_format, tool parameters), a regex, a GBNF grammar or a choice list, compiled as the
// engine compiles them (front end, then compile_grammar with the default caps), then driven by
// a matcher over a small byte-level vocabulary: masks filled (with and without a token budget),
// tokens accepted, rolled back. Any input must either work or fail with peregrine::Error, within
// the caps; a crash, sanitizer report, leak or hang is a bug.
//
// Input: byte 0 picks the front end (mod 4); the rest is "SPEC\0TEXT": the spec, then bytes the
// matcher is fed one token each (a token that the mask forbids is skipped, as a sampler would
// never draw it).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/automaton.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"

namespace {

using namespace peregrine::grammar;

// Every single byte (ids 0..255, as byte-level vocabularies have), a few multi-byte pieces JSON
// output is made of, one special token and the EOS.
std::shared_ptr<const VocabIndex> vocab() {
    static const std::shared_ptr<const VocabIndex> v = [] {
        Vocabulary voc;
        for (int b = 0; b < 256; ++b) voc.tokens.emplace_back(1, static_cast<char>(b));
        for (const char* piece : {"{\"", "\":", "\": \"", "\",", "\"}", "true", "false", "null", "  ", "\n", "ab",
                                  "123", "1.5e", "\\u00", "é", "🚀", "]}", "[{"})
            voc.tokens.emplace_back(piece);
        voc.tokens.emplace_back("<|special|>");
        voc.tokens.emplace_back("");  // EOS
        voc.special.assign(voc.tokens.size(), false);
        voc.special[voc.tokens.size() - 2] = voc.special[voc.tokens.size() - 1] = true;
        voc.eos.push_back(static_cast<int32_t>(voc.tokens.size() - 1));
        return std::make_shared<const VocabIndex>(std::move(voc));
    }();
    return v;
}

Grammar front_end(uint8_t kind, std::string_view spec) {
    switch (kind % 4) {
        case 0: {
            JsonSchemaOptions o;
            if (kind & 4) o.max_whitespace = 0;
            return compile_json_schema_text(spec, o);
        }
        case 1:
            return compile_regex(spec);
        case 2:
            return compile_gbnf(spec);
        default: {
            const nlohmann::json j = nlohmann::json::parse(spec, nullptr, false);
            std::vector<std::string> choices;
            if (j.is_array())
                for (const auto& c : j)
                    if (c.is_string()) choices.push_back(c.get<std::string>());
            if (choices.empty()) choices.emplace_back(spec);
            return compile_choice(choices);
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1 || size > 16 * 1024) return 0;
    const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
    const size_t cut = in.find('\0');
    const std::string_view spec = in.substr(0, cut);
    const std::string_view text = cut == std::string_view::npos ? std::string_view() : in.substr(cut + 1);
    try {
        auto g = std::make_shared<const TokenizedGrammar>(compile_grammar(front_end(data[0], spec)), vocab());
        GrammarMatcher m(g);
        std::vector<uint32_t> mask(g->vocab().vocab.mask_words());
        const int32_t eos = g->vocab().vocab.eos[0];
        size_t accepted = 0;
        for (size_t i = 0; i < text.size() && i < 256; ++i) {
            const int64_t budget = (data[0] & 8) ? static_cast<int64_t>(text.size() - i) : GrammarMatcher::kNoBudget;
            m.fill_next_token_bitmask(mask, budget);
            const auto id = static_cast<uint8_t>(text[i]);
            if (!(mask[id / 32] >> (id % 32) & 1u)) continue;
            if (!m.accept_token(id)) __builtin_trap();  // the mask allowed it: the matcher must take it
            ++accepted;
            if (text[i] == '\x7f' && accepted >= 2) {  // now and then, undo two tokens
                if (!m.rollback(2)) __builtin_trap();
                accepted -= 2;
            }
        }
        m.fill_next_token_bitmask(mask);
        const bool eos_allowed = mask[static_cast<size_t>(eos) / 32] >> (eos % 32) & 1u;
        if (eos_allowed != m.is_completed()) __builtin_trap();  // EOS exactly when the sentence can end
    } catch (const peregrine::Error&) {
    }
    return 0;
}
