#include "cli/config.h"

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

namespace peregrine::cli {

namespace {

[[noreturn]] void config_error(const std::string& msg) {
    throw CLI::ConfigError(msg, 1);
}

// A cursor over the file text that knows its line number.
class TomlParser {
  public:
    TomlParser(std::string_view text, const std::string& source) : s_(text), source_(source) {}

    std::vector<TomlEntry> parse() {
        std::vector<TomlEntry> out;
        while (true) {
            skip_blank_lines();
            if (at_end()) break;
            if (peek() == '[') fail("tables ([section]) are not supported; put every key at the top level");
            TomlEntry e;
            e.line = line_;
            e.key = parse_key();
            skip_spaces();
            if (at_end() || peek() != '=') fail("expected '=' after key '" + e.key + "'");
            ++pos_;
            skip_spaces();
            e.value = parse_value(true);
            skip_spaces();
            if (!at_end() && peek() == '#') skip_comment();
            if (!at_end() && peek() != '\n' && peek() != '\r')
                fail("unexpected text after the value of '" + e.key + "'");
            out.push_back(std::move(e));
        }
        return out;
    }

  private:
    [[noreturn]] void fail(const std::string& msg) const {
        config_error(source_ + ":" + std::to_string(line_) + ": " + msg);
    }
    bool at_end() const { return pos_ >= s_.size(); }
    char peek() const { return s_[pos_]; }
    void skip_spaces() {
        while (!at_end() && (peek() == ' ' || peek() == '\t')) ++pos_;
    }
    void skip_comment() {
        while (!at_end() && peek() != '\n') ++pos_;
    }
    // Whitespace, newlines and comments (between entries, and inside arrays).
    void skip_blank_lines() {
        while (!at_end()) {
            const char c = peek();
            if (c == '\n') {
                ++line_;
                ++pos_;
            } else if (c == ' ' || c == '\t' || c == '\r') {
                ++pos_;
            } else if (c == '#') {
                skip_comment();
            } else {
                break;
            }
        }
    }

    std::string parse_key() {
        if (peek() == '"' || peek() == '\'') return parse_string();
        const size_t start = pos_;
        while (!at_end() && (std::isalnum(static_cast<unsigned char>(peek())) || peek() == '-' || peek() == '_'))
            ++pos_;
        if (pos_ == start) fail(std::string("expected a key, found '") + peek() + "'");
        if (!at_end() && peek() == '.') fail("dotted keys are not supported");
        return std::string(s_.substr(start, pos_ - start));
    }

    static void append_utf8(std::string& out, uint32_t cp) {
        if (cp < 0x80) {
            out += static_cast<char>(cp);
        } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
            out += static_cast<char>(0xF0 | (cp >> 18));
            out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        }
    }

    // A basic ("...", with escapes) or literal ('...') single-line string.
    std::string parse_string() {
        const char quote = peek();
        ++pos_;
        std::string out;
        while (true) {
            if (at_end() || peek() == '\n') fail("unterminated string");
            const char c = s_[pos_++];
            if (c == quote) return out;
            if (c != '\\' || quote == '\'') {
                out += c;
                continue;
            }
            if (at_end()) fail("unterminated string");
            const char e = s_[pos_++];
            switch (e) {
                case '"':
                    out += '"';
                    break;
                case '\\':
                    out += '\\';
                    break;
                case 'n':
                    out += '\n';
                    break;
                case 't':
                    out += '\t';
                    break;
                case 'r':
                    out += '\r';
                    break;
                case 'b':
                    out += '\b';
                    break;
                case 'f':
                    out += '\f';
                    break;
                case 'u':
                case 'U': {
                    const size_t n = e == 'u' ? 4 : 8;
                    if (pos_ + n > s_.size()) fail("bad \\" + std::string(1, e) + " escape");
                    uint32_t cp = 0;
                    for (size_t i = 0; i < n; ++i) {
                        const char h = s_[pos_++];
                        if (!std::isxdigit(static_cast<unsigned char>(h)))
                            fail("bad \\" + std::string(1, e) + " escape");
                        cp = cp * 16 +
                             static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                       ? h - '0'
                                                       : std::tolower(static_cast<unsigned char>(h)) - 'a' + 10);
                    }
                    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail("bad unicode escape");
                    append_utf8(out, cp);
                    break;
                }
                default:
                    fail(std::string("unknown escape \\") + e + " in a string");
            }
        }
    }

