// Tensor parallelism on the CPU: T ranks, one process each (fork), every rank loading only its
// slices (load_model with LoadOptions::tp) and running the forward pass with the shared-memory
// communicator (the o / down all-reduces, the vocabulary-parallel embedding and LM head). Rank
// 0's logits must match a one-rank run of the same batch: within 1e-4 in f32, the same argmax.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "dist/shm_communicator.h"
#include "model/kv_cache.h"
#include "model/llama.h"
#include "model/loader.h"
#include "support/golden_util.h"

namespace peregrine::testing {
namespace {

// Two sequences prefilled together (every token's logits), then one decode step of each:
// the paths of a real step (several sequences, chunk positions, cache reads).
std::vector<float> run(const std::string& path, TensorParallel tp, Communicator* comm) {
    CpuBackend backend(1);
    LoadOptions opt;
    opt.matmul_dtype_ok = [&](DType t) { return backend.supports_weight_dtype(t); };
    opt.tp = tp;
    const auto loaded = load_model(path, opt);
    LlamaModel model(*loaded, backend, comm);
    KvCache cache(backend, model.kv_cache_shape(16, 16));
    const std::vector<std::vector<int32_t>> prompts = {{1, 403, 407, 261, 378}, {1, 9, 77}};
    const std::vector<int32_t> next = {42, 300};
    auto batch = [&](bool decode) {
        BatchInput b;
        b.max_blocks_per_seq = 8;
        b.query_start.push_back(0);
        for (size_t s = 0; s < prompts.size(); ++s) {
            const int first = decode ? static_cast<int>(prompts[s].size()) : 0;
            const int count = decode ? 1 : static_cast<int>(prompts[s].size());
            for (int i = 0; i < count; ++i) {
                const int pos = first + i;
                b.token_ids.push_back(decode ? next[s] : prompts[s][i]);
                b.positions.push_back(pos);
                b.slot_mapping.push_back((static_cast<int>(s) * 8 + pos / 16) * 16 + pos % 16);
                b.logits_indices.push_back(static_cast<int32_t>(b.token_ids.size()) - 1);
            }
            b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
            b.context_lens.push_back(first + count);
            for (int k = 0; k < 8; ++k) b.block_tables.push_back(static_cast<int32_t>(s) * 8 + k);
        }
        return b;
    };
    std::vector<float> all, logits;
    model.forward(batch(false), cache, logits);
    all.insert(all.end(), logits.begin(), logits.end());
    model.forward(batch(true), cache, logits);
    all.insert(all.end(), logits.begin(), logits.end());
    return all;
}

// Forks `size` ranks; rank 0 compares with `ref` ([rows, vocab]) and says how far it was.
void expect_ranks_match(const std::string& path, int size, const std::vector<float>& ref, int vocab) {
    const std::string group = "tp-test-" + std::to_string(::getpid()) + "-" + std::to_string(size);
    std::vector<pid_t> children;
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    for (int r = 0; r < size; ++r) {
        const pid_t pid = ::fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            int code = 0;
            try {
                const auto comm = ShmCommunicator::create(group, r, size, 60);
                const std::vector<float> got = run(path, {r, size}, comm.get());
                if (r == 0) {
                    double worst = 0;
                    int argmax_differ = 0;
                    for (size_t row = 0; row * vocab < got.size(); ++row) {
                        const float* g = got.data() + row * vocab;
                        const float* w = ref.data() + row * vocab;
                        for (int v = 0; v < vocab; ++v) worst = std::max(worst, double(std::fabs(g[v] - w[v])));
                        argmax_differ += std::max_element(g, g + vocab) - g != std::max_element(w, w + vocab) - w;
                    }
                    const double report[2] = {worst, double(argmax_differ)};
                    if (::write(fds[1], report, sizeof(report)) != sizeof(report)) code = 4;
                    if (got.size() != ref.size()) code = 3;
                }
            } catch (const std::exception& e) {
                std::fprintf(stderr, "rank %d: %s\n", r, e.what());
                code = 2;
            }
            ::_exit(code);
        }
        children.push_back(pid);
    }
    ::close(fds[1]);
    for (int r = 0; r < size; ++r) {
        int status = 0;
        ASSERT_EQ(::waitpid(children[r], &status, 0), children[r]);
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << " status " << status;
    }
    double report[2] = {-1, -1};
    ASSERT_EQ(::read(fds[0], report, sizeof(report)), static_cast<ssize_t>(sizeof(report)));
    ::close(fds[0]);
    std::printf("TP %d %s: max |dlogit| %.3g, argmax differs in %g rows\n", size, path.c_str(), report[0], report[1]);
    EXPECT_LE(report[0], 1e-4) << path << " TP " << size;
    EXPECT_EQ(report[1], 0) << path << " TP " << size;
}

class TensorParallelForward : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallelForward, RanksGiveTheOneRankLogits) {
    const std::string path = GetParam();
    const std::vector<float> ref = run(path, {0, 1}, nullptr);
    const int vocab = open_model_config(path)->config.vocab_size;
    for (int size : {2, 4}) expect_ranks_match(path, size, ref, vocab);
}

INSTANTIATE_TEST_SUITE_P(F32Fixtures, TensorParallelForward,
                         ::testing::Values(models_dir() + "/stories260K", data_dir() + "/stories260K.gguf",
                                           data_dir() + "/llama3-tiny", data_dir() + "/qwen2-tiny",
                                           data_dir() + "/qwen3-tiny"));

}  // namespace
}  // namespace peregrine::testing
