#include "grammar/json_schema.h"

#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "grammar/number_range.h"
#include "grammar/regex.h"
#include "grammar/utf8.h"

namespace peregrine::grammar {

namespace {

using Json = nlohmann::ordered_json;

const std::set<std::string> kAnnotations = {"title",    "description", "default",  "examples",
                                            "$schema",  "$id",         "$comment", "deprecated",
                                            "readOnly", "writeOnly",   "$defs",    "definitions"};
const std::set<std::string> kKeywords = {
    "type",    "enum",        "const",    "properties", "required",         "additionalProperties",
    "items",   "prefixItems", "minItems", "maxItems",   "minLength",        "maxLength",
    "pattern", "format",      "minimum",  "maximum",    "exclusiveMinimum", "exclusiveMaximum",
    "anyOf",   "oneOf",       "allOf",    "$ref",       "uniqueItems"};

// Regexes for `format`, matched inside the quotes (JSON-string mode, so no escapes arise).
const std::map<std::string, std::string> kFormats = {
    {"date", R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))"},
    {"time", R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))"},
    {"date-time",
     R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))"},
    {"uuid", R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"},
    {"email",
     R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+)"},
    {"ipv4", R"(((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))"},
    {"hostname", R"([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*)"},
    // RFC 3986: a scheme, then unreserved, reserved (but the IP-literal brackets) or
    // percent-encoded characters only (a non-ASCII character must be percent-encoded).
    {"uri", R"([A-Za-z][A-Za-z0-9+.-]*:([A-Za-z0-9\-._~:/?#@!$&'()*+,;=]|%[0-9A-Fa-f]{2})+)"},
};

std::string escape_pointer_token(std::string s) {
    std::string out;
    for (char c : s) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
    return out;
}

class Compiler {
  public:
    Compiler(const Json& root, const JsonSchemaOptions& o) : root_(root), o_(o) {
        ByteSet blank;
        for (char c : {' ', '\t', '\n', '\r'}) blank.set(uint8_t(c));
        ws_ = o.max_whitespace > 0 ? g_.repeat(g_.bytes(blank), 0, o.max_whitespace) : g_.empty();
        sep_ = g_.seq({ws_, g_.literal(","), ws_});
        colon_ = g_.seq({ws_, g_.literal(":"), ws_});
    }

    Grammar run() {
        g_.root = g_.add_rule("root");
        g_.rules[size_t(g_.root)].body = compile(root_, "#");
        return std::move(g_);
    }

    Grammar any_object() {
        g_.root = g_.add_rule("root");
        g_.rules[size_t(g_.root)].body = generic_object(g_.ref(value_rule()));
        return std::move(g_);
    }

  private:
    [[noreturn]] void unsupported(const std::string& keyword, const std::string& path, const std::string& why = "") {
        fail("JSON schema: unsupported keyword '", keyword, "' at ", path, why.empty() ? "" : " (" + why + ")");
    }
    [[noreturn]] void invalid(const std::string& path, const std::string& what) {
        fail("JSON schema: invalid schema at ", path, ": ", what);
    }

    // --- generic JSON ----------------------------------------------------------------------

