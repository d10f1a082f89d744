// Helpers for tests against the reference data in tests/data (see tests/data/README.md).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/llama.h"
#include "model/loader.h"
#include "peregrine/engine_types.h"
#include "support/sequence_runner.h"

namespace peregrine::testing {

// The build's source tree, or PG_TEST_DATA_DIR / PG_MODELS_DIR from the environment when the
// test binary runs elsewhere (the GPU machine gets a copy of the tree at another path).
inline std::string data_dir() {
    const char* env = std::getenv("PG_TEST_DATA_DIR");
    return env ? env : PG_TEST_DATA_DIR;
}
inline std::string models_dir() {
    const char* env = std::getenv("PG_MODELS_DIR");
    return env ? env : PG_MODELS_DIR;
}

inline nlohmann::json read_json_file(const std::string& path) {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
}

inline std::vector<float> read_f32_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    const size_t bytes = static_cast<size_t>(in.tellg());
    std::vector<float> v(bytes / 4);
    in.seekg(0);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(bytes));
    return v;
}

// A loaded model with a backend (the CPU one unless given) and a one-sequence runner.
struct TestModel {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<LoadedModel> loaded;
    std::unique_ptr<LlamaModel> model;

    explicit TestModel(const std::string& path, int threads = 2,
                       const std::function<void(ModelConfig&)>& edit_config = {},
                       CpuPrecision precision = CpuPrecision::Float32)
        : TestModel(path, std::make_unique<CpuBackend>(threads, precision), edit_config) {}

    TestModel(const std::string& path, std::unique_ptr<Backend> b,
              const std::function<void(ModelConfig&)>& edit_config = {}) {
        backend = std::move(b);
        LoadOptions opt;
        opt.matmul_dtype_ok = [this](DType t) { return backend->supports_weight_dtype(t); };
        loaded = load_model(path, opt);
        if (edit_config) edit_config(loaded->config);
        model = std::make_unique<LlamaModel>(*loaded, *backend);
    }

    int vocab() const { return loaded->config.vocab_size; }

    // Logits of every position of `ids`, run in chunks of `chunk` tokens (0 = all at once).
    std::vector<float> all_logits(const std::vector<int32_t>& ids, int chunk = 0) {
        SequenceRunner runner(*model, *backend, static_cast<int>(ids.size()) + 1);
        std::vector<float> out, part;
        const size_t step = chunk > 0 ? static_cast<size_t>(chunk) : ids.size();
        for (size_t i = 0; i < ids.size(); i += step) {
            std::vector<int32_t> piece(ids.begin() + i, ids.begin() + std::min(ids.size(), i + step));
            runner.run(piece, true, part);
            out.insert(out.end(), part.begin(), part.end());
        }
        return out;
    }

    // Greedy continuation of `n` tokens (no EOS stop).
    std::vector<int> greedy(const std::vector<int32_t>& prompt, int n) {
        SequenceRunner runner(*model, *backend, static_cast<int>(prompt.size()) + n);
        std::vector<float> logits;
        runner.run(prompt, false, logits);
        std::vector<int> out;
        for (int i = 0; i < n; ++i) {
            int best = 0;
            for (int v = 1; v < vocab(); ++v)
                if (logits[v] > logits[best]) best = v;
            out.push_back(best);
            if (i + 1 < n) runner.run({best}, false, logits);
        }
        return out;
    }
};

// `count` greedy requests with random prompts (BOS + up to 79 ids in [3, 503)) and random
// max_tokens (1..40), EOS ignored: the engine tests' crowd.
inline std::vector<Request> random_greedy_requests(int count, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<Request> reqs;
    for (int i = 0; i < count; ++i) {
        Request r;
        r.id = "r" + std::to_string(i);
        const int len = 1 + rng() % 80;
        r.prompt_ids.push_back(1);
        for (int j = 1; j < len; ++j) r.prompt_ids.push_back(3 + rng() % 500);
        r.sampling.temperature = 0.0f;
        r.sampling.max_tokens = 1 + rng() % 40;
        r.sampling.ignore_eos = true;
        reqs.push_back(r);
    }
    return reqs;
}

struct LogitStats {
    double max_abs_diff = 0;
    double mean_kl = 0;       // KL(reference ‖ ours) per position, nats
    double argmax_agree = 0;  // fraction of positions
    size_t argmax_mismatches = 0;
};