    TomlValue parse_value(bool allow_array) {
        if (at_end() || peek() == '\n' || peek() == '#') fail("missing value");
        TomlValue v;
        const char c = peek();
        if (c == '"' || c == '\'') {
            if (s_.substr(pos_, 3) == "\"\"\"" || s_.substr(pos_, 3) == "'''")
                fail("multi-line strings are not supported");
            v.kind = TomlValue::Kind::String;
            v.text = parse_string();
            return v;
        }
        if (c == '[') {
            if (!allow_array) fail("nested arrays are not supported");
            ++pos_;
            v.kind = TomlValue::Kind::Array;
            while (true) {
                skip_blank_lines();
                if (at_end()) fail("unterminated array");
                if (peek() == ']') {
                    ++pos_;
                    return v;
                }
                v.items.push_back(parse_value(false));
                skip_blank_lines();
                if (at_end()) fail("unterminated array");
                if (peek() == ',') {
                    ++pos_;
                } else if (peek() != ']') {
                    fail("expected ',' or ']' in an array");
                }
            }
        }
        if (c == '{') fail("inline tables are not supported");
        // A bare word: boolean or number.
        const size_t start = pos_;
        while (!at_end() && peek() != ',' && peek() != ']' && peek() != '#' && peek() != '\n' && peek() != ' ' &&
               peek() != '\t' && peek() != '\r')
            ++pos_;
        const std::string word(s_.substr(start, pos_ - start));
        if (word == "true" || word == "false") {
            v.kind = TomlValue::Kind::Boolean;
            v.text = word;
            return v;
        }
        std::string digits;
        for (size_t i = 0; i < word.size(); ++i) {
            if (word[i] != '_') {
                digits += word[i];
            } else if (i == 0 || i + 1 == word.size() || !std::isdigit(static_cast<unsigned char>(word[i - 1])) ||
                       !std::isdigit(static_cast<unsigned char>(word[i + 1]))) {
                fail("invalid value '" + word + "'");
            }
        }
        size_t i = (!digits.empty() && (digits[0] == '+' || digits[0] == '-')) ? 1 : 0;
        const size_t int_start = i;
        while (i < digits.size() && std::isdigit(static_cast<unsigned char>(digits[i]))) ++i;
        if (i == int_start) fail("invalid value '" + word + "' (strings need quotes)");
        if (i == digits.size()) {
            v.kind = TomlValue::Kind::Integer;
            v.text = digits[0] == '+' ? digits.substr(1) : digits;
            return v;
        }
        // A float: the rest must be a fraction and/or exponent.
        char* end = nullptr;
        std::strtod(digits.c_str(), &end);
        if (end != digits.c_str() + digits.size() || digits.find_first_of("xXnN") != std::string::npos)
            fail("invalid value '" + word + "' (strings need quotes)");
        v.kind = TomlValue::Kind::Float;
        v.text = digits;
        return v;
    }

    std::string_view s_;
    const std::string& source_;
    size_t pos_ = 0;
    int line_ = 1;
};

const char* kind_name(TomlValue::Kind k) {
    switch (k) {
        case TomlValue::Kind::String:
            return "a string";
        case TomlValue::Kind::Integer:
            return "an integer";
        case TomlValue::Kind::Float:
            return "a float";
        case TomlValue::Kind::Boolean:
            return "a boolean";
        case TomlValue::Kind::Array:
            return "an array";
    }
    return "a value";
}

bool is_flag(const CLI::Option* op) {
    return op->get_expected_min() == 0;
}
bool is_list(const CLI::Option* op) {
    return op->get_expected_max() > 1;
}

// The values of a file entry for `op` as CLI11 strings; throws on a type mismatch.
std::vector<std::string> file_values(const CLI::Option* op, const TomlEntry& e, const std::string& where) {
    std::vector<const TomlValue*> scalars;
    if (e.value.kind == TomlValue::Kind::Array) {
        if (!is_list(op)) config_error(where + ": expected a single value, got an array");
        for (const TomlValue& v : e.value.items) scalars.push_back(&v);
    } else {
        scalars.push_back(&e.value);
    }
    const std::string type = op->get_type_name();
    std::vector<std::string> out;
    for (const TomlValue* v : scalars) {
        bool ok = true;
        const char* want = "";
        if (is_flag(op)) {
            ok = v->kind == TomlValue::Kind::Boolean;
            want = "a boolean";
        } else if (type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0) {
            ok = v->kind == TomlValue::Kind::Integer;
            want = "an integer";
        } else if (type.rfind("FLOAT", 0) == 0) {
            ok = v->kind == TomlValue::Kind::Integer || v->kind == TomlValue::Kind::Float;
            want = "a number";
        } else if (type.rfind("TEXT", 0) == 0) {
            ok = v->kind == TomlValue::Kind::String;
            want = "a string";
        }
        if (!ok) config_error(where + ": expected " + want + ", got " + kind_name(v->kind));
        out.push_back(v->text);
    }
    return out;
}

// Checks that a value from the environment looks like a number where `op` takes one (CLI11's
// range checks run before conversion and would report "abc" as out of range).
void check_text_value(const CLI::Option* op, const std::string& v, const std::string& where) {
    const std::string type = op->get_type_name();
    const bool want_int = type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0;
    const bool want_float = type.rfind("FLOAT", 0) == 0;
    if (!want_int && !want_float) return;
    const std::string t = CLI::detail::trim_copy(v);
    char* end = nullptr;
    if (want_int)
        std::strtoll(t.c_str(), &end, 10);
    else
        std::strtod(t.c_str(), &end);
    if (t.empty() || end != t.c_str() + t.size())
        config_error(where + ": expected " + (want_int ? "an integer" : "a number") + ", got '" + v + "'");
}

