// `peregrine tokenize` and `peregrine detokenize`: the tokenizer from the command line.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "model/loader.h"
#include "tokenizer/tokenizer.h"

namespace peregrine::cli {

namespace {

struct TokenizeArgs {
    std::string tokenizer;
    std::string text;
    bool raw = false;
    bool json = false;
    int bench = 0;
    bool per_line = false;
};

struct DetokenizeArgs {
    std::string tokenizer;
    std::string ids;
    bool keep_special = false;
    bool json = false;
};

std::string read_stdin() {
    std::ios::sync_with_stdio(false);
    return std::string(std::istreambuf_iterator<char>(std::cin), {});
}

Tokenizer load_tokenizer(const std::string& path) {
    return Tokenizer::load(path.empty() ? default_model_path() : path);
}

int run_tokenize(const TokenizeArgs& a) {
    const Tokenizer tok = load_tokenizer(a.tokenizer);
    const std::string text = a.text == "-" ? read_stdin() : a.text;
    // --raw: the fixtures' convention; otherwise what Hugging Face's tokenizer(text) does.
    const bool add_special = !a.raw, parse_special = !a.raw;
    if (a.bench > 0) {
        // The whole text as one string, or (--per-line) each line as its own encode() call.
        std::vector<std::string_view> lines;
        if (a.per_line) {
            for (size_t p = 0; p < text.size();) {
                const size_t e = std::min(text.find('\n', p), text.size());
                lines.push_back(std::string_view(text).substr(p, e - p));
                p = e + 1;
            }
        } else {
            lines.push_back(text);
        }
        size_t num_tokens = 0;
        double best = 1e30;
        for (int i = 0; i < a.bench; ++i) {
            const auto t0 = std::chrono::steady_clock::now();
            num_tokens = 0;
            for (std::string_view line : lines) num_tokens += tok.encode(line, add_special, parse_special).size();
            best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::printf("%zu bytes%s -> %zu tokens; best of %d: %.1f ms, %.2f MB/s (%s)\n", text.size(),
                    a.per_line ? " (one call per line)" : "", num_tokens, a.bench, best * 1e3, text.size() / best / 1e6,
                    tok.summary().c_str());
        return 0;
    }
    const std::vector<int32_t> ids = tok.encode(text, add_special, parse_special);
    if (a.json) {
        std::printf("%s\n", nlohmann::json({{"ids", ids}}).dump().c_str());
        return 0;
    }
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ' ';
        out += std::to_string(ids[i]);
    }
    out += '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
}

std::vector<int32_t> parse_id_list(const std::string& s) {
    std::vector<int32_t> ids;
    std::string item;
    auto flush = [&] {
        if (item.empty()) return;
        size_t used = 0;
        long long v = -1;
        try {
            v = std::stoll(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != item.size() || v < 0 || v > INT32_MAX) fail("'", item, "' is not a token id");
        ids.push_back(static_cast<int32_t>(v));
        item.clear();
    };
    for (char c : s) {
        if (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '[' || c == ']')
            flush();
        else
            item += c;
    }
    flush();
    return ids;
}

int run_detokenize(const DetokenizeArgs& a) {
    const Tokenizer tok = load_tokenizer(a.tokenizer);
    const std::vector<int32_t> ids = parse_id_list(a.ids == "-" ? read_stdin() : a.ids);
    const std::string text = tok.decode(ids, !a.keep_special);
    if (a.json) {
        std::printf("%s\n", nlohmann::json({{"text", text}}).dump().c_str());
        return 0;
    }
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
}

}  // namespace

std::function<int()> add_tokenize(CLI::App& app) {
    auto args = std::make_shared<TokenizeArgs>();
    CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a text");
    cmd->add_option("--tokenizer", args->tokenizer,
                    "tokenizer.json, a GGUF file (vocab-only or full) or a model folder; default: the embedded model");
    cmd->add_flag("--raw", args->raw,
                  "encode(text, add_special_tokens=False) with special-token text read as plain text (default: add "
                  "BOS/EOS as the tokenizer says and parse special tokens, like Hugging Face's tokenizer(text))");
    cmd->add_flag("--json", args->json, "Print {\"ids\": [...]} instead of space-separated ids");
    cmd->add_option("--bench", args->bench, "Encode the text N times and print the best throughput (MB/s)");
    cmd->add_flag("--per-line", args->per_line, "With --bench: encode each line as its own call");
    cmd->add_option("text", args->text, "The text, or - (the default) to read it from stdin");
    return [args] {
        if (args->text.empty()) args->text = "-";
        return run_tokenize(*args);
    };
}

std::function<int()> add_detokenize(CLI::App& app) {
    auto args = std::make_shared<DetokenizeArgs>();
    CLI::App* cmd = app.add_subcommand("detokenize", "Print the text of token ids, byte for byte (no newline added)");
    cmd->add_option("--tokenizer", args->tokenizer,
                    "tokenizer.json, a GGUF file (vocab-only or full) or a model folder; default: the embedded model");
    cmd->add_flag("--keep-special", args->keep_special, "Keep special tokens (BOS, EOS, ...) in the text");
    cmd->add_flag("--json", args->json, "Print {\"text\": \"...\"} and a newline");
    cmd->add_option("ids", args->ids, "Token ids, comma or space separated, or - to read them from stdin")->required();
    return [args] { return run_detokenize(*args); };
}

}  // namespace peregrine::cli
