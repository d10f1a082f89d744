// The request most engine tests build: greedy, a fixed number of tokens (EOS ignored), so that
// two runs are compared token for token.
#pragma once

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "peregrine/engine_types.h"

namespace peregrine::testing {

inline Request greedy_request(std::string id, std::vector<int32_t> prompt, int max_tokens) {
    Request r;
    r.id = std::move(id);
    r.prompt_ids = std::move(prompt);
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    return r;
}

// Two rounds of the same prompts (ids "r<round>_<k>"): `systems` system prompts of `system_len`
// tokens (BOS first, the rest random from `seed`), six users each taking system k % systems plus
// a suffix of first_suffix + k tokens; 12 greedy tokens each. Real-model tests (ids < 503).
inline std::vector<Request> shared_system_requests(uint32_t seed, int systems, int system_len, int first_suffix) {
    std::mt19937 rng(seed);
    std::vector<std::vector<int32_t>> sys(systems);
    for (auto& s : sys) {
        s.push_back(1);
        for (int i = 1; i < system_len; ++i) s.push_back(3 + rng() % 500);
    }
    std::vector<Request> reqs;
    for (int round = 0; round < 2; ++round)
        for (int k = 0; k < 6; ++k) {
            std::vector<int32_t> prompt = sys[k % systems];
            for (int i = 0; i < first_suffix + k; ++i) prompt.push_back(3 + (k * 37 + i * 11) % 500);
            reqs.push_back(
                greedy_request("r" + std::to_string(round) + "_" + std::to_string(k), std::move(prompt), 12));
        }
    return reqs;
}

}  // namespace peregrine::testing