inline LogitStats compare_logits(const std::vector<float>& ref, const std::vector<float>& ours, int vocab) {
    LogitStats s;
    const size_t rows = ref.size() / vocab;
    for (size_t r = 0; r < rows; ++r) {
        const float* a = ref.data() + r * vocab;
        const float* b = ours.data() + r * vocab;
        int am = 0, bm = 0;
        double amax = a[0], bmax = b[0];
        for (int v = 0; v < vocab; ++v) {
            s.max_abs_diff = std::max(s.max_abs_diff, static_cast<double>(std::fabs(a[v] - b[v])));
            if (a[v] > a[am]) am = v;
            if (b[v] > b[bm]) bm = v;
            amax = std::max(amax, static_cast<double>(a[v]));
            bmax = std::max(bmax, static_cast<double>(b[v]));
        }
        double za = 0, zb = 0;
        for (int v = 0; v < vocab; ++v) {
            za += std::exp(a[v] - amax);
            zb += std::exp(b[v] - bmax);
        }
        double kl = 0;
        for (int v = 0; v < vocab; ++v) {
            const double la = a[v] - amax - std::log(za), lb = b[v] - bmax - std::log(zb);
            kl += std::exp(la) * (la - lb);
        }
        s.mean_kl += kl / rows;
        s.argmax_mismatches += am != bm;
    }
    s.argmax_agree = 1.0 - static_cast<double>(s.argmax_mismatches) / rows;
    return s;
}

// Positions where the reference's top two logits are at least `gap` apart, and of them those
// whose argmax differs in `ours`; and the largest reference gap among all positions that differ.
struct Decisive {
    size_t positions = 0, flips = 0;
    double worst_flip_gap = 0;
};
inline Decisive decisive(const std::vector<float>& ref, const std::vector<float>& ours, int vocab, double gap) {
    Decisive d;
    for (size_t r = 0; r < ref.size() / vocab; ++r) {
        const float* a = ref.data() + r * vocab;
        const float* b = ours.data() + r * vocab;
        const int am = static_cast<int>(std::max_element(a, a + vocab) - a);
        const int bm = static_cast<int>(std::max_element(b, b + vocab) - b);
        float second = -INFINITY;
        for (int v = 0; v < vocab; ++v)
            if (v != am) second = std::max(second, a[v]);
        if (am != bm) d.worst_flip_gap = std::max(d.worst_flip_gap, static_cast<double>(a[am] - a[bm]));
        if (a[am] - second < gap) continue;
        ++d.positions;
        d.flips += am != bm;
    }
    return d;
}

// Two ways of running the trained fixture (tests/data/text-trained) over its held-out passages
// (heldout.json: 8 x BOS + 255 tokens of text it never saw in training), pooled over all 2,048
// positions: argmax agreement of `ours` with `ref`, mean KL, and the largest reference top-two gap
// among the flips. Each function returns the logits of every position of the ids it is given.
struct HeldOutAgreement {
    size_t positions = 0, mismatches = 0;
    double mean_kl = 0, worst_flip_gap = 0;
    double agree() const { return 1.0 - static_cast<double>(mismatches) / static_cast<double>(positions); }
};
inline HeldOutAgreement text_trained_agreement(
    const std::function<std::vector<float>(const std::vector<int32_t>&)>& ref,
    const std::function<std::vector<float>(const std::vector<int32_t>&)>& ours, int vocab) {
    HeldOutAgreement h;
    double kl_sum = 0;
    const auto passages =
        read_json_file(data_dir() + "/text-trained/heldout.json")["sequences"].get<std::vector<std::vector<int32_t>>>();
    for (const std::vector<int32_t>& ids : passages) {
        const std::vector<float> a = ref(ids), b = ours(ids);
        const LogitStats s = compare_logits(a, b, vocab);
        h.worst_flip_gap = std::max(h.worst_flip_gap, decisive(a, b, vocab, 0.05).worst_flip_gap);
        h.positions += ids.size();
        h.mismatches += s.argmax_mismatches;
        kl_sum += s.mean_kl * static_cast<double>(ids.size());
    }
    h.mean_kl = kl_sum / static_cast<double>(h.positions);
    std::printf(
        "text-trained held-out: %zu positions, argmax agreement %.4f (%zu differ, reference top-two gap <= %.3g), mean "
        "KL %.3g\n",
        h.positions, h.agree(), h.mismatches, h.worst_flip_gap, h.mean_kl);
    return h;
}

}  // namespace peregrine::testing
