// `peregrine generate`: one prompt, one continuation, streamed to stdout.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "backend/cpu/cpu_backend.h"
#include "cli/commands.h"
#include "core/error.h"
#include "engine/sampling.h"
#include "model/llama.h"
#include "model/loader.h"
#include "model/sequence_runner.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace peregrine::cli {

namespace {

struct GenerateArgs {
    std::string model;
    std::string prompt;
    std::string prompt_ids;
    int max_tokens = 128;
    float temperature = 0.8f;
    float top_p = 0.95f;
    int top_k = 40;
    int64_t seed = -1;
    bool ignore_eos = false;
    std::string dtype = "auto";
    int threads = 0;
    bool json = false;
};

std::vector<int32_t> parse_ids(const std::string& s, int vocab) {
    std::vector<int32_t> ids;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (item.empty()) continue;
        size_t used = 0;
        long v = -1;
        try {
            v = std::stol(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != item.size()) fail("--prompt-ids: '", item, "' is not an integer");
        if (v < 0 || v >= vocab) fail("--prompt-ids: token id ", v, " is outside the vocabulary (0..", vocab - 1, ")");
        ids.push_back(static_cast<int32_t>(v));
    }
    if (ids.empty()) fail("--prompt-ids: no token ids given");
    return ids;
}

Tokenizer load_tokenizer(const LoadedModel& m) {
    if (m.gguf) return Tokenizer::from_gguf(*m.gguf);
    return Tokenizer::from_tokenizer_json((std::filesystem::path(m.model_dir) / "tokenizer.json").string());
}

// A progress line on stderr for big models on a terminal.
std::function<void(size_t, size_t)> progress_printer() {
    if (!::isatty(STDERR_FILENO)) return {};
    return [last = -1](size_t done, size_t total) mutable {
        if (total < (size_t{1} << 30)) return;
        const int pct = static_cast<int>(100.0 * done / total);
        if (pct == last) return;
        last = pct;
        std::fprintf(stderr, "\rloading weights: %3d%% (%.1f / %.1f GB)%s", pct, done / 1e9, total / 1e9,
                     done >= total ? "\n" : "");
    };
}

int run(const GenerateArgs& a) {
    if (a.max_tokens < 0) fail("--max-tokens must be >= 0");
    CpuBackend backend(a.threads, cpu_precision_from_name(a.dtype));
    LoadOptions opt;
    opt.matmul_dtype_ok = [&](DType t) { return backend.supports_weight_dtype(t); };
    opt.progress = progress_printer();
    const std::string path = a.model.empty() ? default_model_path() : a.model;
    const auto t_load = std::chrono::steady_clock::now();
    std::unique_ptr<LoadedModel> m = load_model(path, opt);
    const ModelConfig& c = m->config;
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    std::fprintf(stderr, "model: %s (%s, %.2fs)\n  %s\n  weights: %s\n  backend: %s\n", path.c_str(), m->format.c_str(),
                 load_s, c.summary().c_str(), m->weight_dtypes.c_str(), backend.name().c_str());

    const Tokenizer tokenizer = load_tokenizer(*m);
    std::vector<int32_t> prompt;
    if (!a.prompt_ids.empty()) {
        prompt = parse_ids(a.prompt_ids, c.vocab_size);
    } else {
        // User text: BOS/EOS as the tokenizer's config says, special-token text not parsed.
        prompt = tokenizer.encode(a.prompt, /*add_special_tokens=*/true, /*parse_special=*/false);
        if (prompt.empty()) fail("--prompt: the text has no tokens");
        for (int32_t id : prompt)
            if (id >= c.vocab_size) fail("--prompt: token id ", id, " is outside the model's vocabulary");
    }

    const int total = std::min<int>(static_cast<int>(prompt.size()) + a.max_tokens, c.max_position_embeddings);
    if (static_cast<int>(prompt.size()) > c.max_position_embeddings)
        fail("the prompt has ", prompt.size(), " tokens; the model's context is ", c.max_position_embeddings);
    LlamaModel model(*m, backend);
    SequenceRunner runner(model, backend, total);
    const uint64_t seed = a.seed >= 0 ? static_cast<uint64_t>(a.seed) : std::random_device{}();
    TokenSampler sampler(seed);
    const SamplingOptions sopt{a.temperature, a.top_p, a.top_k};

    // Echo the prompt, then stream the continuation as complete UTF-8.
    IncrementalDetokenizer detok(tokenizer);
    std::string text;  // generated text only
    auto emit = [&](int id, bool generated) {
        const std::string ready = detok.push(id);
        if (generated) text += ready;
        if (!a.json) {
            std::fwrite(ready.data(), 1, ready.size(), stdout);
            std::fflush(stdout);
        }
    };
    for (int id : prompt) emit(id, false);

    std::vector<float> logits;
    std::vector<int> generated;
    const auto t0 = std::chrono::steady_clock::now();
    runner.run(prompt, false, logits);
    const auto t1 = std::chrono::steady_clock::now();
    const int max_new = total - static_cast<int>(prompt.size());
    for (int i = 0; i < max_new; ++i) {
        const int next = sampler.sample(logits.data(), c.vocab_size, sopt);
        generated.push_back(next);
        const bool eos = std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), next) != c.eos_token_ids.end();
        if (eos && !a.ignore_eos) break;
        emit(next, true);
        if (i + 1 < max_new) runner.run({next}, false, logits);
    }
    const auto t2 = std::chrono::steady_clock::now();
    const std::string rest = detok.finish();
    text += rest;
    if (!a.json) {
        std::fwrite(rest.data(), 1, rest.size(), stdout);
        std::printf("\n");
    }
    const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
    const double decode_s = std::chrono::duration<double>(t2 - t1).count();
    const int decoded = generated.empty() ? 0 : static_cast<int>(generated.size()) - 1;
    std::fprintf(stderr,
                 "prefill: %zu tokens in %.1f ms (%.1f tokens/s); decode: %d tokens in %.1f ms (%.1f tokens/s)\n",
                 prompt.size(), prefill_s * 1e3, prompt.size() / prefill_s, decoded, decode_s * 1e3,
                 decoded > 0 ? decoded / decode_s : 0.0);
    if (a.json) {
        nlohmann::json out = {{"prompt_ids", prompt}, {"ids", generated}, {"text", text}};
        std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    }
    return 0;
}

}  // namespace

