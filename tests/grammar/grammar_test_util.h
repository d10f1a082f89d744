// Shared by the grammar tests: whole-string matching, mask walks, and a small JSON Schema
// checker for what the walks produce (the keywords the compiler supports).
#pragma once

#include <cmath>
#include <memory>
#include <random>
#include <regex>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "grammar/automaton.h"
#include "grammar/matcher.h"
#include "grammar/parser.h"

namespace peregrine::grammar::testing {

// Does the grammar match the whole of `text`?
inline bool full_match(const CompiledGrammar& cg, const std::string& text) {
    Parser p(cg);
    for (char c : text)
        if (!p.advance(uint8_t(c))) return false;
    return p.at_end();
}
inline bool full_match(const Grammar& g, const std::string& text) {
    return full_match(compile_grammar(g), text);
}

inline bool allowed(const std::vector<uint32_t>& mask, int32_t id) {
    return mask[size_t(id) >> 5] >> (id & 31) & 1;
}

// Walks the grammar by sampling from each step's mask: uniformly for `free_steps` tokens, then
// often preferring tokens that close structures (EOS, '"', '}', ']', ...), so the walk ends. Returns
// the text, or fails the test (the mask was empty before the grammar completed, or the walk did
// not end within `max_steps`).
inline std::string random_walk(const std::shared_ptr<const TokenizedGrammar>& tg, std::mt19937& rng, int free_steps,
                               int max_steps = 4000) {
    const Vocabulary& v = tg->vocab().vocab;
    GrammarMatcher m(tg);
    std::vector<uint32_t> mask(v.mask_words());
    std::string text;
    // Closing preference: single-byte tokens, best first.
    static const std::string kClosers = "\"}],.0:1aA -e";
    std::vector<int32_t> closer_ids;
    for (char c : kClosers)
        for (size_t i = 0; i < v.size(); ++i)
            if (v.tokens[i] == std::string(1, c) && (v.special.empty() || !v.special[i])) {
                closer_ids.push_back(int32_t(i));
                break;
            }
    for (int step = 0; step < max_steps; ++step) {
        m.fill_next_token_bitmask(mask);
        std::vector<int32_t> ids;
        for (size_t w = 0; w < mask.size(); ++w)
            for (uint32_t bits = mask[w]; bits; bits &= bits - 1)
                ids.push_back(int32_t(w * 32 + size_t(__builtin_ctz(bits))));
        if (ids.empty()) {
            ADD_FAILURE() << "empty mask after: " << text;
            return text;
        }
        int32_t pick = -1;
        // Past the free steps: half the time the best closer (a closer may also be content, e.g.
        // '}' inside an e-mail address, so never only closers).
        if (step >= free_steps && (rng() & 1)) {
            if (m.is_completed()) pick = v.eos[0];
            for (size_t k = 0; pick < 0 && k < closer_ids.size(); ++k)
                if (allowed(mask, closer_ids[k])) pick = closer_ids[k];
        }
        if (pick < 0) pick = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
        bool is_eos = std::find(v.eos.begin(), v.eos.end(), pick) != v.eos.end();
        if (!m.accept_token(pick)) {
            ADD_FAILURE() << "the mask allowed token " << pick << " but accept_token refused it after: " << text;
            return text;
        }
        if (is_eos) {
            EXPECT_TRUE(m.is_terminated());
            return text;
        }
        text += v.tokens[size_t(pick)];
    }
    ADD_FAILURE() << "walk did not end: " << text.substr(0, 400);
    return text;
}

// Checks `value` against the supported keywords of `schema`; returns "" or the first problem.
inline std::string check_schema(const nlohmann::ordered_json& value, const nlohmann::ordered_json& schema,
                                const nlohmann::ordered_json& root, bool strict = true) {
    using J = nlohmann::ordered_json;
    if (schema.is_boolean()) return schema.get<bool>() ? "" : "false schema";
    if (schema.contains("$ref")) {
        std::string r = schema["$ref"];
        const J& target = r == "#" ? root : root.at(J::json_pointer(r.substr(1)));
        return check_schema(value, target, root, strict);
    }
    if (schema.contains("allOf"))
        for (const J& s : schema["allOf"])
            if (auto e = check_schema(value, s, root, false); !e.empty()) return "allOf: " + e;
    for (const char* key : {"anyOf", "oneOf"}) {
        if (!schema.contains(key)) continue;
        bool any = false;
        for (const J& s : schema[key]) any |= check_schema(value, s, root, false).empty();
        if (!any) return std::string(key) + ": no branch matches " + value.dump();
    }
    if (schema.contains("const") && value != schema["const"]) return "const";
    if (schema.contains("enum") &&
        std::find(schema["enum"].begin(), schema["enum"].end(), value) == schema["enum"].end())
        return "enum: " + value.dump();
    if (schema.contains("type")) {
        std::vector<std::string> types;
        if (schema["type"].is_string())
            types.push_back(schema["type"]);
        else
            for (const J& t : schema["type"]) types.push_back(t);
        bool ok = false;
        for (const auto& t : types) {
            ok |= (t == "object" && value.is_object()) || (t == "array" && value.is_array()) ||
                  (t == "string" && value.is_string()) ||
                  (t == "integer" &&
                   (value.is_number_integer() ||
                    (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>()))) ||
                  (t == "number" && value.is_number()) || (t == "boolean" && value.is_boolean()) ||
                  (t == "null" && value.is_null());
        }
        if (!ok) return "type: " + value.dump() + " is not " + schema["type"].dump();
    }
    if (value.is_object()) {
        if (schema.contains("required"))
            for (const J& r : schema["required"])
                if (!value.contains(r.get<std::string>())) return "required: " + r.get<std::string>();
        for (auto& [k, v] : value.items()) {
            if (schema.contains("properties") && schema["properties"].contains(k)) {
                if (auto e = check_schema(v, schema["properties"][k], root, strict); !e.empty()) return k + ": " + e;
            } else if (schema.contains("additionalProperties")) {
                if (schema["additionalProperties"] == false) return "additional property " + k;
                if (auto e = check_schema(v, schema["additionalProperties"], root, strict); !e.empty())
                    return k + ": " + e;
            } else if (strict && !schema.contains("anyOf") && !schema.contains("oneOf") && !schema.contains("allOf") &&
                       (schema.contains("properties") || schema.contains("required"))) {
                bool in_required =
                    schema.contains("required") &&
                    std::find(schema["required"].begin(), schema["required"].end(), k) != schema["required"].end();
                if (!in_required) return "unexpected property " + k;
            }
        }
    }
    if (value.is_array()) {
        size_t k = schema.contains("prefixItems") ? schema["prefixItems"].size() : 0;
        for (size_t i = 0; i < value.size(); ++i) {
            const J* s = nullptr;
            if (i < k)
                s = &schema["prefixItems"][i];
            else if (schema.contains("items"))
                s = &schema["items"];
            if (s)
                if (auto e = check_schema(value[i], *s, root, strict); !e.empty())
                    return "[" + std::to_string(i) + "]: " + e;
        }
        if (schema.contains("minItems") && value.size() < schema["minItems"].get<size_t>()) return "minItems";
        if (schema.contains("maxItems") && value.size() > schema["maxItems"].get<size_t>()) return "maxItems";
    }
    if (value.is_string()) {
        std::string s = value;
        size_t chars = 0;
        for (unsigned char c : s) chars += (c & 0xC0) != 0x80;
        if (schema.contains("minLength") && chars < schema["minLength"].get<size_t>())
            return "minLength: " + value.dump();
        if (schema.contains("maxLength") && chars > schema["maxLength"].get<size_t>())
            return "maxLength: " + value.dump();
        if (schema.contains("pattern")) {
            bool ascii = std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; });
            if (ascii &&
                !std::regex_search(s, std::regex(schema["pattern"].get<std::string>(), std::regex::ECMAScript)))
                return "pattern: " + value.dump();
        }
    }
    if (value.is_number()) {
        double x = value.get<double>();
        if (schema.contains("minimum") && x < schema["minimum"].get<double>()) return "minimum: " + value.dump();
        if (schema.contains("maximum") && x > schema["maximum"].get<double>()) return "maximum: " + value.dump();
        if (schema.contains("exclusiveMinimum") && schema["exclusiveMinimum"].is_number() &&
            x <= schema["exclusiveMinimum"].get<double>())
            return "exclusiveMinimum: " + value.dump();
        if (schema.contains("exclusiveMaximum") && schema["exclusiveMaximum"].is_number() &&
            x >= schema["exclusiveMaximum"].get<double>())
            return "exclusiveMaximum: " + value.dump();
    }
    return "";
}

// `g` compiled and tokenized over `v`, as the engine's structured output does.
inline std::shared_ptr<const TokenizedGrammar> tokenized(const Grammar& g, std::shared_ptr<const VocabIndex> v) {
    return std::make_shared<const TokenizedGrammar>(compile_grammar(g), std::move(v));
}

}  // namespace peregrine::grammar::testing