// Gives `op` its value(s) from a configuration layer, converting and validating them as the
// command line would; errors name `where`.
void give(CLI::Option* op, const std::string& name, const std::vector<std::string>& values, const std::string& where) {
    try {
        if (is_flag(op)) {
            if (values.size() != 1) config_error(where + ": expected one boolean");
            op->add_result(op->get_flag_value(name, values[0]));
        } else {
            op->add_result(values);
        }
        op->run_callback();
    } catch (const CLI::ConfigError&) {
        throw;
    } catch (const CLI::Error& e) {
        config_error(where + ": " + e.what());
    }
}

}  // namespace

std::vector<TomlEntry> parse_toml(std::string_view text, const std::string& source) {
    return TomlParser(text, source).parse();
}

std::string env_var_name(std::string_view long_name, std::string_view prefix) {
    std::string out(prefix);
    for (char c : long_name) out += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return out;
}

void apply_config_layers(CLI::App& cmd, const std::string& config_file, const std::string& env_prefix) {
    std::vector<CLI::Option*> options = cmd.get_options([&](CLI::Option* op) {
        return op != cmd.get_help_ptr() && op != cmd.get_help_all_ptr() && !op->get_lnames().empty() &&
               op->get_lnames()[0] != "config" && op->get_configurable();
    });
    auto find = [&](const std::string& key) -> CLI::Option* {
        for (CLI::Option* op : options)
            for (const std::string& n : op->get_lnames())
                if (n == key) return op;
        return nullptr;
    };

    std::map<std::string, const TomlEntry*> by_key;
    std::vector<TomlEntry> entries;
    if (!config_file.empty()) {
        std::ifstream in(config_file, std::ios::binary);
        if (!in) config_error("cannot read the config file " + config_file);
        std::ostringstream text;
        text << in.rdbuf();
        entries = parse_toml(text.str(), config_file);
        std::map<CLI::Option*, const TomlEntry*> seen;
        for (const TomlEntry& e : entries) {
            CLI::Option* op = find(e.key);
            const std::string where = config_file + ":" + std::to_string(e.line);
            if (op == nullptr)
                config_error(where + ": unknown key '" + e.key + "' (no option --" + e.key + " in `" +
                             cmd.get_display_name() + "`)");
            if (auto it = seen.find(op); it != seen.end())
                config_error(where + ": '" + e.key + "' repeats line " + std::to_string(it->second->line));
            seen[op] = &e;
            by_key[e.key] = &e;
        }
    }

    for (CLI::Option* op : options) {
        if (op->count() > 0) continue;  // the command line wins
        bool done = false;
        for (const std::string& name : op->get_lnames()) {
            const std::string var = env_var_name(name, env_prefix);
            const char* env = std::getenv(var.c_str());
            if (env == nullptr || *env == '\0') continue;
            std::vector<std::string> values;
            if (is_list(op)) {
                std::stringstream ss(env);
                for (std::string item; std::getline(ss, item, ',');)
                    if (!CLI::detail::trim(item).empty()) values.push_back(item);
                if (values.empty()) continue;
            } else {
                values.push_back(env);
            }
            for (const std::string& v : values) check_text_value(op, v, "environment variable " + var);
            give(op, name, values, "environment variable " + var);
            done = true;
            break;
        }
        if (done) continue;
        for (const std::string& name : op->get_lnames()) {
            auto it = by_key.find(name);
            if (it == by_key.end()) continue;
            const TomlEntry& e = *it->second;
            const std::string where = config_file + ":" + std::to_string(e.line) + ": " + e.key;
            give(op, name, file_values(op, e, where), where);
            break;
        }
    }
}

void add_config_layers(CLI::App* cmd, std::string env_prefix) {
    auto path = std::make_shared<std::string>();
    CLI::Option* opt = cmd->add_option(
        "--config", *path,
        "TOML file of option values, keyed by long option name (port = 8000, api-key = [\"k1\"]); also $" +
            env_var_name("config", env_prefix));
    cmd->footer("Every option can also be set with " + env_prefix +
                "<NAME> (upper case, - as _, lists comma-separated) or in the --config file; the command line wins "
                "over the environment, which wins over the file.\n");
    cmd->callback([cmd, opt, path, env_prefix] {
        std::string file = *path;
        if (opt->count() == 0) {
            const char* env = std::getenv(env_var_name("config", env_prefix).c_str());
            if (env != nullptr) file = env;
        }
        apply_config_layers(*cmd, file, env_prefix);
    });
}

}  // namespace peregrine::cli
