// Tensor and pipeline parallelism on the CUDA backend, 2-4 ranks on one GPU. NCCL refuses two ranks of one
// device, so these ranks' collectives go through a host-staged communicator (device -> host, the
// shared-memory collective, host -> device; eager steps, no graphs). What is checked is the CUDA
// model path under tensor parallelism — the vocabulary slice of the embedding, the o / down
// partial products all-reduced in f32, the logits gathered with device copies — and under
// pipeline stages (the residual stream handed on, the logits sent back to rank 0), against one
// rank on the same GPU. The ranks are this test binary started again (posix_spawn: a fresh
// process, not a fork of one that already holds a CUDA context) running RankHelper.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "dist/shm_communicator.h"
#include "model/kv_cache.h"
#include "model/llama.h"
#include "model/loader.h"
#include "support/golden_util.h"
#include "support/parallel_steps.h"
#include "support/self_ranks.h"

namespace peregrine::testing {
namespace {

// A communicator over device buffers through host copies of them.
class StagedCommunicator final : public Communicator {
  public:
    StagedCommunicator(Backend& backend, std::unique_ptr<ShmCommunicator> inner)
        : Communicator(inner->rank(), inner->size()), backend_(backend), inner_(std::move(inner)) {}
    std::string name() const override { return "staged " + inner_->name(); }
    void all_reduce_sum(void* buf, size_t count, DType dtype) override {
        stage_in(buf, count, dtype, a_);
        inner_->all_reduce_sum(a_.data(), count, dtype);
        stage_out(a_, buf, count, dtype);
    }
    void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
        stage_in(send, count, dtype, a_);
        b_.resize(a_.size() * size());
        inner_->all_gather(a_.data(), b_.data(), count, dtype);
        stage_out(b_, recv, count * size(), dtype);
    }
    void broadcast(void* buf, size_t count, DType dtype, int root) override {
        stage_in(buf, count, dtype, a_);
        inner_->broadcast(a_.data(), count, dtype, root);
        stage_out(a_, buf, count, dtype);
    }
    void send(const void* buf, size_t count, DType dtype, int peer) override {
        stage_in(buf, count, dtype, a_);
        inner_->send(a_.data(), count, dtype, peer);
    }
    void recv(void* buf, size_t count, DType dtype, int peer) override {
        a_.resize(count * comm_element_size(dtype));
        inner_->recv(a_.data(), count, dtype, peer);
        stage_out(a_, buf, count, dtype);
    }
    void barrier() override { inner_->barrier(); }

