// Kernel bodies shared by the ISA translation units. Include once per TU after defining
// PG_KERNEL_AVX512 or PG_KERNEL_AVX2; everything lands in an ISA-named namespace.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/kernels.h"

namespace peregrine::cpu::PG_KERNEL_NS {
namespace {

#if defined(PG_KERNEL_AVX512)
using VF = __m512;
constexpr int kW = 16;
inline VF vzero() {
    return _mm512_setzero_ps();
}
inline VF vset1(float v) {
    return _mm512_set1_ps(v);
}
inline VF vload(const float* p) {
    return _mm512_loadu_ps(p);
}
inline void vstore(float* p, VF v) {
    _mm512_storeu_ps(p, v);
}
inline VF vfma(VF a, VF b, VF c) {
    return _mm512_fmadd_ps(a, b, c);
}
inline VF vmul(VF a, VF b) {
    return _mm512_mul_ps(a, b);
}
inline VF vadd(VF a, VF b) {
    return _mm512_add_ps(a, b);
}
inline VF vsub(VF a, VF b) {
    return _mm512_sub_ps(a, b);
}
inline float vsum(VF a) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
inline VF load_bf16(const void* p) {
    const __m256i h = _mm256_loadu_si256(static_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline VF load_f16(const void* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
}
inline VF load_i8(const void* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p))));
}
#elif defined(PG_KERNEL_AVX2)
using VF = __m256;
constexpr int kW = 8;
inline VF vzero() {
    return _mm256_setzero_ps();
}
inline VF vset1(float v) {
    return _mm256_set1_ps(v);
}
inline VF vload(const float* p) {
    return _mm256_loadu_ps(p);
}
inline void vstore(float* p, VF v) {
    _mm256_storeu_ps(p, v);
}
inline VF vfma(VF a, VF b, VF c) {
    return _mm256_fmadd_ps(a, b, c);
}
inline VF vmul(VF a, VF b) {
    return _mm256_mul_ps(a, b);
}
inline VF vadd(VF a, VF b) {
    return _mm256_add_ps(a, b);
}
inline VF vsub(VF a, VF b) {
    return _mm256_sub_ps(a, b);
}
inline float vsum(VF a) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
inline VF load_bf16(const void* p) {
    const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline VF load_f16(const void* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p)));
}
inline VF load_i8(const void* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(p))));
}
#else
#error "define PG_KERNEL_AVX512 or PG_KERNEL_AVX2"
#endif