    int string_char() {
        if (string_char_ >= 0) return string_char_;
        int plain = utf8_class(g_, {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodePoint}});
        ByteSet simple;
        for (char c : std::string("\"\\/bfnrt")) simple.set(uint8_t(c));
        // \uXXXX, surrogates excluded (a lone one is not valid Unicode; many parsers refuse it).
        int hex = g_.alt({g_.byte_range('0', '9'), g_.byte_range('a', 'f'), g_.byte_range('A', 'F')});
        int hex3 = g_.repeat(hex, 3, 3);
        int no_sur = g_.alt(
            {g_.seq({g_.alt({g_.byte_range('0', '9'), g_.byte_range('a', 'c'), g_.byte_range('A', 'C'),
                             g_.byte_range('e', 'f'), g_.byte_range('E', 'F')}),
                     hex3}),
             g_.seq({g_.alt({g_.literal("d"), g_.literal("D")}), g_.byte_range('0', '7'), g_.repeat(hex, 2, 2)})});
        int escape = g_.seq({g_.literal("\\"), g_.alt({g_.bytes(simple), g_.seq({g_.literal("u"), no_sur})})});
        string_char_ = g_.alt({plain, escape});
        return string_char_;
    }
    int quoted(int body) { return g_.seq({g_.literal("\""), body, g_.literal("\"")}); }
    int any_string() { return quoted(g_.star(string_char())); }
    int any_number() {
        int digits = g_.plus(g_.byte_range('0', '9'));
        // At most 16 integer digits (as llama.cpp's schema grammars): a longer one, or one times
        // the exponent, may overflow a double (JSON.parse gives Infinity, not a number).
        int integer = g_.seq(
            {g_.opt(g_.literal("-")),
             g_.alt({g_.literal("0"), g_.seq({g_.byte_range('1', '9'), g_.repeat(g_.byte_range('0', '9'), 0, 15)})})});
        int frac = g_.opt(g_.seq({g_.literal("."), digits}));
        // At most two exponent digits: larger exponents overflow a double in common parsers.
        int exp = g_.opt(
            g_.seq({g_.alt({g_.literal("e"), g_.literal("E")}), g_.opt(g_.alt({g_.literal("+"), g_.literal("-")})),
                    g_.repeat(g_.byte_range('0', '9'), 1, 2)}));
        return g_.seq({integer, frac, exp});
    }
    int generic_object(int value) {
        int member = g_.seq({any_string(), colon_, value});
        int members = g_.seq({member, g_.star(g_.seq({sep_, member}))});
        return g_.seq({g_.literal("{"), ws_, g_.opt(members), ws_, g_.literal("}")});
    }
    int generic_array(int value) {
        int items = g_.seq({value, g_.star(g_.seq({sep_, value}))});
        return g_.seq({g_.literal("["), ws_, g_.opt(items), ws_, g_.literal("]")});
    }
    // The rule `json_value`: any JSON value (recursive through objects and arrays).
    int value_rule() {
        if (value_rule_ >= 0) return value_rule_;
        value_rule_ = g_.add_rule("json_value");
        int self = g_.ref(value_rule_);
        g_.rules[size_t(value_rule_)].body =
            g_.alt({generic_object(self), generic_array(self), any_string(), any_number(), g_.literal("true"),
                    g_.literal("false"), g_.literal("null")});
        return value_rule_;
    }
    int any_value() { return g_.ref(value_rule()); }

    // --- schemas -----------------------------------------------------------------------------

    int compile(const Json& s, const std::string& path) {
        if (g_.exprs.size() > o_.max_exprs) fail("JSON schema too large: over ", o_.max_exprs, " grammar expressions");
        if (s.is_boolean()) {
            if (s.get<bool>()) return any_value();
            invalid(path, "the schema 'false' matches nothing");
        }
        if (!s.is_object()) invalid(path, "a schema must be an object or a boolean");
        for (auto& [k, v] : s.items()) {
            (void)v;
            if (!kAnnotations.count(k) && !kKeywords.count(k)) unsupported(k, path);
        }
        if (s.contains("$ref")) {
            for (auto& [k, v] : s.items())
                if (k != "$ref" && !kAnnotations.count(k))
                    unsupported(k, path, "keywords beside $ref; put them in an allOf");
            return compile_ref(s["$ref"], path);
        }
        if (s.contains("allOf")) {
            Json merged = s;
            merged.erase("allOf");
            const Json& all = s["allOf"];
            if (!all.is_array() || all.empty()) invalid(path + "/allOf", "must be a non-empty array");
            for (size_t i = 0; i < all.size(); ++i) merged = merge(merged, resolve_refs(all[i], path), path + "/allOf");
            return compile(merged, path);
        }
        for (const char* key : {"anyOf", "oneOf"}) {
            if (!s.contains(key)) continue;
            const Json& list = s[key];
            if (!list.is_array() || list.empty()) invalid(path + "/" + key, "must be a non-empty array");
            Json rest = s;
            rest.erase(key);
            bool has_rest = false;
            for (auto& [k, v] : rest.items()) has_rest |= (void(v), !kAnnotations.count(k));
            std::vector<int> alts;
            for (size_t i = 0; i < list.size(); ++i) {
                std::string p = path + "/" + key + "/" + std::to_string(i);
                alts.push_back(has_rest ? compile(merge(rest, resolve_refs(list[i], p), p), p) : compile(list[i], p));
            }
            return g_.alt(std::move(alts));
        }
        if (s.contains("const")) return g_.literal(s["const"].dump());
        if (s.contains("enum")) {
            const Json& list = s["enum"];
            if (!list.is_array() || list.empty()) invalid(path + "/enum", "must be a non-empty array");
            std::vector<int> alts;
            for (const Json& v : list) alts.push_back(g_.literal(v.dump()));
            return g_.alt(std::move(alts));
        }
        std::vector<std::string> types;
        if (s.contains("type")) {
            const Json& t = s["type"];
            if (t.is_string()) {
                types.push_back(t.get<std::string>());
            } else if (t.is_array() && !t.empty()) {
                for (const Json& x : t) {
                    if (!x.is_string()) invalid(path + "/type", "type names must be strings");
                    types.push_back(x.get<std::string>());
                }
            } else {
                invalid(path + "/type", "must be a string or a non-empty array of strings");
            }
        } else {
            types.push_back(infer_type(s));
        }
        std::vector<int> alts;
        for (const std::string& t : types) alts.push_back(compile_type(t, s, path));
        return g_.alt(std::move(alts));
    }

    static std::string infer_type(const Json& s) {
        for (const char* k : {"properties", "required", "additionalProperties"})
            if (s.contains(k)) return "object";
        for (const char* k : {"items", "prefixItems", "minItems", "maxItems", "uniqueItems"})
            if (s.contains(k)) return "array";
        for (const char* k : {"minLength", "maxLength", "pattern", "format"})
            if (s.contains(k)) return "string";
        for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
            if (s.contains(k)) return "number";
        return "any";
    }

    int compile_type(const std::string& t, const Json& s, const std::string& path) {
        if (t == "any") return any_value();
        if (t == "null") return g_.literal("null");
        if (t == "boolean") return g_.alt({g_.literal("true"), g_.literal("false")});
        if (t == "string") return compile_string(s, path);
        if (t == "integer") return compile_integer(s, path);
        if (t == "number") return compile_number(s, path);
        if (t == "object") return compile_object(s, path);
        if (t == "array") return compile_array(s, path);
        invalid(path + "/type", "unknown type '" + t + "'");
    }

    int compile_string(const Json& s, const std::string& path) {
        if (s.contains("format")) {
            std::string f = s["format"].get<std::string>();
            auto it = kFormats.find(f);
            if (it == kFormats.end()) unsupported("format", path, "format '" + f + "' is not supported");
            return quoted(regex_expr(g_, it->second, RegexOptions{.json_string = true}));
        }
        if (s.contains("pattern")) {
            if (s.contains("minLength") || s.contains("maxLength"))
                unsupported("minLength", path, "length bounds together with pattern");
            if (!s["pattern"].is_string()) invalid(path + "/pattern", "must be a string");
            std::string p = s["pattern"].get<std::string>();
            if (!p.empty() && p.back() == '$' && (p.size() < 2 || p[p.size() - 2] != '\\')) p.pop_back();
            if (!p.empty() && p[0] == '^') p.erase(0, 1);
            return quoted(regex_expr(g_, p, RegexOptions{.json_string = true}));
        }
        int min = count(s, "minLength", path).value_or(0);
        std::optional<int> max = count(s, "maxLength", path);
        if (max && *max < min) invalid(path, "maxLength < minLength");
        return quoted(g_.repeat(string_char(), min, max ? *max : kUnbounded));
    }

    std::optional<int> count(const Json& s, const char* key, const std::string& path) {
        if (!s.contains(key)) return std::nullopt;
        const Json& v = s[key];
        if (!v.is_number_integer() || v.get<int64_t>() < 0) invalid(path + "/" + key, "must be a non-negative integer");
        if (v.get<int64_t>() > 100000) fail("JSON schema: '", key, "' at ", path, " is over 100000 (size cap)");
        return int(v.get<int64_t>());
    }

    // Bounds as (value, open); draft 4's boolean exclusiveMinimum/Maximum modify minimum/maximum.
    void bounds(const Json& s, const std::string& path, std::optional<double>& lo, bool& lo_open,
                std::optional<double>& hi, bool& hi_open) {
        auto num = [&](const char* k) {
            if (!s[k].is_number()) invalid(path + "/" + k, "must be a number");
            return s[k].get<double>();
        };
        if (s.contains("minimum")) lo = num("minimum");
        if (s.contains("maximum")) hi = num("maximum");
        if (s.contains("exclusiveMinimum")) {
            if (s["exclusiveMinimum"].is_boolean()) {
                lo_open = s["exclusiveMinimum"].get<bool>();
            } else {
                double v = num("exclusiveMinimum");
                if (!lo || v >= *lo) lo = v, lo_open = true;
            }
        }
        if (s.contains("exclusiveMaximum")) {
            if (s["exclusiveMaximum"].is_boolean()) {
                hi_open = s["exclusiveMaximum"].get<bool>();
            } else {
                double v = num("exclusiveMaximum");
                if (!hi || v <= *hi) hi = v, hi_open = true;
            }
        }
    }

    int compile_integer(const Json& s, const std::string& path) {
        std::optional<double> lo, hi;
        bool lo_open = false, hi_open = false;
        bounds(s, path, lo, lo_open, hi, hi_open);
        std::optional<int64_t> a, b;
        if (lo && std::fabs(*lo) <= 1e18) a = int64_t(lo_open ? std::floor(*lo) + 1 : std::ceil(*lo));
        if (hi && std::fabs(*hi) <= 1e18) b = int64_t(hi_open ? std::ceil(*hi) - 1 : std::floor(*hi));
        if (a && b && *a > *b) invalid(path, "the integer range is empty");
        return integer_range(g_, a, b);
    }

    int compile_number(const Json& s, const std::string& path) {
        std::optional<double> lo, hi;
        bool lo_open = false, hi_open = false;
        bounds(s, path, lo, lo_open, hi, hi_open);
        if (!lo && !hi) return any_number();
        return number_range(g_, lo, lo_open, hi, hi_open);
    }

    int compile_object(const Json& s, const std::string& path) {
        std::vector<std::string> names;
        std::vector<const Json*> schemas;
        if (s.contains("properties")) {
            if (!s["properties"].is_object()) invalid(path + "/properties", "must be an object");
            for (auto& [k, v] : s["properties"].items()) {
                names.push_back(k);
                schemas.push_back(&v);
            }
        }
        // The schema of keys not listed: nullptr = none allowed.
        static const Json kTrue = true;
        const Json* extra = o_.strict_properties ? nullptr : &kTrue;
        if (s.contains("additionalProperties")) {
            const Json& ap = s["additionalProperties"];
            if (ap.is_boolean())
                extra = ap.get<bool>() ? &kTrue : nullptr;
            else
                extra = &ap;
        }
        std::set<std::string> required;
        if (s.contains("required")) {
            if (!s["required"].is_array()) invalid(path + "/required", "must be an array");
            for (const Json& r : s["required"]) {
                if (!r.is_string()) invalid(path + "/required", "names must be strings");
                std::string name = r.get<std::string>();
                required.insert(name);
                if (std::find(names.begin(), names.end(), name) == names.end()) {
                    names.push_back(name);
                    schemas.push_back(extra ? extra : &kTrue);
                }
            }
        }
        std::vector<int> items;
        std::vector<bool> req;
        for (size_t i = 0; i < names.size(); ++i) {
            std::string p = path + "/properties/" + escape_pointer_token(names[i]);
            items.push_back(g_.seq({g_.literal(Json(names[i]).dump()), colon_, compile(*schemas[i], p)}));
            req.push_back(required.count(names[i]) > 0);
        }
        int tail = -1;
        if (extra) tail = g_.seq({any_string(), colon_, compile(*extra, path + "/additionalProperties")});
        int body = g_.subset(std::move(items), std::move(req), sep_, tail);
        return g_.seq({g_.literal("{"), ws_, body, ws_, g_.literal("}")});
    }

    int compile_array(const Json& s, const std::string& path) {
        if (s.contains("uniqueItems") && s["uniqueItems"] == true) unsupported("uniqueItems", path);
        std::vector<int> prefix;
        if (s.contains("prefixItems")) {
            if (!s["prefixItems"].is_array()) invalid(path + "/prefixItems", "must be an array");
            for (size_t i = 0; i < s["prefixItems"].size(); ++i)
                prefix.push_back(compile(s["prefixItems"][i], path + "/prefixItems/" + std::to_string(i)));
        }
        int min = count(s, "minItems", path).value_or(0);
        std::optional<int> max = count(s, "maxItems", path);
        int item = -1;  // the schema after the prefix; -1: none allowed
        if (!s.contains("items") || s["items"] != false) {
            if (s.contains("items") && s["items"].is_array())
                unsupported("items", path, "an array of schemas; use prefixItems");
            item = s.contains("items") ? compile(s["items"], path + "/items") : any_value();
        }
        int k = int(prefix.size());
        if (item < 0) max = max ? std::min(*max, k) : k;
        if (max && *max < min) invalid(path, "maxItems < minItems (or items: false with fewer prefixItems)");
        if (max) k = std::min(k, *max);
        if (max && *max == 0) return g_.seq({g_.literal("["), ws_, g_.literal("]")});
        // rest(i): the elements from index i on, each preceded by a separator.
        auto tail = [&](int from) {  // elements of `item` at indexes from.. (count within bounds)
            int lo = std::max(0, min - from);
            int hi = max ? *max - from : kUnbounded;
            if (item < 0 || (hi != kUnbounded && hi <= 0)) return g_.empty();
            return g_.repeat(g_.seq({sep_, item}), lo, hi);
        };
        int rest = tail(k);
        for (int i = k - 1; i >= 1; --i) {
            int step = g_.seq({sep_, prefix[size_t(i)], rest});
            rest = i >= min ? g_.opt(step) : step;
        }
        int body;
        if (k >= 1) {
            body = g_.seq({prefix[0], rest});
        } else {
            body = g_.seq({item, tail(1)});
        }
        if (min == 0) body = g_.opt(body);
        return g_.seq({g_.literal("["), ws_, body, ws_, g_.literal("]")});
    }

    // --- $ref ----------------------------------------------------------------------------------

    const Json& resolve(const Json& ref, const std::string& path) {
        if (!ref.is_string()) invalid(path + "/$ref", "must be a string");
        std::string r = ref.get<std::string>();
        if (r.empty() || r[0] != '#') unsupported("$ref", path, "only local references (#...) are supported: " + r);
        try {
            return r == "#" ? root_ : root_.at(Json::json_pointer(r.substr(1)));
        } catch (const std::exception&) {
            invalid(path + "/$ref", "cannot resolve '" + r + "'");
        }
    }

    int compile_ref(const Json& ref, const std::string& path) {
        const Json& target = resolve(ref, path);
        std::string r = ref.get<std::string>();
        if (auto it = memo_.find(r); it != memo_.end()) return it->second;
        if (expanding_.count(r)) {  // recursion: this reference becomes a rule
            auto [it, added] = ref_rules_.emplace(r, -1);
            if (added) it->second = g_.add_rule("ref" + std::to_string(ref_rules_.size()) + ":" + r);
            return g_.ref(it->second);
        }
        expanding_.insert(r);
        int e = compile(target, r);
        expanding_.erase(r);
        if (auto it = ref_rules_.find(r); it != ref_rules_.end() && g_.rules[size_t(it->second)].body < 0)
            g_.rules[size_t(it->second)].body = e;
        memo_[r] = e;
        return e;
    }

    // allOf branches are merged as schemas, so their references are inlined (to a depth).
    Json resolve_refs(const Json& s, const std::string& path, int depth = 0) {
        if (!s.is_object() || !s.contains("$ref")) return s;
        if (depth > 16) unsupported("allOf", path, "recursive $ref inside allOf");
        Json rest = s;
        rest.erase("$ref");
        return merge(resolve_refs(resolve(s["$ref"], path), path, depth + 1), rest, path);
    }

    Json merge(const Json& a, const Json& b, const std::string& path) {
        if (a.is_boolean() || b.is_boolean()) {
            if (a == true) return b;
            if (b == true) return a;
            invalid(path, "allOf with the schema 'false' matches nothing");
        }
        Json out = a;
        for (auto& [k, v] : b.items()) {
            if (!out.contains(k) || kAnnotations.count(k)) {
                out[k] = v;
            } else if (k == "properties") {
                for (auto& [pk, pv] : v.items())
                    out[k][pk] =
                        out[k].contains(pk) ? merge(resolve_refs(out[k][pk], path), resolve_refs(pv, path), path) : pv;
            } else if (k == "required") {
                for (const Json& r : v)
                    if (std::find(out[k].begin(), out[k].end(), r) == out[k].end()) out[k].push_back(r);
            } else if (out[k] != v) {
                unsupported("allOf", path, "branches disagree on '" + k + "'");
            }
        }
        return out;
    }

    Grammar g_;
    const Json& root_;
    JsonSchemaOptions o_;
    int ws_ = -1, sep_ = -1, colon_ = -1;
    int string_char_ = -1;
    int value_rule_ = -1;
    std::set<std::string> expanding_;
    std::map<std::string, int> ref_rules_;
    std::map<std::string, int> memo_;
};

}  // namespace

Grammar compile_json_schema(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options) {
    return Compiler(schema, options).run();
}

Grammar compile_json_schema_text(std::string_view text, const JsonSchemaOptions& options) {
    nlohmann::ordered_json j;
    try {
        j = nlohmann::ordered_json::parse(text);
    } catch (const std::exception& e) {
        fail("JSON schema: not valid JSON: ", e.what());
    }
    return compile_json_schema(j, options);
}

Grammar compile_any_json_object(const JsonSchemaOptions& options) {
    static const nlohmann::ordered_json kEmpty = nlohmann::ordered_json::object();
    return Compiler(kEmpty, options).any_object();
}

}  // namespace peregrine::grammar
