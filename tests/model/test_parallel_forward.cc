// Tensor and pipeline parallelism on the CPU: T x P ranks, one process each (fork), every rank
// loading only its tensor-parallel slices (load_model with LoadOptions::tp) and running its
// pipeline stage's layers, with the shared-memory communicator (the o / down all-reduces, the
// vocabulary-parallel embedding and LM head, the residual stream sent stage to stage, the
// logits sent from the last stage back to the first). Rank 0 must give the logits of a
// one-rank run of the same batch: within 1e-4 in f32, the same argmax; with pipeline stages,
// no other rank returns logits.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "dist/shm_communicator.h"
#include "model/kv_cache.h"
#include "model/llama.h"
#include "model/loader.h"
#include "support/golden_util.h"
#include "support/parallel_steps.h"

namespace peregrine::testing {
namespace {

// The steps of tests/support/parallel_steps.h on this rank (its slices and its stage).
std::vector<float> run(const std::string& path, TensorParallel tp, const ModelParallel& par) {
    CpuBackend backend(1);
    LoadOptions opt;
    opt.matmul_dtype_ok = [&](DType t) { return backend.supports_weight_dtype(t); };
    opt.tp = tp;
    opt.pp = {par.pp ? par.pp->rank() : 0, par.pp ? par.pp->size() : 1};  // only the stage's layers read
    const auto loaded = load_model(path, opt);
    for (int l = 0; l < loaded->config.num_layers; ++l)
        EXPECT_EQ(loaded->weights.layers[l].wq.empty(),
                  !stage_layers(loaded->config.num_layers, opt.pp.stage, opt.pp.stages).contains(l));
    LlamaModel model(*loaded, backend, par);
    return run_two_sequence_steps(model, backend);
}

// Forks tp x pp ranks (rank g: tensor-parallel rank g % tp of stage g / tp); rank 0 compares
// with `ref` ([rows, vocab]) and says how far it was.
void expect_ranks_match(const std::string& path, int tp_size, int pp_size, const std::vector<float>& ref, int vocab) {
    const int size = tp_size * pp_size;
    const std::string group =
        "par-test-" + std::to_string(::getpid()) + "-" + std::to_string(tp_size) + "x" + std::to_string(pp_size);
    std::vector<pid_t> children;
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    for (int r = 0; r < size; ++r) {
        const pid_t pid = ::fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            int code = 0;
            try {
                const int tp_rank = r % tp_size, stage = r / tp_size;
                const auto tp = ShmCommunicator::create(group + "-tp" + std::to_string(stage), tp_rank, tp_size, 60);
                const auto pp = ShmCommunicator::create(group + "-pp" + std::to_string(tp_rank), stage, pp_size, 60);
                const std::vector<float> got = run(path, {tp_rank, tp_size}, {tp.get(), pp.get()});
                if (pp_size > 1 && r != 0 && !got.empty()) code = 5;  // the logits are rank 0's alone
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
    std::printf("TP %d x PP %d %s: max |dlogit| %.3g, argmax differs in %g rows\n", tp_size, pp_size, path.c_str(),
                report[0], report[1]);
    EXPECT_LE(report[0], 1e-4) << path << " TP " << tp_size << " PP " << pp_size;
    EXPECT_EQ(report[1], 0) << path << " TP " << tp_size << " PP " << pp_size;
}

class ParallelForward : public ::testing::TestWithParam<std::string> {};

TEST_P(ParallelForward, RanksGiveTheOneRankLogits) {
    const std::string path = GetParam();
    const std::vector<float> ref = run(path, {0, 1}, {});
    const ModelConfig config = open_model_config(path)->config;
    for (const auto& [tp, pp] : {std::pair{2, 1}, std::pair{4, 1}, std::pair{1, 2}, std::pair{2, 2}, std::pair{1, 3}})
        if (pp <= config.num_layers) expect_ranks_match(path, tp, pp, ref, config.vocab_size);
}

// A dummy load of one stage allocates that stage's layers only, with the values a one-stage
// load draws for them.
TEST(PipelineStages, DummyLoadOfAStageHoldsItsLayersOnly) {
    CpuBackend backend(1);
    const std::string path = models_dir() + "/stories260K";
    const auto whole = load_dummy_model(path, backend, 7);
    const int L = whole->config.num_layers;
    for (int stage = 0; stage < 2; ++stage) {
        const auto part = load_dummy_model(path, backend, 7, 0.02f, {}, {stage, 2});
        const StageLayers mine = stage_layers(L, stage, 2);
        for (int l = 0; l < L; ++l) {
            const LayerWeights& got = part->weights.layers[l];
            if (!mine.contains(l)) {
                EXPECT_TRUE(got.wq.empty() && got.w_down.empty() && got.attn_norm.empty()) << "layer " << l;
                continue;
            }
            const LayerWeights& want = whole->weights.layers[l];
            for (const auto& [a, b] : {std::pair{&got.wq, &want.wq}, std::pair{&got.w_down, &want.w_down},
                                       std::pair{&got.ffn_norm, &want.ffn_norm}})
                ASSERT_EQ(std::memcmp(a->data, b->data, a->nbytes()), 0) << "stage " << stage << " layer " << l;
        }
    }
}

TEST(PipelineStages, LayersAreContiguousAndCoverTheModel) {
    EXPECT_EQ(stage_layers(5, 0, 2).first, 0);
    EXPECT_EQ(stage_layers(5, 0, 2).count, 3);
    EXPECT_EQ(stage_layers(5, 1, 2).first, 3);
    EXPECT_EQ(stage_layers(5, 1, 2).count, 2);
    EXPECT_EQ(stage_layers(4, 3, 4).first, 3);
    EXPECT_THROW(stage_layers(2, 0, 3), Error);
}

INSTANTIATE_TEST_SUITE_P(F32Fixtures, ParallelForward,
                         ::testing::Values(models_dir() + "/stories260K", data_dir() + "/stories260K.gguf",
                                           data_dir() + "/llama3-tiny", data_dir() + "/qwen2-tiny",
                                           data_dir() + "/qwen3-tiny"));

}  // namespace
}  // namespace peregrine::testing