inline float half_to_float(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// Weight-row readers: `load` gives kW consecutive weights from element k as f32 (k a multiple
// of kW), `at` one weight (for the tail of rows whose length is not a multiple of kW).
struct WF32 {
    static const uint8_t* addr(const uint8_t* row, int64_t k) { return row + 4 * k; }
    static VF load(const uint8_t* row, int64_t k) { return vload(reinterpret_cast<const float*>(row) + k); }
    static float at(const uint8_t* row, int64_t k) {
        float v;
        std::memcpy(&v, row + 4 * k, 4);
        return v;
    }
};
struct WBF16 {
    static const uint8_t* addr(const uint8_t* row, int64_t k) { return row + 2 * k; }
    static VF load(const uint8_t* row, int64_t k) { return load_bf16(row + 2 * k); }
    static float at(const uint8_t* row, int64_t k) {
        uint16_t h;
        std::memcpy(&h, row + 2 * k, 2);
        const uint32_t u = static_cast<uint32_t>(h) << 16;
        float v;
        std::memcpy(&v, &u, 4);
        return v;
    }
};
struct WF16 {
    static const uint8_t* addr(const uint8_t* row, int64_t k) { return row + 2 * k; }
    static VF load(const uint8_t* row, int64_t k) { return load_f16(row + 2 * k); }
    static float at(const uint8_t* row, int64_t k) { return half_to_float(row + 2 * k); }
};
// Q8_0: blocks of 34 bytes, f16 scale then 32 int8; kW divides 32, so a load stays in one block.
struct WQ8_0 {
    static const uint8_t* addr(const uint8_t* row, int64_t k) { return row + (k >> 5) * 34; }
    static VF load(const uint8_t* row, int64_t k) {
        const uint8_t* b = row + (k >> 5) * 34;
        return vmul(load_i8(b + 2 + (k & 31)), vset1(half_to_float(b)));
    }
    static float at(const uint8_t* row, int64_t k) {
        const uint8_t* b = row + (k >> 5) * 34;
        return half_to_float(b) * static_cast<float>(static_cast<int8_t>(b[2 + (k & 31)]));
    }
};

// out[r][c] = dot(w[r], x[c]) over k elements: an R x C register tile.
template <class WL, int R, int C>
inline void tile(const uint8_t* const* w, const float* const* x, int64_t k, float (&out)[R][C]) {
    VF acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = vzero();
    const int64_t kv = k - k % kW;
    int64_t i = 0;
    for (; i < kv; i += kW) {
        VF xv[C];
        for (int c = 0; c < C; ++c) xv[c] = vload(x[c] + i);
        for (int r = 0; r < R; ++r) {
            // Decode streams the weights from DRAM: prefetch 4 KiB ahead, about once a line.
            if (i % (2 * kW) == 0) _mm_prefetch(reinterpret_cast<const char*>(WL::addr(w[r], i)) + 4096, _MM_HINT_T0);
            const VF wv = WL::load(w[r], i);
            for (int c = 0; c < C; ++c) acc[r][c] = vfma(wv, xv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) out[r][c] = vsum(acc[r][c]);
    for (; i < k; ++i) {
        for (int r = 0; r < R; ++r) {
            const float wv = WL::at(w[r], i);
            // Explicit fma: a contraction the compiler may or may not make would change bits
            // between this and gemm_rows.
            for (int c = 0; c < C; ++c) out[r][c] = std::fma(wv, x[c][i], out[r][c]);
        }
    }
}

// Writes an R x C tile of results (plus bias) into out[t + c][m + r].
template <int R, int C>
inline void store_tile(const MatmulArgs& a, int64_t m, int64_t t, const float (&acc)[R][C]) {
    for (int r = 0; r < R; ++r) {
        const float b = a.bias ? a.bias[m + r] : 0.0f;
        for (int c = 0; c < C; ++c) a.out[(t + c) * a.m + m + r] = acc[r][c] + b;
    }
}

// Tokens are processed in blocks so that the block's activations stay in L2 while every
// weight row tile streams past them once.
constexpr int64_t kTokenBlock = 64;
constexpr int kRowTile = 4;
constexpr int kColTile = 4;

// Walks output rows [m_begin, m_end) in tiles of kRowTile weight rows x kColTile tokens;
// `tile.template run<R, C>(m, t)` computes and stores one tile.
template <int R, class Tile>
inline void run_cols(const Tile& tile, int64_t m, int64_t t, int64_t cols) {
    switch (cols) {
        case 1:
            tile.template run<R, 1>(m, t);
            break;
        case 2:
            tile.template run<R, 2>(m, t);
            break;
        case 3:
            tile.template run<R, 3>(m, t);
            break;
        default:
            tile.template run<R, 4>(m, t);
            break;
    }
}

template <class Tile>
void for_each_tile(const MatmulArgs& a, int64_t m_begin, int64_t m_end, const Tile& tile) {
    for (int64_t tb = 0; tb < a.n; tb += kTokenBlock) {
        const int64_t te = std::min(a.n, tb + kTokenBlock);
        int64_t m = m_begin;
        for (; m + kRowTile <= m_end; m += kRowTile)
            for (int64_t t = tb; t < te; t += kColTile)
                run_cols<kRowTile>(tile, m, t, std::min<int64_t>(kColTile, te - t));
        for (; m < m_end; ++m)
            for (int64_t t = tb; t < te; t += kColTile) run_cols<1>(tile, m, t, std::min<int64_t>(kColTile, te - t));
    }
}

// f32 activations times weights read by WL.
template <class WL>
struct F32Tile {
    const MatmulArgs& a;
    template <int R, int C>
    void run(int64_t m, int64_t t) const {
        const uint8_t* w[R];
        const float* x[C];
        for (int r = 0; r < R; ++r) w[r] = static_cast<const uint8_t*>(a.w) + (m + r) * a.w_row_bytes;
        for (int c = 0; c < C; ++c) x[c] = a.x + (t + c) * a.k;
        float out[R][C];
        tile<WL, R, C>(w, x, a.k, out);
        store_tile<R, C>(a, m, t, out);
    }
};

// --- blocked GEMM for prefill (f32 activations) ------------------------------------------------
//
// Each output is the same sum as tile() computes, bit for bit: one vector accumulator per
// (row, token) taking the k-steps of kW in order, then vsum and the scalar tail. Only the loop
// order changes, so results do not depend on the batch size. Blocks: kGemmMc weight rows are
// converted to f32 once per chunk of kGemmKc elements (kept in L1/L2) and meet every token of
// the batch in kGR x kGC register tiles; the vector accumulators live in a per-thread buffer
// between chunks.
constexpr int kGR = 4, kGC = 6;  // 24 accumulators
constexpr int64_t kGemmMc = 48, kGemmKc = 512, kGemmNc = 192;
constexpr int64_t kGemmLdw = kGemmKc + 16;  // floats between converted rows: no 4 KiB aliasing
constexpr int64_t kGemmMinTokens = 8;

#if defined(PG_KERNEL_AVX512)
// vsum of 16 vectors v[i * stride] at once: element i of the result is vsum(v[i * stride]),
// with the same additions in the same order (pairs i, i+8; then i, i+4; i, i+2; i, i+1).
inline VF vsum16(const VF* v, int64_t stride) {
    // After the four stages, slot s holds the sum of input 4 * (s % 4) + s / 4: feed inputs so.
    VF h[8];
    for (int p = 0; p < 8; ++p) {
        const int s0 = 2 * p, s1 = 2 * p + 1;
        const VF a = v[(4 * (s0 % 4) + s0 / 4) * stride], b = v[(4 * (s1 % 4) + s1 / 4) * stride];
        h[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    }
    VF q[4];
    for (int p = 0; p < 4; ++p)
        q[p] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * p], h[2 * p + 1], 0x88),
                             _mm512_shuffle_f32x4(h[2 * p], h[2 * p + 1], 0xDD));
    VF t[2];
    for (int p = 0; p < 2; ++p)
        t[p] = _mm512_add_ps(_mm512_shuffle_ps(q[2 * p], q[2 * p + 1], 0x44),
                             _mm512_shuffle_ps(q[2 * p], q[2 * p + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(t[0], t[1], 0x88), _mm512_shuffle_ps(t[0], t[1], 0xDD));
}
#endif

template <int R, int C>
inline void gemm_micro(const float* wp, const float* x, int64_t ldx, int64_t kc, VF* acc, bool first) {
    VF c_[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) c_[r][c] = first ? vzero() : acc[c * kGemmMc + r];
#pragma GCC unroll 2  // measured ~10% faster: the loads of one step overlap the FMAs of the other
    for (int64_t i = 0; i < kc; i += kW) {
        VF wv[R];
        for (int r = 0; r < R; ++r) wv[r] = vload(wp + r * kGemmLdw + i);
        for (int c = 0; c < C; ++c) {
            const VF xv = vload(x + c * ldx + i);
            for (int r = 0; r < R; ++r) c_[r][c] = vfma(wv[r], xv, c_[r][c]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[c * kGemmMc + r] = c_[r][c];
}

template <int R>
inline void gemm_micro_cols(int cols, const float* wp, const float* x, int64_t ldx, int64_t kc, VF* acc, bool first) {
    switch (cols) {
        case 1:
            return gemm_micro<R, 1>(wp, x, ldx, kc, acc, first);
        case 2:
            return gemm_micro<R, 2>(wp, x, ldx, kc, acc, first);
        case 3:
            return gemm_micro<R, 3>(wp, x, ldx, kc, acc, first);
        case 4:
            return gemm_micro<R, 4>(wp, x, ldx, kc, acc, first);
        case 5:
            return gemm_micro<R, 5>(wp, x, ldx, kc, acc, first);
        default:
            return gemm_micro<R, kGC>(wp, x, ldx, kc, acc, first);
    }
}

template <class WL>
void gemm_rows(const MatmulArgs& a, int64_t m_begin, int64_t m_end) {
    // Per thread, grown once: converted weights [kGemmMc][kGemmLdw] and accumulators [kGemmNc][kGemmMc]
    // (a token's 16-row groups contiguous for vsum16; row-major at a 12 KiB stride thrashed L1).
    thread_local std::vector<float> buf;
    const size_t w_floats = kGemmMc * kGemmLdw, acc_floats = kGemmMc * kGemmNc * kW;
    if (buf.size() < w_floats + acc_floats + 16) buf.resize(w_floats + acc_floats + 16);
    float* wp = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t{63});
    VF* accb = reinterpret_cast<VF*>(wp + w_floats);
    const int64_t kv = a.k - a.k % kW;
    const uint8_t* w = static_cast<const uint8_t*>(a.w);
    for (int64_t jc = 0; jc < a.n; jc += kGemmNc) {
        const int64_t nc = std::min(kGemmNc, a.n - jc);
        for (int64_t ic = m_begin; ic < m_end; ic += kGemmMc) {
            const int64_t mc = std::min(kGemmMc, m_end - ic);
            for (int64_t pc = 0; pc < kv; pc += kGemmKc) {
                const int64_t kc = std::min(kGemmKc, kv - pc);
                for (int64_t r = 0; r < mc; ++r) {
                    const uint8_t* row = w + (ic + r) * a.w_row_bytes;
                    for (int64_t i = 0; i < kc; i += kW) vstore(wp + r * kGemmLdw + i, WL::load(row, pc + i));
                }
                // While the tiles run, prefetch the weights of the next chunk (these rows further
                // on, or the next rows from the start) into L2, a share per tile column.
                const bool same_rows = pc + kGemmKc < kv;
                const int64_t next_ic = same_rows ? ic : ic + kGemmMc, next_pc = same_rows ? pc + kGemmKc : 0;
                const int64_t next_mc = std::max<int64_t>(0, std::min(kGemmMc, m_end - next_ic));
                const int64_t row_lines = (WL::addr(w, std::min(kGemmKc, kv - next_pc)) - w + 63) / 64;
                const int64_t rows_per = next_mc / (nc / kGC + 1) + 1;  // rows prefetched per tile column
                int64_t pf_row = 0;
                for (int64_t jr = 0, cols; jr < nc; jr += cols) {
                    for (const int64_t e = std::min(next_mc, pf_row + rows_per); pf_row < e; ++pf_row) {
                        const char* p =
                            reinterpret_cast<const char*>(WL::addr(w + (next_ic + pf_row) * a.w_row_bytes, next_pc));
                        for (int64_t l = 0; l < row_lines; ++l) _mm_prefetch(p + 64 * l, _MM_HINT_T1);
                    }
                    // Tiles of kGC tokens; a remainder of 7 or 8 as 4 + 3 or 4 + 4 (thin tiles
                    // reload the weights for few FMAs).
                    cols = nc - jr == 7 || nc - jr == 8 ? 4 : std::min<int64_t>(kGC, nc - jr);
                    const float* x = a.x + (jc + jr) * a.k + pc;
                    int64_t ir = 0;
                    for (; ir + kGR <= mc; ir += kGR)
                        gemm_micro_cols<kGR>(static_cast<int>(cols), wp + ir * kGemmLdw, x, a.k, kc,
                                             accb + jr * kGemmMc + ir, pc == 0);
                    for (; ir < mc; ++ir)
                        gemm_micro_cols<1>(static_cast<int>(cols), wp + ir * kGemmLdw, x, a.k, kc,
                                           accb + jr * kGemmMc + ir, pc == 0);
                }
            }
            int64_t r0 = 0;
#if defined(PG_KERNEL_AVX512)
            for (; r0 + 16 <= mc; r0 += 16) {
                const VF b = a.bias ? vload(a.bias + ic + r0) : vzero();
                for (int64_t c = 0; c < nc; ++c) {
                    VF v = kv > 0 ? vsum16(accb + c * kGemmMc + r0, 1) : vzero();
                    if (kv < a.k) {  // rows whose length is not a multiple of 16: the scalar tail
                        alignas(64) float t[16];
                        vstore(t, v);
                        const float* xr = a.x + (jc + c) * a.k;
                        for (int r = 0; r < 16; ++r) {
                            const uint8_t* row = w + (ic + r0 + r) * a.w_row_bytes;
                            for (int64_t i = kv; i < a.k; ++i) t[r] = std::fma(WL::at(row, i), xr[i], t[r]);
                        }
                        v = vload(t);
                    }
                    vstore(a.out + (jc + c) * a.m + ic + r0, _mm512_add_ps(v, b));
                }
            }
#endif
            for (int64_t r = r0; r < mc; ++r) {
                const uint8_t* row = w + (ic + r) * a.w_row_bytes;
                const float b = a.bias ? a.bias[ic + r] : 0.0f;
                for (int64_t c = 0; c < nc; ++c) {
                    const float* xr = a.x + (jc + c) * a.k;
                    float v = kv > 0 ? vsum(accb[c * kGemmMc + r]) : 0.0f;
                    for (int64_t i = kv; i < a.k; ++i) v = std::fma(WL::at(row, i), xr[i], v);
                    a.out[(jc + c) * a.m + ic + r] = v + b;
                }
            }
        }
    }
}

template <class WL>
void matmul_rows_t(const MatmulArgs& a, int64_t m_begin, int64_t m_end) {
    if (a.n >= kGemmMinTokens) return gemm_rows<WL>(a, m_begin, m_end);
    if (a.n == 1) {  // decode: one sequential weight stream (see qkernels_impl.h)
        const F32Tile<WL> tile{a};
        for (int64_t m = m_begin; m < m_end; ++m) tile.template run<1, 1>(m, 0);
        return;
    }
    for_each_tile(a, m_begin, m_end, F32Tile<WL>{a});
}

void matmul_rows(const MatmulArgs& a, int64_t m_begin, int64_t m_end) {
    switch (a.w_dtype) {
        case DType::F32:
            matmul_rows_t<WF32>(a, m_begin, m_end);
            break;
        case DType::BF16:
            matmul_rows_t<WBF16>(a, m_begin, m_end);
            break;
        case DType::F16:
            matmul_rows_t<WF16>(a, m_begin, m_end);
            break;
        case DType::Q8_0:
            matmul_rows_t<WQ8_0>(a, m_begin, m_end);
            break;
        default:
            __builtin_trap();  // the backend checks matmul_supports first
    }
}

float dot(const float* a, const float* b, int64_t n) {
    VF acc0 = vzero(), acc1 = vzero();
    int64_t i = 0;
    for (; i + 2 * kW <= n; i += 2 * kW) {
        acc0 = vfma(vload(a + i), vload(b + i), acc0);
        acc1 = vfma(vload(a + i + kW), vload(b + i + kW), acc1);
    }
    for (; i + kW <= n; i += kW) acc0 = vfma(vload(a + i), vload(b + i), acc0);
    float s = vsum(acc0) + vsum(acc1);
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

void axpy(float alpha, const float* x, float* y, int64_t n) {
    const VF va = vset1(alpha);
    int64_t i = 0;
    for (; i + kW <= n; i += kW) vstore(y + i, vfma(va, vload(x + i), vload(y + i)));
    for (; i < n; ++i) y[i] += alpha * x[i];
}

// exp(x) for x in [-87, 88] (clamped there): 2^n * p(r), n = round(x / ln 2), r = x - n ln 2 in
// two steps (Cody-Waite), p the degree-6 Taylor polynomial (|r| <= ln 2 / 2: error ~2e-7).
inline VF vexp(VF x) {
#if defined(PG_KERNEL_AVX512)
    x = _mm512_min_ps(_mm512_max_ps(x, vset1(-87.0f)), vset1(88.0f));
    const VF n = _mm512_roundscale_ps(vmul(x, vset1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
#else
    x = _mm256_min_ps(_mm256_max_ps(x, vset1(-87.0f)), vset1(88.0f));
    const VF n = _mm256_round_ps(vmul(x, vset1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#endif
    VF r = vfma(n, vset1(-0.693359375f), x);  // ln 2 = 0.693359375 - 2.12194440e-4, the first part exact
    r = vfma(n, vset1(2.12194440e-4f), r);
    VF p = vset1(1.0f / 720);
    p = vfma(p, r, vset1(1.0f / 120));
    p = vfma(p, r, vset1(1.0f / 24));
    p = vfma(p, r, vset1(1.0f / 6));
    p = vfma(p, r, vset1(0.5f));
    p = vfma(p, r, vset1(1.0f));
    p = vfma(p, r, vset1(1.0f));
#if defined(PG_KERNEL_AVX512)
    return _mm512_scalef_ps(p, n);
#else
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return vmul(p, _mm256_castsi256_ps(e));
#endif
}

inline VF silu_mul_v(VF g, VF u) {
#if defined(PG_KERNEL_AVX512)
    return vmul(_mm512_div_ps(g, _mm512_add_ps(vset1(1.0f), vexp(_mm512_sub_ps(vzero(), g)))), u);
#else
    return vmul(_mm256_div_ps(g, _mm256_add_ps(vset1(1.0f), vexp(_mm256_sub_ps(vzero(), g)))), u);
#endif
}

void silu_mul(const float* g, const float* u, float* out, int64_t n) {
    int64_t i = 0;
    for (; i + kW <= n; i += kW) vstore(out + i, silu_mul_v(vload(g + i), vload(u + i)));
    if (i < n) {  // the same arithmetic for the tail, so results do not depend on where threads split
        float gt[kW] = {}, ut[kW] = {}, ot[kW];
        std::memcpy(gt, g + i, (n - i) * sizeof(float));
        std::memcpy(ut, u + i, (n - i) * sizeof(float));
        vstore(ot, silu_mul_v(vload(gt), vload(ut)));
        std::memcpy(out + i, ot, (n - i) * sizeof(float));
    }
}

void to_bf16(const float* src, uint16_t* dst, int64_t n) {
    int64_t i = 0;
#if defined(PG_KERNEL_AVX512)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
#endif
    for (; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, src + i, 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) {
            dst[i] = static_cast<uint16_t>((u >> 16) | 0x40);
        } else {
            u += 0x7fffu + ((u >> 16) & 1u);
            dst[i] = static_cast<uint16_t>(u >> 16);
        }
    }
}

#if defined(PG_KERNEL_AVX512)
// bf16 pairs: each vdpbf16ps multiplies 32 bf16 pairs and adds adjacent products into 16 f32
// lanes. k runs in steps of 32 with a masked final step, so any row length works.
template <int R, int C>
inline void tile_bf16(const uint16_t* const* w, const uint16_t* const* x, int64_t k, float (&out)[R][C]) {
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 32) {
        const __mmask32 mask = k - i >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << (k - i)) - 1);
        __m512i xv[C];
        for (int c = 0; c < C; ++c) xv[c] = _mm512_maskz_loadu_epi16(mask, x[c] + i);
        for (int r = 0; r < R; ++r) {
            const __m512i wv = _mm512_maskz_loadu_epi16(mask, w[r] + i);
            for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)wv, (__m512bh)xv[c]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) out[r][c] = vsum(acc[r][c]);
}

struct Bf16Tile {
    const MatmulArgs& a;
    const uint16_t* xb;  // [n, k] bf16
    template <int R, int C>
    void run(int64_t m, int64_t t) const {
        const uint16_t* w[R];
        const uint16_t* x[C];
        for (int r = 0; r < R; ++r)
            w[r] = reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(a.w) + (m + r) * a.w_row_bytes);
        for (int c = 0; c < C; ++c) x[c] = xb + (t + c) * a.k;
        float out[R][C];
        tile_bf16<R, C>(w, x, a.k, out);
        store_tile<R, C>(a, m, t, out);
    }
};

void matmul_bf16_rows(const MatmulArgs& a, const uint16_t* xb, int64_t m_begin, int64_t m_end) {
    for_each_tile(a, m_begin, m_end, Bf16Tile{a, xb});
}
constexpr auto kMatmulBf16 = &matmul_bf16_rows;
#else
constexpr void (*kMatmulBf16)(const MatmulArgs&, const uint16_t*, int64_t, int64_t) = nullptr;
#endif

}  // namespace

// Attention with the head size known at compile time, for one query token and the GQA group of
// one kv head: scores of 8 keys at a time (8-float vectors, GCC vector extensions, 256-bit in
// both ISAs), the softmax's exp in the ISA's width, then the weighted values. Every step's order
// depends only on the key range, so a token's output is the same bits in prefill, in a chunk or
// in a decode step.
typedef float v8f __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
    v8f v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}
inline void store8(float* p, v8f v) {
    std::memcpy(p, &v, sizeof(v));
}
// Calls f(j, slot) for the keys j = 0.. of positions [first, last] in order, slot being the
// position's cache slot through the sequence's block table: a block's slots are consecutive, so
// the division by the block size is paid once a block, not once a key.
template <class F>
inline void for_each_key(const AttentionArgs& a, F&& f) {
    int pos = a.first;
    while (pos <= a.last) {
        const int block = pos / a.block_size;
        const int end = std::min(a.last + 1, (block + 1) * a.block_size);
        int64_t slot = static_cast<int64_t>(a.table[block]) * a.block_size + pos % a.block_size;
        for (; pos < end; ++pos, ++slot) f(pos - a.first, slot);
    }
}

// Calls f(j0, slot, count) for the keys in runs of 8 (the last run may be shorter): keys j0 ..
// j0 + count - 1 sit in cache slots slot[0 .. count - 1].
template <class F>
inline void for_each_8_keys(const AttentionArgs& a, F&& f) {
    int64_t slot[8];
    int filled = 0, j0 = 0;
    for_each_key(a, [&](int, int64_t s) {
        slot[filled++] = s;
        if (filled == 8) {
            f(j0, slot, 8);
            j0 += 8;
            filled = 0;
        }
    });
    if (filled) f(j0, slot, filled);
}

inline float row_max(const float* x, int n) {
    float m = -INFINITY;
    int j = 0;
#if defined(PG_KERNEL_AVX512)
    __m512 v = _mm512_set1_ps(-INFINITY);
    for (; j + kW <= n; j += kW) v = _mm512_max_ps(v, vload(x + j));
    m = _mm512_reduce_max_ps(v);
#else
    __m256 v = _mm256_set1_ps(-INFINITY);
    for (; j + kW <= n; j += kW) v = _mm256_max_ps(v, vload(x + j));
    float t[kW];
    vstore(t, v);
    for (float e : t) m = std::max(m, e);
#endif
    for (; j < n; ++j) m = std::max(m, x[j]);
    return m;
}

// sc[j] = exp(sc[j] - max of sc) for j < n (vexp, about 2 ulp); returns their sum, added in float
// lanes over runs of kSumRun vectors and the runs' sums in double (so long contexts keep the
// double sum's accuracy). The order depends only on n: a query's result does not depend on its
// batch.
inline double softmax_numerators(float* sc, int n) {
    constexpr int kSumRun = 64;
    const VF m = vset1(row_max(sc, n));
    double sum = 0;
    int j = 0;
    while (j + kW <= n) {
        VF acc = vzero();
        for (int r = 0; r < kSumRun && j + kW <= n; ++r, j += kW) {
            const VF e = vexp(vsub(vload(sc + j), m));
            vstore(sc + j, e);
            acc = vadd(acc, e);
        }
        sum += vsum(acc);
    }
    if (j < n) {  // the tail through the same vector code
        float t[kW] = {};
        std::memcpy(t, sc + j, (n - j) * sizeof(float));
        vstore(t, vexp(vsub(vload(t), m)));
        std::memcpy(sc + j, t, (n - j) * sizeof(float));
        for (int i = 0; i < n - j; ++i) sum += t[i];
    }
    return sum;
}

// The sums of 8 vectors' lanes at once: lane i of the result is the sum of r[i].
inline v8f hsum8x8(const v8f* r) {
    const __m256 t0 = _mm256_hadd_ps(__m256(r[0]), __m256(r[1])), t1 = _mm256_hadd_ps(__m256(r[2]), __m256(r[3]));
    const __m256 t2 = _mm256_hadd_ps(__m256(r[4]), __m256(r[5])), t3 = _mm256_hadd_ps(__m256(r[6]), __m256(r[7]));
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return v8f(_mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31)));
}

template <int D>
void attention_d(const AttentionArgs& a) {
    static_assert(D % 8 == 0);
    constexpr int kChunks = D / 8;
    const int n = a.last - a.first + 1;
    const int g_count = a.group;
    // Scores of 8 keys at a time: each key's 8 lanes of products (the same arithmetic for every
    // key, padded or not), then the 8 keys' lane sums at once.
    for_each_8_keys(a, [&](int j0, const int64_t* slot, int count) {
        const float* key[8];
        for (int i = 0; i < count; ++i) key[i] = a.k_cache + slot[i] * a.kv_dim + a.head_offset;
        for (int g = 0; g < g_count; ++g) {
            v8f qv[kChunks];  // the head's query, held across the 8 keys
            for (int c = 0; c < kChunks; ++c) qv[c] = load8(a.q + g * D + 8 * c);
            v8f r[8];
            for (int i = 0; i < 8; ++i) {
                r[i] = v8f{};
                if (i >= count) continue;
                r[i] = qv[0] * load8(key[i]);
                for (int c = 1; c < kChunks; ++c) r[i] += qv[c] * load8(key[i] + 8 * c);
            }
            const v8f sc = hsum8x8(r) * a.scale;
            if (count == 8) {
                store8(a.scratch + g * n + j0, sc);
            } else {
                float t[8];
                store8(t, sc);
                std::memcpy(a.scratch + g * n + j0, t, count * sizeof(float));
            }
        }
    });
    float inv[64];
    for (int g = 0; g < g_count; ++g) {
        float* sc = a.scratch + g * n;
        inv[g] = static_cast<float>(1.0 / softmax_numerators(sc, n));
    }
    // Weighted values: kSplit partial sums a head (key i of a run of 8 adds into partial i %
    // kSplit), so narrow heads are not one chain of dependent FMAs; and as many heads a pass
    // over V as keep all the partial sums in 16 registers.
    constexpr int kSplit = kChunks == 1 ? 4 : kChunks == 2 ? 2 : 1;
    constexpr int kHeads = std::clamp(16 / (kChunks * kSplit), 1, 8);
    v8f acc[kSplit][kHeads][kChunks];
    for (int g0 = 0; g0 < g_count; g0 += kHeads) {
        const int gn = std::min(kHeads, g_count - g0);
        for (auto& part : acc)
            for (int g = 0; g < gn; ++g)
                for (int c = 0; c < kChunks; ++c) part[g][c] = v8f{};
        for_each_8_keys(a, [&](int j0, const int64_t* slot, int count) {
#pragma GCC unroll 8
            for (int i = 0; i < 8; ++i) {
                if (i >= count) break;
                const float* v = a.v_cache + slot[i] * a.kv_dim + a.head_offset;
                v8f vv[kChunks];
                for (int c = 0; c < kChunks; ++c) vv[c] = load8(v + 8 * c);
                for (int g = 0; g < gn; ++g) {
                    const float p = a.scratch[(g0 + g) * n + j0 + i];
                    for (int c = 0; c < kChunks; ++c) acc[i % kSplit][g][c] += p * vv[c];
                }
            }
        });
        for (int g = 0; g < gn; ++g)
            for (int c = 0; c < kChunks; ++c) {
                v8f sum = acc[0][g][c];
                for (int u = 1; u < kSplit; ++u) sum += acc[u][g][c];
                store8(a.out + (g0 + g) * D + 8 * c, sum * inv[g0 + g]);
            }
    }
}

// Any head size (and groups over 64): the same passes with plain loops.
void attention_any(const AttentionArgs& a) {
    const int n = a.last - a.first + 1, d = a.head_dim;
    for (int g = 0; g < a.group; ++g) {
        const float* q = a.q + g * d;
        float* sc = a.scratch + g * n;
        for_each_key(
            a, [&](int j, int64_t slot) { sc[j] = dot(q, a.k_cache + slot * a.kv_dim + a.head_offset, d) * a.scale; });
        const float inv = static_cast<float>(1.0 / softmax_numerators(sc, n));
        float* o = a.out + g * d;
        std::memset(o, 0, d * sizeof(float));
        for_each_key(
            a, [&](int j, int64_t slot) { axpy(sc[j] * inv, a.v_cache + slot * a.kv_dim + a.head_offset, o, d); });
    }
}

void attention(const AttentionArgs& a) {
    if (a.group <= 64) {
        switch (a.head_dim) {
            case 8:
                return attention_d<8>(a);
            case 16:
                return attention_d<16>(a);
            case 32:
                return attention_d<32>(a);
            case 64:
                return attention_d<64>(a);
            case 80:
                return attention_d<80>(a);
            case 96:
                return attention_d<96>(a);
            case 128:
                return attention_d<128>(a);
            case 256:
                return attention_d<256>(a);
            default:
                break;
        }
    }
    attention_any(a);
}

}  // namespace peregrine::cpu::PG_KERNEL_NS

#include "backend/cpu/qkernels_impl.h"

namespace peregrine::cpu::PG_KERNEL_NS {

const Kernels& table() {
    static const Kernels k{PG_KERNEL_NAME, &matmul_rows, &dot,           &axpy,         kMatmulBf16,    &to_bf16,
                           &attention,     &silu_mul,    &quantize_acts, &qmatmul_rows, &qmatmul_align, kQmatmulName};
    return k;
}

}  // namespace peregrine::cpu::PG_KERNEL_NS