  private:
    Tensor device(const void* p, size_t count, DType dtype) const {
        return Tensor(const_cast<void*>(p), dtype, {static_cast<int64_t>(count)}, Device::CUDA);
    }
    void stage_in(const void* p, size_t count, DType dtype, std::vector<char>& host) {
        host.resize(count * comm_element_size(dtype));
        backend_.download(device(p, count, dtype), host.data());  // waits for the stream
    }
    void stage_out(const std::vector<char>& host, void* p, size_t count, DType dtype) {
        backend_.upload(host.data(), device(p, count, dtype));
    }
    Backend& backend_;
    std::unique_ptr<ShmCommunicator> inner_;
    std::vector<char> a_, b_;
};

// The steps of tests/support/parallel_steps.h on this rank (its slices and its stage).
std::vector<float> run(const std::string& path, TensorParallel tp, const ModelParallel& par, Backend& backend) {
    LoadOptions opt;
    opt.matmul_dtype_ok = [&](DType t) { return backend.supports_weight_dtype(t); };
    opt.tp = tp;
    opt.pp = {par.pp ? par.pp->rank() : 0, par.pp ? par.pp->size() : 1};
    const auto loaded = load_model(path, opt);
    LlamaModel model(*loaded, backend, par);
    return run_two_sequence_steps(model, backend);
}

CudaOptions eager() {
    CudaOptions o;
    o.graphs = false;  // the staged collectives wait on the host
    return o;
}

// One rank, when started by TwoRanksOnOneGpuGiveOneRanksLogits (skipped otherwise).
TEST(CudaTensorParallel, RankHelper) {
    const char* rank_env = std::getenv("PG_CUDA_TP_RANK");
    if (!rank_env) GTEST_SKIP() << "a rank of TwoRanksOnOneGpuGiveOneRanksLogits";
    // Rank g: tensor-parallel rank g % T of pipeline stage g / T.
    const int rank = std::atoi(rank_env), T = std::atoi(std::getenv("PG_CUDA_TP_SIZE")),
              P = std::atoi(std::getenv("PG_CUDA_PP_SIZE"));
    const int tp_rank = rank % T, stage = rank / T;
    // PG_CUDA_TP_CPU=1: the same ranks on the CPU backend (checks this harness without a GPU).
    std::unique_ptr<Backend> backend;
    if (std::getenv("PG_CUDA_TP_CPU"))
        backend = std::make_unique<CpuBackend>(1);
    else
        backend = std::make_unique<CudaBackend>(eager());
    const std::string group = std::getenv("PG_CUDA_TP_GROUP");
    StagedCommunicator tp(*backend, ShmCommunicator::create(group + "-tp" + std::to_string(stage), tp_rank, T, 60));
    StagedCommunicator pp(*backend, ShmCommunicator::create(group + "-pp" + std::to_string(tp_rank), stage, P, 60));
    const std::vector<float> logits =
        run(std::getenv("PG_CUDA_TP_MODEL"), {tp_rank, T}, {T > 1 ? &tp : nullptr, P > 1 ? &pp : nullptr}, *backend);
    // With stages, the logits are rank 0's alone (the last stage sends them back to it).
    if (P > 1 && rank != 0) {
        ASSERT_TRUE(logits.empty()) << "rank " << rank << " returned logits";
    }
    std::ofstream out(std::getenv("PG_CUDA_TP_OUT"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * 4));
    ASSERT_TRUE(out.good());
}

// Starts tp x pp ranks of this binary on `model`; returns rank 0's logits.
std::vector<float> run_ranks(const std::string& model, int tp, int pp) {
    const int size = tp * pp;
    const std::string group = "cuda-tp-test-" + std::to_string(::getpid());
    const std::string out0 = "/tmp/" + group + "-0.f32";
    const int failed = run_self_ranks("CudaTensorParallel.RankHelper", size, [&](int r) {
        return std::vector<std::string>{"PG_CUDA_TP_RANK=" + std::to_string(r),
                                        "PG_CUDA_TP_SIZE=" + std::to_string(tp),
                                        "PG_CUDA_PP_SIZE=" + std::to_string(pp),
                                        "PG_CUDA_TP_GROUP=" + group,
                                        "PG_CUDA_TP_MODEL=" + model,
                                        "PG_CUDA_TP_OUT=/tmp/" + group + "-" + std::to_string(r) + ".f32"};
    });
    EXPECT_EQ(failed, 0) << "a rank failed (its output is above)";
    std::ifstream in(out0, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    std::vector<float> out(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), out.size() * 4);
    for (int r = 0; r < size; ++r) std::remove(("/tmp/" + group + "-" + std::to_string(r) + ".f32").c_str());
    return out;
}

class CudaTensorParallelModels : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaTensorParallelModels, TwoRanksOnOneGpuGiveOneRanksLogits) {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    const std::string path = GetParam();
    std::vector<float> ref;
    {
        CudaBackend backend(eager());
        ref = run(path, {0, 1}, {}, backend);
    }
    const int vocab = open_model_config(path)->config.vocab_size;
    for (const auto& [tp, pp] : {std::pair{2, 1}, std::pair{4, 1}, std::pair{1, 2}, std::pair{2, 2}}) {
        const std::string what = "TP " + std::to_string(tp) + " x PP " + std::to_string(pp);
        const std::vector<float> got = run_ranks(path, tp, pp);
        ASSERT_EQ(got.size(), ref.size()) << what;
        // bf16 activations: the partial products' rounding differs from one rank's; the sums
        // are f32. Bound the difference by the logits' own scale, and the argmax to near-ties.
        double worst = 0, scale = 0, flip_gap = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
            worst = std::max(worst, double(std::fabs(got[i] - ref[i])));
            scale = std::max(scale, double(std::fabs(ref[i])));
        }
        for (size_t r = 0; r * vocab < ref.size(); ++r) {
            const float* a = ref.data() + r * vocab;
            const float* b = got.data() + r * vocab;
            const long am = std::max_element(a, a + vocab) - a, bm = std::max_element(b, b + vocab) - b;
            if (am != bm) flip_gap = std::max(flip_gap, double(a[am] - a[bm]));
        }
        std::printf("CUDA %s %s: max |dlogit| %.3g (logit scale %.3g), worst argmax flip gap %.3g\n", what.c_str(),
                    path.c_str(), worst, scale, flip_gap);
        EXPECT_LE(worst, 0.02 * scale + 1e-3) << path << " " << what;
        EXPECT_LE(flip_gap, 0.02) << path << " " << what;
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaTensorParallelModels,
                         ::testing::Values(models_dir() + "/stories260K", data_dir() + "/llama3-tiny",
                                           data_dir() + "/qwen2-tiny", data_dir() + "/qwen3-tiny",
                                           // GGUF slices kept quantized on the GPU (or bf16 where
                                           // a slice is not whole blocks)
                                           data_dir() + "/quant-tiny/qt-q8_0.gguf",
                                           data_dir() + "/quant-tiny/qt-q4_k.gguf"));

}  // namespace
}  // namespace peregrine::testing