std::function<int()> add_generate(CLI::App& app) {
    auto args = std::make_shared<GenerateArgs>();
    CLI::App* cmd = app.add_subcommand("generate", "Continue one prompt, streaming the text to stdout");
    cmd->add_option("--model", args->model,
                    "Model folder (config.json + safetensors) or GGUF file; default: the embedded stories260K");
    auto* p = cmd->add_option("--prompt", args->prompt, "Prompt text");
    auto* pi = cmd->add_option("--prompt-ids", args->prompt_ids, "Prompt token ids, comma separated");
    p->excludes(pi);
    cmd->add_option("--max-tokens", args->max_tokens, "Tokens to generate (default 128)");
    cmd->add_option("--temperature", args->temperature, "Sampling temperature; 0 = greedy (default 0.8)");
    cmd->add_option("--top-p", args->top_p, "Nucleus sampling mass (default 0.95)");
    cmd->add_option("--top-k", args->top_k, "Keep the k most likely tokens; 0 = all (default 40)");
    cmd->add_option("--seed", args->seed, "Random seed (default: random)");
    cmd->add_flag("--ignore-eos", args->ignore_eos, "Keep generating after an end-of-sequence token");
    cmd->add_option("--dtype", args->dtype,
                    "Activation precision: float32 (reference), bfloat16 (bf16 matmul inputs for bf16 weights), auto "
                    "(bfloat16 where the CPU has AVX512-BF16)")
        ->check(CLI::IsMember({"auto", "float32", "bfloat16"}));
    cmd->add_option("--threads", args->threads, "CPU threads (default: one per core)");
    cmd->add_flag("--json", args->json, "Print one JSON object {prompt_ids, ids, text} as the last line");
    return [args] {
        if (args->prompt.empty() && args->prompt_ids.empty()) fail("generate needs --prompt or --prompt-ids");
        return run(*args);
    };
}

}  // namespace peregrine::cli
