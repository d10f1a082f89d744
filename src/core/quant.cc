#include "core/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"

namespace peregrine {

namespace {

void dequantize_q8_0(const uint8_t* src, float* dst, int64_t nblocks) {
    for (int64_t i = 0; i < nblocks; ++i) {
        const auto b = load_block<BlockQ8_0>(src, i);
        const float d = f16_to_f32(b.d);
        float* y = dst + i * kQK8_0;
        for (int j = 0; j < kQK8_0; ++j) y[j] = d * static_cast<float>(b.qs[j]);
    }
}

void dequantize_q4_0(const uint8_t* src, float* dst, int64_t nblocks) {
    constexpr int kHalf = kQK4_0 / 2;
    for (int64_t i = 0; i < nblocks; ++i) {
        const auto b = load_block<BlockQ4_0>(src, i);
        const float d = f16_to_f32(b.d);
        float* y = dst + i * kQK4_0;
        for (int j = 0; j < kHalf; ++j) {
            y[j] = d * static_cast<float>((b.qs[j] & 0xF) - 8);
            y[j + kHalf] = d * static_cast<float>((b.qs[j] >> 4) - 8);
        }
    }
}

void dequantize_q4_k(const uint8_t* src, float* dst, int64_t nblocks) {
    for (int64_t i = 0; i < nblocks; ++i) {
        const auto b = load_block<BlockQ4_K>(src, i);
        const float d = f16_to_f32(b.d);
        const float dmin = f16_to_f32(b.dmin);
        float* y = dst + i * kQK_K;
        // Four chunks of 64 elements: 32 from the low nibbles of 32 bytes, then 32 from the high.
        for (int c = 0; c < 4; ++c) {
            const uint8_t* q = b.qs + 32 * c;
            uint8_t sc_lo, m_lo, sc_hi, m_hi;
            q4_k_scale_min(b.scales, 2 * c, &sc_lo, &m_lo);
            q4_k_scale_min(b.scales, 2 * c + 1, &sc_hi, &m_hi);
            const float d_lo = d * sc_lo, min_lo = dmin * m_lo;
            const float d_hi = d * sc_hi, min_hi = dmin * m_hi;
            float* y_lo = y + 64 * c;
            float* y_hi = y_lo + 32;
            for (int l = 0; l < 32; ++l) {
                y_lo[l] = d_lo * static_cast<float>(q[l] & 0xF) - min_lo;
                y_hi[l] = d_hi * static_cast<float>(q[l] >> 4) - min_hi;
            }
        }
    }
}

void dequantize_q6_k(const uint8_t* src, float* dst, int64_t nblocks) {
    int8_t q[kQK_K];
    for (int64_t i = 0; i < nblocks; ++i) {
        const auto b = load_block<BlockQ6_K>(src, i);
        const float d = f16_to_f32(b.d);
        q6_k_codes(b, q);
        float* y = dst + i * kQK_K;
        for (int e = 0; e < kQK_K; ++e)  // sub-blocks of 16 elements, one scale each
            y[e] = d * static_cast<float>(b.scales[e / 16]) * static_cast<float>(q[e]);
    }
}

}  // namespace

void q6_k_codes(const BlockQ6_K& b, int8_t q[kQK_K]) {
    for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = b.ql + 64 * h;
        const uint8_t* qh = b.qh + 32 * h;
        int8_t* y = q + 128 * h;
        for (int l = 0; l < 32; ++l) {
            y[l] = static_cast<int8_t>(((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
            y[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            y[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            y[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

void q4_k_scale_min(const uint8_t* scales, int j, uint8_t* sc, uint8_t* m) {
    if (j < 4) {
        *sc = scales[j] & 63;
        *m = scales[j + 4] & 63;
    } else {
        *sc = static_cast<uint8_t>((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
        *m = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
    }
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
    PG_CHECK(n >= 0 && n % dtype_block_size(t) == 0, n, " elements of ", dtype_name(t),
             " is not a whole number of blocks");
    const auto* s = static_cast<const uint8_t*>(src);
    const int64_t nblocks = n / dtype_block_size(t);
    switch (t) {
        case DType::F32:
            if (n > 0) std::memcpy(dst, s, static_cast<size_t>(n) * sizeof(float));
            return;
        case DType::F16:
            for (int64_t i = 0; i < n; ++i) {
                uint16_t h;
                std::memcpy(&h, s + 2 * i, 2);
                dst[i] = f16_to_f32(h);
            }
            return;
        case DType::BF16:
            for (int64_t i = 0; i < n; ++i) {
                uint16_t h;
                std::memcpy(&h, s + 2 * i, 2);
                dst[i] = bf16_to_f32(h);
            }
            return;
        case DType::Q8_0:
            dequantize_q8_0(s, dst, nblocks);
            return;
        case DType::Q4_0:
            dequantize_q4_0(s, dst, nblocks);
            return;
        case DType::Q4_K:
            dequantize_q4_k(s, dst, nblocks);
            return;
        case DType::Q6_K:
            dequantize_q6_k(s, dst, nblocks);
            return;
        case DType::F8_E4M3:  // the values alone: a row's factor (Tensor::scale) is the caller's
            for (int64_t i = 0; i < n; ++i) dst[i] = f8e4m3_to_f32(s[i]);
            return;
        case DType::GQ8_32:  // device layouts: codes and factors are not in blocks (core/gpu_quant.h)
        case DType::GQ8_16:
        case DType::GQ4_32:
        case DType::GQ6_32:
            PG_CHECK(false, "dequantize_row: ", dtype_name(t), " is a GPU layout, not a row of blocks");
            return;
        case DType::I32:
            break;
    }
    PG_CHECK(false, "dequantize_row: ", dtype_name(t), " is not a floating-point type");
}

void dequantize_tensor_row(const Tensor& t, int64_t r, float* dst, int64_t first, int64_t n) {
    if (n < 0) n = t.cols() - first;
    PG_CHECK(r >= 0 && r < t.rows() && first >= 0 && first + n <= t.cols() && first % dtype_block_size(t.dtype) == 0,
             "row ", r, " elements ", first, "+", n, " of ", t.shape_str());
    dequantize_row(t.dtype, static_cast<const uint8_t*>(t.row(r)) + dtype_row_bytes(t.dtype, first), dst, n);
    if (t.dtype != DType::F8_E4M3) return;
    PG_CHECK(t.scale != nullptr, "f8_e4m3 tensor ", t.shape_str(), " without row factors");
    const float f = t.scale[r];
    for (int64_t i = 0; i < n; ++i) dst[i] *= f;
}

int act_offset(DType w) {
    switch (w) {
        case DType::Q8_0:
            return 128;
        case DType::Q4_0:
            return 8;
        case DType::Q6_K:
            return 32;
        default:
            return 0;
    }
}

int act_offset_block(DType w) {
    return w == DType::Q6_K ? 16 : 32;
}

void quantize_act_row(DType w, const float* x, int64_t k, void* dst) {
    PG_CHECK(k % kActBlock == 0, "activation rows of ", k, " values are not whole blocks of 32");
    const ActRow r = act_row(dst, k);
    const int c = act_offset(w), g = act_offset_block(w);
    for (int64_t b = 0; b < k / kActBlock; ++b) {
        const float* xb = x + b * kActBlock;
        float amax = 0.0f;
        for (int i = 0; i < kActBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int i = 0; i < kActBlock; ++i) {
            const int q = static_cast<int>(std::nearbyint(xb[i] * id));  // round half to even
            r.q[b * kActBlock + i] = static_cast<int8_t>(q);
            sum += q;
        }
        r.d[b] = amax / 127.0f;
        r.xs[b] = r.d[b] * static_cast<float>(sum);
    }
    for (int64_t s = 0; s < k / 16; ++s) r.off[s] = 0;
    for (int64_t s = 0; c != 0 && s < k / g; ++s) {
        int sum = 0;
        for (int i = 0; i < g; ++i) sum += r.q[s * g + i];
        r.off[s] = -c * sum;
    }
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
    PG_CHECK(n >= 0 && n % kQK8_0 == 0, n, " elements is not a whole number of Q8_0 blocks");
    auto* out = static_cast<uint8_t*>(dst);
    for (int64_t i = 0; i < n / kQK8_0; ++i) {
        const float* x = src + i * kQK8_0;
        float amax = 0.0f;
        for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        BlockQ8_0 b;
        b.d = f32_to_f16(d);
        for (int j = 0; j < kQK8_0; ++j) {
            // |x * id| <= 127 up to one rounding step; the clamp only guards that last ulp.
            b.qs[j] = static_cast<int8_t>(std::clamp(std::round(x[j] * id), -127.0f, 127.0f));
        }
        std::memcpy(out + i * static_cast<int64_t>(sizeof(BlockQ8_0)), &b, sizeof(BlockQ8_0));
    }
}

}  // namespace peregrine
