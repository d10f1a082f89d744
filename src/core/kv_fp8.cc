#include "core/kv_fp8.h"

#include <array>
#include <cmath>

#include "core/error.h"
#include "core/half.h"

namespace peregrine {

namespace {
// E4M3 code -> f32 value, all 256 codes (0x7f / 0xff: NaN).
const std::array<float, 256>& e4m3_values() {
    static const std::array<float, 256> table = [] {
        std::array<float, 256> t{};
        for (int c = 0; c < 256; ++c) t[c] = f8e4m3_to_f32(static_cast<uint8_t>(c));
        return t;
    }();
    return table;
}
}  // namespace

KvFp8Layout kv_fp8_layout(const Tensor& cache) {
    PG_CHECK(cache.dtype == DType::F8_E4M3 && cache.ndim == 4 && cache.cols() > 2,
             "an FP8 KV cache is an f8_e4m3 [blocks, block_size, kv_heads, head_dim + 2] tensor, got ",
             dtype_name(cache.dtype), " ", cache.shape_str());
    return {cache.dim(1), cache.dim(2), cache.cols() - 2};
}

uint16_t kv_fp8_scale(float amax) {
    const uint16_t s = f32_to_bf16(amax / kKvFp8Max);
    return (s & 0x7fffu) == 0 ? f32_to_bf16(1.0f) : s;
}

void kv_fp8_quantize_head(const float* x, int64_t head_dim, uint8_t* codes, uint16_t* scale) {
    float amax = 0.0f;
    for (int64_t d = 0; d < head_dim; ++d) amax = std::fmax(amax, std::fabs(x[d]));
    *scale = kv_fp8_scale(amax);
    const float inv = 1.0f / bf16_to_f32(*scale);
    for (int64_t d = 0; d < head_dim; ++d) codes[d] = f32_to_f8e4m3(x[d] * inv);
}

void kv_fp8_dequantize_head(const uint8_t* codes, uint16_t scale, int64_t head_dim, float* out) {
    const std::array<float, 256>& v = e4m3_values();
    const float s = bf16_to_f32(scale);
    for (int64_t d = 0; d < head_dim; ++d) out[d] = v[codes[d]] * s;
}

}  // namespace peregrine
