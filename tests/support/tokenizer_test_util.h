// Helpers for the tokenizer tests: the fixtures (tests/data/tokenizers.tar.xz, unpacked into
// the build folder at build time) and a cache so that each tokenizer loads once per process.
#pragma once

#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace peregrine::testing {

inline std::string tokenizer_data_dir() {
    return PG_TOKENIZER_DATA_DIR;
}

inline std::string read_text_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

struct TokenizerCase {
    std::string text;
    std::vector<int32_t> ids;
};

// `.inp`: strings each followed by "\n__ggml_vocab_test__\n" (the last may lack it); `.out`:
// line i holds the ids of string i, space separated (an empty line: no tokens).
inline std::vector<TokenizerCase> read_tokenizer_cases(const std::string& inp_path, const std::string& out_path) {
    const std::string sep = "\n__ggml_vocab_test__\n";
    const std::string inp = read_text_file(inp_path);
    std::vector<TokenizerCase> cases;
    size_t pos = 0;
    while (pos < inp.size()) {
        const size_t e = inp.find(sep, pos);
        if (e == std::string::npos) {
            cases.push_back({inp.substr(pos), {}});
            break;
        }
        cases.push_back({inp.substr(pos, e - pos), {}});
        pos = e + sep.size();
    }
    std::istringstream out(read_text_file(out_path));
    std::string line;
    for (auto& c : cases) {
        if (!std::getline(out, line)) break;
        std::istringstream ls(line);
        int32_t id;
        while (ls >> id) c.ids.push_back(id);
    }
    return cases;
}

// Loads each tokenizer once per test process.
inline const Tokenizer& cached_tokenizer(const std::string& path) {
    static std::mutex mu;
    static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
    std::lock_guard<std::mutex> lock(mu);
    auto& slot = cache[path];
    if (!slot) slot = std::make_unique<Tokenizer>(Tokenizer::load(path));
    return *slot;
}

}  // namespace peregrine::testing
