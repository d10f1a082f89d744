// Tensor parallelism on the CUDA backend, two ranks on one GPU. NCCL refuses two ranks of one
// device, so these ranks' collectives go through a host-staged communicator (device -> host, the
// shared-memory collective, host -> device; eager steps, no graphs). What is checked is the CUDA
// model path under tensor parallelism — the vocabulary slice of the embedding, the o / down
// partial products all-reduced in f32, the logits gathered with device copies — against one
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
    void send(const void*, size_t, DType, int) override { fail("staged communicator: no send"); }
    void recv(void*, size_t, DType, int) override { fail("staged communicator: no recv"); }
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

// The steps of tests/support/parallel_steps.h on this rank.
std::vector<float> run(const std::string& path, TensorParallel tp, Communicator* comm, Backend& backend) {
    LoadOptions opt;
    opt.matmul_dtype_ok = [&](DType t) { return backend.supports_weight_dtype(t); };
    opt.tp = tp;
    const auto loaded = load_model(path, opt);
    LlamaModel model(*loaded, backend, {comm, nullptr});
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
    const int rank = std::atoi(rank_env), size = std::atoi(std::getenv("PG_CUDA_TP_SIZE"));
    // PG_CUDA_TP_CPU=1: the same ranks on the CPU backend (checks this harness without a GPU).
    std::unique_ptr<Backend> backend;
    if (std::getenv("PG_CUDA_TP_CPU"))
        backend = std::make_unique<CpuBackend>(1);
    else
        backend = std::make_unique<CudaBackend>(eager());
    StagedCommunicator comm(*backend, ShmCommunicator::create(std::getenv("PG_CUDA_TP_GROUP"), rank, size, 60));
    const std::vector<float> logits = run(std::getenv("PG_CUDA_TP_MODEL"), {rank, size}, &comm, *backend);
    std::ofstream out(std::getenv("PG_CUDA_TP_OUT"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * 4));
    ASSERT_TRUE(out.good());
}

// Starts `size` ranks of this binary on `model`; returns rank 0's logits.
std::vector<float> run_ranks(const std::string& model, int size) {
    const std::string group = "cuda-tp-test-" + std::to_string(::getpid());
    const std::string out0 = "/tmp/" + group + "-0.f32";
    const int failed = run_self_ranks("CudaTensorParallel.RankHelper", size, [&](int r) {
        return std::vector<std::string>{"PG_CUDA_TP_RANK=" + std::to_string(r),
                                        "PG_CUDA_TP_SIZE=" + std::to_string(size), "PG_CUDA_TP_GROUP=" + group,
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
        ref = run(path, {0, 1}, nullptr, backend);
    }
    const int vocab = open_model_config(path)->config.vocab_size;
    for (const int size : {2, 4}) {
        const std::vector<float> got = run_ranks(path, size);
        ASSERT_EQ(got.size(), ref.size()) << "TP " << size;
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
        std::printf("CUDA TP %d %s: max |dlogit| %.3g (logit scale %.3g), worst argmax flip gap %.3g\n", size,
                    path.c_str(), worst, scale, flip_gap);
        EXPECT_LE(worst, 0.02 * scale + 1e-3) << path << " TP " << size;
        EXPECT_LE(flip_gap, 0.02) << path << " TP " << size;
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaTensorParallelModels,
                         ::testing::Values(models_dir() + "/stories260K", data_dir() + "/llama3-tiny",
                                           data_dir() + "/qwen2-tiny", data_dir() + "/qwen3-tiny"));

}  // namespace
}  // namespace peregrine::testing
