// `peregrine generate`: one prompt, one continuation through the engine, streamed to stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/engine_options.h"
#include "core/error.h"
#include "model/hf_cache.h"
#include "peregrine/engine.h"
#include "tokenizer/tokenizer.h"

namespace peregrine::cli {

namespace {

struct GenerateArgs {
    EngineConfig engine;
    // Options the user gave (the others fall back to generation_config.json, then ours).
    CLI::Option *temperature_opt = nullptr, *top_p_opt = nullptr, *top_k_opt = nullptr, *min_p_opt = nullptr;
    std::string prompt;
    std::string prompt_ids;
    int max_tokens = 128;
    float temperature = 0.8f;
    float top_p = 0.95f;
    int top_k = 40;
    float min_p = 0.0f;
    int64_t seed = -1;
    std::vector<std::string> stop;
    bool ignore_eos = false;
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

// The sampling rules every front end shares (peregrine::validate), reported by the flag that
// set the field; the others came from the model's generation_config.json.
void check_sampling(const SamplingParams& p, int vocab) {
    SamplingLimits limits;
    limits.vocab_size = vocab;
    const std::vector<FieldError> errors = validate(p, limits);
    if (errors.empty()) return;
    const std::string& field = errors.front().field;
    std::string flag = "generation_config.json";
    for (const char* f : {"temperature", "top_p", "top_k", "min_p", "max_tokens", "stop"})
        if (field == f) {
            flag = "--" + field;
            std::replace(flag.begin(), flag.end(), '_', '-');
        }
    fail(flag, ": ", errors.front().message);
}

int run(const GenerateArgs& a) {
    // The engine's thread runs the steps; this one makes the text (as a server's would).
    const std::unique_ptr<Engine> engine = Engine::create(a.engine);
    const ModelInfo& info = engine->model();
    const std::shared_ptr<const Tokenizer> tokenizer = engine->tokenizer();

    Request req;
    req.id = "generate";
    if (!a.prompt_ids.empty()) {
        req.prompt_ids = parse_ids(a.prompt_ids, info.vocab_size);
    } else {
        // User text: BOS/EOS as the tokenizer's config says, special-token text not parsed.
        req.prompt_ids = tokenizer->encode(a.prompt, /*add_special_tokens=*/true, /*parse_special=*/false);
        if (req.prompt_ids.empty()) fail("--prompt: the text has no tokens");
    }
    SamplingParams& p = req.sampling;
    // Ours, then the model's generation_config.json, then the flags given.
    p.max_tokens = a.max_tokens;
    p.temperature = a.temperature;
    p.top_p = a.top_p;
    p.top_k = a.top_k;
    p.min_p = a.min_p;
    apply_generation_defaults(info.generation_defaults, p);
    if (a.temperature_opt->count() > 0) p.temperature = a.temperature;
    if (a.top_p_opt->count() > 0) p.top_p = a.top_p;
    if (a.top_k_opt->count() > 0) p.top_k = a.top_k;
    if (a.min_p_opt->count() > 0) p.min_p = a.min_p;
    p.stop = a.stop;
    p.ignore_eos = a.ignore_eos;
    if (a.seed >= 0) p.seed = static_cast<uint64_t>(a.seed);
    check_sampling(p, info.vocab_size);

    const auto t0 = std::chrono::steady_clock::now();
    const std::shared_ptr<RequestStream> stream = engine->submit(req);
    if (!a.json) {
        const std::string shown = tokenizer->decode(req.prompt_ids);
        std::fwrite(shown.data(), 1, shown.size(), stdout);
        std::fflush(stdout);
    }
    std::vector<int32_t> ids;
    std::string text;
    auto t_first = t0;
    for (RequestOutput o; stream->next(o);) {
        if (ids.empty() && !o.token_ids.empty()) t_first = std::chrono::steady_clock::now();
        ids.insert(ids.end(), o.token_ids.begin(), o.token_ids.end());
        text += o.text;
        if (!a.json) {
            std::fwrite(o.text.data(), 1, o.text.size(), stdout);
            std::fflush(stdout);
        }
    }
    const auto t_end = std::chrono::steady_clock::now();
    if (!a.json) std::printf("\n");
    std::fflush(stdout);
    // The first step runs the prompt and samples the first token; each later step one token.
    const double prefill_s = std::chrono::duration<double>(t_first - t0).count();
    const double decode_s = std::chrono::duration<double>(t_end - t_first).count();
    const int decoded = ids.empty() ? 0 : static_cast<int>(ids.size()) - 1;
    std::fprintf(stderr,
                 "prefill: %zu tokens in %.1f ms (%.1f tokens/s); decode: %d tokens in %.1f ms (%.1f tokens/s)\n",
                 req.prompt_ids.size(), prefill_s * 1e3, req.prompt_ids.size() / prefill_s, decoded, decode_s * 1e3,
                 decoded > 0 ? decoded / decode_s : 0.0);
    if (a.json) {
        nlohmann::json out = {{"prompt_ids", req.prompt_ids}, {"ids", ids}, {"text", text}};
        std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    }
    return 0;
}

}  // namespace

std::function<int()> add_generate(CLI::App& app) {
    auto args = std::make_shared<GenerateArgs>();
    CLI::App* cmd = app.add_subcommand("generate", "Continue one prompt, streaming the text to stdout");
    add_engine_options(cmd, args->engine);
    auto* p = cmd->add_option("--prompt", args->prompt, "Prompt text (BOS added as the tokenizer's config says)");
    auto* pi = cmd->add_option("--prompt-ids", args->prompt_ids, "Prompt token ids, comma separated");
    p->excludes(pi);
    cmd->add_option("--max-tokens", args->max_tokens, "Tokens to generate (default 128)");
    // Defaults: the model's generation_config.json where it sets them, else these.
    args->temperature_opt =
        cmd->add_option("--temperature", args->temperature, "Sampling temperature; 0 = greedy (default 0.8)");
    args->top_p_opt = cmd->add_option("--top-p", args->top_p, "Nucleus sampling mass (default 0.95)");
    args->top_k_opt = cmd->add_option("--top-k", args->top_k, "Keep the k most likely tokens; 0 = all (default 40)");
    args->min_p_opt =
        cmd->add_option("--min-p", args->min_p, "Drop tokens below min-p times the most likely (default 0)");
    cmd->add_option("--seed", args->seed, "Random seed (default: random)");
    cmd->add_option("--stop", args->stop, "Stop string (repeatable); not included in the output");
    cmd->add_flag("--ignore-eos", args->ignore_eos, "Keep generating after an end-of-sequence token");
    cmd->add_flag("--json", args->json, "Print one JSON object {prompt_ids, ids, text} as the last line");
    return [args] {
        if (args->prompt.empty() && args->prompt_ids.empty()) fail("generate needs --prompt or --prompt-ids");
        args->engine.model = resolve_model_path(args->engine.model);
        return run(*args);
    };
}

}  // namespace peregrine::cli
