// Embeddings' pooling input: the final norm's output at chosen token rows, summed per range, on
// the host. The residual stream is read back from the device and normalised here (no backend op):
// an embedding step's cost is its prefill, and the rows read back are few (one per sequence for
// last-token pooling) or as many as the step's tokens of hidden_size f32 (mean pooling).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/llama.h"

namespace peregrine {

void Model::pool(const BatchInput&, std::vector<float>&) {
    fail("this model cannot pool hidden states into embeddings");
}

namespace {

// out[c] += rms_norm(x)[c] * weight[c] over one row of H values, as Hugging Face's RMSNorm: the
// mean square in full precision, then x * rsqrt(mean + eps) * weight.
void add_normed_row(const float* x, const float* weight, int64_t H, float eps, double* out) {
    double ss = 0;
    for (int64_t c = 0; c < H; ++c) ss += static_cast<double>(x[c]) * x[c];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(H) + eps);
    for (int64_t c = 0; c < H; ++c) out[c] += static_cast<double>(x[c]) * inv * weight[c];
}

}  // namespace

void LlamaModel::pool(const BatchInput& batch, std::vector<float>& out) {
    const std::vector<int32_t>& ranges = batch.pool_ranges;
    PG_CHECK(ranges.size() % 2 == 0, "pool_ranges holds (begin, end) pairs");
    if (!last_stage()) fail("pooling needs the last pipeline stage's hidden states");
    const int64_t H = config_.hidden_size, k = static_cast<int64_t>(ranges.size() / 2);
    if (final_norm_host_.empty()) {
        PG_CHECK(weights_.final_norm.dtype == DType::F32, "the final norm's weight is placed as f32");
        final_norm_host_.resize(static_cast<size_t>(H));
        backend_.download(weights_.final_norm, final_norm_host_.data());
    }
    // One read-back of the span the ranges cover (they come in batch order), unless it is mostly
    // rows no range wants: then one per range.
    int64_t lo = batch.num_tokens(), hi = 0, wanted = 0;
    for (int64_t i = 0; i < k; ++i) {
        const int64_t b = ranges[2 * i], e = ranges[2 * i + 1];
        PG_CHECK(0 <= b && b <= e && e <= batch.num_tokens(), "a pool range outside the batch");
        if (b == e) continue;
        lo = std::min(lo, b);
        hi = std::max(hi, e);
        wanted += e - b;
    }
    const float* residual = static_cast<const float*>(ws_.residual.data);
    auto read_rows = [&](int64_t b, int64_t e, float* dst) {
        backend_.download(Tensor(const_cast<float*>(residual) + b * H, DType::F32, {e - b, H}, ws_.residual.device),
                          dst);
    };
    const bool span = hi > lo && hi - lo <= 2 * wanted;
    if (span) {
        pool_rows_.resize(static_cast<size_t>((hi - lo) * H));
        read_rows(lo, hi, pool_rows_.data());
    }
    std::vector<double> sum(static_cast<size_t>(H));
    out.assign(static_cast<size_t>(k * H), 0.0f);
    for (int64_t i = 0; i < k; ++i) {
        const int64_t b = ranges[2 * i], e = ranges[2 * i + 1];
        if (b == e) continue;
        const float* rows = pool_rows_.data();
        if (span) {
            rows += (b - lo) * H;
        } else {
            pool_rows_.resize(static_cast<size_t>((e - b) * H));
            read_rows(b, e, pool_rows_.data());
            rows = pool_rows_.data();
        }
        std::fill(sum.begin(), sum.end(), 0.0);
        for (int64_t r = 0; r < e - b; ++r)
            add_normed_row(rows + r * H, final_norm_host_.data(), H, config_.rms_norm_eps, sum.data());
        for (int64_t c = 0; c < H; ++c) out[static_cast<size_t>(i * H + c)] = static_cast<float>(sum[c]);
    }
}

}  // namespace peregrine
