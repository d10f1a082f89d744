// Int8 kernels for block-quantized weights (Q8_0, Q4_0, Q4_K, Q6_K). A matmul first quantizes its
// activation rows to 8 bits (blocks of 32 with an f32 scale; layout in core/quant.h), then each
// weight block meets them in integer dot products: vpdpbusd (AVX512-VNNI) or vpmaddubsw +
// vpmaddwd (AVX2), u8 x s8 with the weights' values read as unsigned (value + offset, the offset
// taken back through the activations' off[] sums). Block scales are applied in f32.
//
// Two shapes of kernel:
//  - direct (decode and small batches): R weight rows x C tokens per register tile, 256-bit
//    vectors on both ISAs, each weight block decoded once per tile and read straight from the
//    GGUF mapping;
//  - panel (AVX512-VNNI, prefill): 16 weight rows are unpacked once into a VNNI layout
//    ([k / 4][16 rows][4 bytes], unsigned values plus per-row sub-block scales) that every
//    token of the batch then streams against: 16 rows x 8 tokens per register tile.
//
// Included by kernels_impl.h once per ISA translation unit.
#pragma once

#include <cstring>

#include "core/quant.h"

namespace peregrine::cpu::PG_KERNEL_NS {
namespace {

using VI = __m256i;  // 32 bytes: one block of 32 activations

inline VI splat8(int v) {
    return _mm256_set1_epi8(static_cast<char>(v));
}

inline float hsum8f(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
inline int hsum8i(VI v) {
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i t = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 1)));
}
inline float hmax8f(__m256 v) {
    const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}

// An int32 vector with `v` in lane 0 and zeros elsewhere (one load, no ALU work).
inline VI lane0(int32_t v) {
    return _mm256_zextsi128_si256(_mm_cvtsi32_si128(v));
}
// `a` in lane 0, `b` in lane 4: the offsets of a block's two halves of 16 (Q6_K).
inline VI lanes04(int32_t a, int32_t b) {
    return _mm256_inserti128_si256(lane0(a), _mm_cvtsi32_si128(b), 1);
}

// acc + per-lane sums of four u8 x s8 products. On AVX2 (vpmaddubsw sums pairs in 16 bits with
// saturation) u must stay below 128; every caller's u is at most 63.
inline VI dot_u8s8(VI acc, VI u, VI s) {
#if defined(PG_KERNEL_AVX512)
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// acc + per-lane sums of four s8 x s8 products (Q8_0 weights w, activations x). VNNI reads
// w + 128 as unsigned, so acc must start from the activations' offset sum (-128 * sum of x):
// kQ8UsesOffset. AVX2 moves w's sign onto x instead (|w| <= 128 keeps vpmaddubsw's pair sums
// within 16 bits) and needs no offset.
#if defined(PG_KERNEL_AVX512)
constexpr bool kQ8UsesOffset = true;
inline VI dot_s8s8(VI acc, VI w, VI x) {
    return _mm256_dpbusd_epi32(acc, _mm256_xor_si256(w, splat8(0x80)), x);
}
#else
constexpr bool kQ8UsesOffset = false;
inline VI dot_s8s8(VI acc, VI w, VI x) {
    return dot_u8s8(acc, _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}
#endif

// --- activation quantization (bit for bit quantize_act_row in core/quant.cc) ----------------

void quantize_act_row_simd(const float* x, int64_t k, uint8_t* out, int c, int g) {
    const ActRow r = act_row(out, k);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const VI order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t s = 0; s < k / 16; ++s) r.off[s] = 0;
    for (int64_t b = 0; b < k / kActBlock; ++b) {
        const float* xb = x + b * kActBlock;
        const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        const __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, abs_mask), _mm256_and_ps(v1, abs_mask)),
                                       _mm256_max_ps(_mm256_and_ps(v2, abs_mask), _mm256_and_ps(v3, abs_mask)));
        const float amax = hmax8f(m);
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        // cvtps rounds to nearest even under the default MXCSR, as nearbyint does.
        const VI i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
        const VI i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
        const VI bytes = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        _mm256_storeu_si256(reinterpret_cast<VI*>(r.q + b * kActBlock), _mm256_permutevar8x32_epi32(bytes, order));
        const int s_lo = hsum8i(_mm256_add_epi32(i0, i1)), s_hi = hsum8i(_mm256_add_epi32(i2, i3));
        r.d[b] = amax / 127.0f;
        r.xs[b] = r.d[b] * static_cast<float>(s_lo + s_hi);
        if (g == 16) {
            r.off[2 * b] = -c * s_lo;
            r.off[2 * b + 1] = -c * s_hi;
        } else {
            r.off[b] = -c * (s_lo + s_hi);
        }
    }
}

void quantize_acts(DType w, const float* x, int64_t n, int64_t k, uint8_t* dst) {
    const size_t stride = act_row_bytes(k);
    const int c = act_offset(w), g = act_offset_block(w);
    for (int64_t i = 0; i < n; ++i) quantize_act_row_simd(x + i * k, k, dst + i * stride, c, g);
}

// --- direct kernels: out[r][c] = dot(weight row r, activation row c) --------------------------
//
// Decode streams every weight byte from DRAM once per step. On the machines measured the
// hardware prefetchers alone left the kernels at about half the read bandwidth; a software
// prefetch kPrefetchAhead bytes ahead in each row (about once per cache line) closes most of
// the gap.
constexpr int kPrefetchAhead = 4096;
inline void prefetch_ahead(const uint8_t* p) {
    _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchAhead, _MM_HINT_T0);
}

// A decode tile (R * C of 1 or 2) has too few independent FMA chains to hide the FMA latency
// (4 cycles per block of 34 bytes is about the read bandwidth of a core), so the direct
// kernels alternate between two sets of accumulators there, summed at the end.
template <int R, int C>
struct TileAcc {
    static constexpr bool kTwo = R * C <= 2;
    __m256 a[R][C], b[R][C];
    TileAcc() {
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < C; ++c) a[r][c] = b[r][c] = _mm256_setzero_ps();
    }
    // Runs step(block, accumulators) for blocks [0, n), alternating the sets when kTwo.
    template <class F>
    void each(int64_t n, F&& step) {
        int64_t i = 0;
        if constexpr (kTwo)
            for (; i + 1 < n; i += 2) {
                step(i, a);
                step(i + 1, b);
            }
        for (; i < n; ++i) step(i, a);
    }
    void sum(float (&out)[R][C]) const {
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < C; ++c) out[r][c] = hsum8f(kTwo ? _mm256_add_ps(a[r][c], b[r][c]) : a[r][c]);
    }
};
using Acc8 = __m256;
// The second set where there is one, else the first.
template <int R, int C>
inline Acc8 (&second_set(TileAcc<R, C>& t))[R][C] {
    if constexpr (TileAcc<R, C>::kTwo)
        return t.b;
    else
        return t.a;
}

struct DirectQ8_0 {
    template <int R, int C>
    static void tile(const uint8_t* const* w, const ActRow* x, int64_t k, float (&out)[R][C]) {
        TileAcc<R, C> t;
        t.each(k / 32, [&](int64_t b, Acc8(&acc)[R][C]) {
            VI xv[C], init[C];
            float dx[C];
            for (int c = 0; c < C; ++c) {
                xv[c] = _mm256_load_si256(reinterpret_cast<const VI*>(x[c].q + 32 * b));
                init[c] = kQ8UsesOffset ? lane0(x[c].off[b]) : _mm256_setzero_si256();
                dx[c] = x[c].d[b];
            }
            for (int r = 0; r < R; ++r) {
                const uint8_t* blk = w[r] + 34 * b;
                if (b % 2 == 0) prefetch_ahead(blk);
                const VI wv = _mm256_loadu_si256(reinterpret_cast<const VI*>(blk + 2));
                const float dw = half_to_float(blk);
                for (int c = 0; c < C; ++c)
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_s8s8(init[c], wv, xv[c])),
                                                _mm256_set1_ps(dw * dx[c]), acc[r][c]);
            }
        });
        t.sum(out);
    }
};

// Q4_0: 18-byte blocks, f16 scale then 16 bytes: element j in the low nibble of byte j, element
// j + 16 in the high nibble; value = nibble - 8.
inline VI q4_0_nibbles(const uint8_t* qs) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), splat8(0x0F));
}

struct DirectQ4_0 {
    template <int R, int C>
    static void tile(const uint8_t* const* w, const ActRow* x, int64_t k, float (&out)[R][C]) {
        TileAcc<R, C> t;
        t.each(k / 32, [&](int64_t b, Acc8(&acc)[R][C]) {
            VI xv[C], init[C];
            float dx[C];
            for (int c = 0; c < C; ++c) {
                xv[c] = _mm256_load_si256(reinterpret_cast<const VI*>(x[c].q + 32 * b));
                init[c] = lane0(x[c].off[b]);
                dx[c] = x[c].d[b];
            }
            for (int r = 0; r < R; ++r) {
                const uint8_t* blk = w[r] + 18 * b;
                if (b % 4 == 0) prefetch_ahead(blk);
                const VI u = q4_0_nibbles(blk + 2);
                const float dw = half_to_float(blk);
                for (int c = 0; c < C; ++c)
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(init[c], u, xv[c])),
                                                _mm256_set1_ps(dw * dx[c]), acc[r][c]);
            }
        });
        t.sum(out);
    }
};

// Q4_K's eight 6-bit scales and mins (core/quant.h: q4_k_scale_min), as bytes 0..7 of `sc`
// and `mn`, from the 12 packed bytes.
inline void q4_k_scales(const uint8_t* p, uint64_t* sc, uint64_t* mn) {
    uint32_t s0, s1, s2;
    std::memcpy(&s0, p, 4);
    std::memcpy(&s1, p + 4, 4);
    std::memcpy(&s2, p + 8, 4);
    const uint32_t sc_lo = s0 & 0x3f3f3f3fu, mn_lo = s1 & 0x3f3f3f3fu;
    const uint32_t sc_hi = (s2 & 0x0f0f0f0fu) | ((s0 >> 6) & 0x03030303u) << 4;
    const uint32_t mn_hi = ((s2 >> 4) & 0x0f0f0f0fu) | ((s1 >> 6) & 0x03030303u) << 4;
    *sc = sc_lo | static_cast<uint64_t>(sc_hi) << 32;
    *mn = mn_lo | static_cast<uint64_t>(mn_hi) << 32;
}
inline __m256 u8x8_to_f32(uint64_t v) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(v))));
}

// Q4_K super-block (144 bytes, 256 values): w = d * sc[s] * q - dmin * m[s] over sub-blocks s of
// 32 = the activation blocks, so sum(w * x) = sum_s dx[s] * (d * sc[s] * I[s] - dmin * m[s] * S[s])
// with I the integer dot and S the activations' integer sum; dx[s] * S[s] is the xs[] entry.
struct DirectQ4_K {
    template <int R, int C>
    static void tile(const uint8_t* const* w, const ActRow* x, int64_t k, float (&out)[R][C]) {
        TileAcc<R, C> t;
        Acc8(&acc)[R][C] = t.a;
        Acc8(&acc_hi)[R][C] = second_set(t);  // the high nibbles' sub-blocks
        alignas(32) float sv[R][C][8];        // d * sc[s] * dx[s] per sub-block
        for (int64_t i = 0; i < k / 256; ++i) {
            for (int r = 0; r < R; ++r) {
                const uint8_t* blk = w[r] + 144 * i;
                uint64_t sc, mn;
                q4_k_scales(blk + 4, &sc, &mn);
                const __m256 scf = _mm256_mul_ps(u8x8_to_f32(sc), _mm256_set1_ps(half_to_float(blk)));
                const __m256 mnf = _mm256_mul_ps(u8x8_to_f32(mn), _mm256_set1_ps(half_to_float(blk + 2)));
                for (int c = 0; c < C; ++c) {
                    _mm256_store_ps(sv[r][c], _mm256_mul_ps(scf, _mm256_loadu_ps(x[c].d + 8 * i)));
                    // The mins' share; acc's lanes are summed at the end, so any lane may take it.
                    acc[r][c] = _mm256_fnmadd_ps(mnf, _mm256_loadu_ps(x[c].xs + 8 * i), acc[r][c]);
                }
            }
            for (int j = 0; j < 4; ++j) {  // 32 bytes of qs: sub-block 2j low nibbles, 2j + 1 high
                VI xlo[C], xhi[C];
                for (int c = 0; c < C; ++c) {
                    xlo[c] = _mm256_load_si256(reinterpret_cast<const VI*>(x[c].q + 256 * i + 64 * j));
                    xhi[c] = _mm256_load_si256(reinterpret_cast<const VI*>(x[c].q + 256 * i + 64 * j + 32));
                }
                for (int r = 0; r < R; ++r) {
                    prefetch_ahead(w[r] + 144 * i + 32 * j);
                    const VI q = _mm256_loadu_si256(reinterpret_cast<const VI*>(w[r] + 144 * i + 16 + 32 * j));
                    const VI lo = _mm256_and_si256(q, splat8(0x0F));
                    const VI hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), splat8(0x0F));
                    for (int c = 0; c < C; ++c) {
                        const VI a = dot_u8s8(_mm256_setzero_si256(), lo, xlo[c]);
                        const VI b = dot_u8s8(_mm256_setzero_si256(), hi, xhi[c]);
                        acc[r][c] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), _mm256_broadcast_ss(&sv[r][c][2 * j]), acc[r][c]);
                        acc_hi[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(b), _mm256_broadcast_ss(&sv[r][c][2 * j + 1]),
                                                       acc_hi[r][c]);
                    }
                }
            }
        }
        t.sum(out);
    }
};

// Q6_K: the 32 unsigned 6-bit values (value + 32) of block j (0..3) of a 128-value half, from
// its ql (64 bytes) and qh (32 bytes); see BlockQ6_K.
inline VI q6_k_block(const uint8_t* ql, const uint8_t* qh, int j) {
    const VI l = _mm256_loadu_si256(reinterpret_cast<const VI*>(ql + 32 * (j & 1)));
    const VI h = _mm256_loadu_si256(reinterpret_cast<const VI*>(qh));
    const VI lo4 = j < 2 ? _mm256_and_si256(l, splat8(0x0F)) : _mm256_and_si256(_mm256_srli_epi16(l, 4), splat8(0x0F));
    // Bits 2j, 2j + 1 of each qh byte move to bits 4, 5 (16-bit shifts: the mask drops what
    // crosses a byte).
    VI hi2;
    switch (j) {
        case 0:
            hi2 = _mm256_slli_epi16(h, 4);
            break;
        case 1:
            hi2 = _mm256_slli_epi16(h, 2);
            break;
        case 2:
            hi2 = h;
            break;
        default:
            hi2 = _mm256_srli_epi16(h, 2);
            break;
    }
    return _mm256_or_si256(lo4, _mm256_and_si256(hi2, splat8(0x30)));
}

// Q6_K super-block (210 bytes, 256 values): w = d * sc[s] * (u - 32) over sub-blocks of 16, so a
// block of 32 covers two scales: lanes 0-3 of the integer dot are its first 16 values, lanes 4-7
// the second; each half starts from its -32 * S offset.
struct DirectQ6_K {
    template <int R, int C>
    static void tile(const uint8_t* const* w, const ActRow* x, int64_t k, float (&out)[R][C]) {
        TileAcc<R, C> t;
        alignas(32) float sv[R][C][16];  // d * sc[s] * dx per sub-block of 16
        const VI expand_lo = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3),
                 expand_hi = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
        for (int64_t i = 0; i < k / 256; ++i) {
            for (int r = 0; r < R; ++r) {
                const uint8_t* blk = w[r] + 210 * i;
                const __m256 d = _mm256_set1_ps(half_to_float(blk + 208));
                const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
                const __m256 s_lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d);
                const __m256 s_hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))), d);
                for (int c = 0; c < C; ++c) {
                    const __m256 dx = _mm256_loadu_ps(x[c].d + 8 * i);
                    _mm256_store_ps(sv[r][c], _mm256_mul_ps(s_lo, _mm256_permutevar8x32_ps(dx, expand_lo)));
                    _mm256_store_ps(sv[r][c] + 8, _mm256_mul_ps(s_hi, _mm256_permutevar8x32_ps(dx, expand_hi)));
                }
            }
            // Block j (0..3) of half h, into `acc` (even blocks and odd ones in the two sets).
            auto block = [&](int h, int j, Acc8(&acc)[R][C]) {
                const int b = 4 * h + j;  // block of 32 within the super-block
                VI xv[C], init[C];
                for (int c = 0; c < C; ++c) {
                    xv[c] = _mm256_load_si256(reinterpret_cast<const VI*>(x[c].q + 256 * i + 32 * b));
                    init[c] = lanes04(x[c].off[16 * i + 2 * b], x[c].off[16 * i + 2 * b + 1]);
                }
                for (int r = 0; r < R; ++r) {
                    const uint8_t* blk = w[r] + 210 * i;
                    if (j % 2 == 0) prefetch_ahead(blk + 64 * h + 32 * j);
                    const VI u = q6_k_block(blk + 64 * h, blk + 128 + 32 * h, j);
                    for (int c = 0; c < C; ++c) {
                        const __m256 s =
                            _mm256_set_m128(_mm_broadcast_ss(&sv[r][c][2 * b + 1]), _mm_broadcast_ss(&sv[r][c][2 * b]));
                        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(init[c], u, xv[c])), s, acc[r][c]);
                    }
                }
            };
            for (int h = 0; h < 2; ++h)
                for (int j = 0; j < 4; j += 2) {
                    block(h, j, t.a);
                    block(h, j + 1, second_set(t));
                }
        }
        t.sum(out);
    }
};

#if defined(PG_KERNEL_AVX512)
constexpr int kQColTile = 4;  // 32 vector registers
#else
constexpr int kQColTile = 2;  // 16
#endif

template <class K>
struct DirectTile {
    const MatmulArgs& a;
    const uint8_t* xq;
    size_t stride;
    template <int R, int C>
    void run(int64_t m, int64_t t) const {
        const uint8_t* w[R];
        ActRow x[C];
        for (int r = 0; r < R; ++r) w[r] = static_cast<const uint8_t*>(a.w) + (m + r) * a.w_row_bytes;
        for (int c = 0; c < C; ++c) x[c] = act_row(const_cast<uint8_t*>(xq + (t + c) * stride), a.k);
        float out[R][C];
        K::template tile<R, C>(w, x, a.k, out);
        store_tile<R, C>(a, m, t, out);
    }
};

template <int R, class Tile>
inline void run_qcols(const Tile& tile, int64_t m, int64_t t, int64_t cols) {
    if constexpr (kQColTile >= 4) {
        if (cols >= 4) return tile.template run<R, 4>(m, t);
        if (cols == 3) return tile.template run<R, 3>(m, t);
    }
    if (cols >= 2) return tile.template run<R, 2>(m, t);
    tile.template run<R, 1>(m, t);
}

template <class K>
void direct_rows(const MatmulArgs& a, const uint8_t* xq, int64_t m_begin, int64_t m_end) {
    const DirectTile<K> tile{a, xq, act_row_bytes(a.k)};
    if (a.n == 1) {
        // Decode: one row at a time reads the weights as one sequential stream, which measured
        // faster than four rows side by side (and the activation row stays in L1 either way).
        for (int64_t m = m_begin; m < m_end; ++m) tile.template run<1, 1>(m, 0);
        return;
    }
    for (int64_t tb = 0; tb < a.n; tb += kTokenBlock) {
        const int64_t te = std::min(a.n, tb + kTokenBlock);
        int64_t m = m_begin;
        for (; m + 4 <= m_end; m += 4)
            for (int64_t t = tb; t < te; t += kQColTile) run_qcols<4>(tile, m, t, std::min<int64_t>(kQColTile, te - t));
        for (; m < m_end; ++m)
            for (int64_t t = tb; t < te; t += kQColTile) run_qcols<1>(tile, m, t, std::min<int64_t>(kQColTile, te - t));
    }
}

#if defined(PG_KERNEL_AVX512)
// --- panel kernels (prefill, AVX512-VNNI) -----------------------------------------------------

constexpr int kPanelRows = 16;
constexpr int64_t kPanelMinTokens = 4;  // below this, the direct kernels (no unpacking)

// 16 weight rows unpacked for vpdpbusd: lane r of the vector for k-step j holds row r's
// unsigned values 4j .. 4j + 3. Sub-blocks of g values (32; Q6_K 16) carry one f32 scale per row.
struct Panel {
    uint8_t* q;  // [k / 4][16][4]
    float* a;    // [k / g][16]: the scale (Q8_0, Q4_0: d; Q4_K: d * sc; Q6_K: d * sc)
    float* b;    // [k / 32][16]: Q4_K's dmin * m
};
inline Panel panel_at(uint8_t* scratch, int64_t k) {
    return {scratch, reinterpret_cast<float*>(scratch + 16 * k),
            reinterpret_cast<float*>(scratch + 16 * k + 4 * 16 * (k / 16))};
}

// In place: r[i] holds dwords 0..15 of row i; afterwards r[j] holds dword j of rows 0..15.
inline void transpose16x16(__m512i (&r)[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    // u[4g + j], 128-bit lane L: rows 4g .. 4g + 3 of dword 4L + j.
    __m512i u[16];
    for (int g = 0; g < 4; ++g) {
        u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    // Dword 4L + j gathers lane L of u[j], u[4 + j], u[8 + j], u[12 + j].
    for (int j = 0; j < 4; ++j) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44), v1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xEE);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);
        const __m512i v3 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xEE);
        r[j] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        r[4 + j] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
        r[8 + j] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        r[12 + j] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
    }
}

inline __m512i join(VI lo, VI hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// Unsigned values [e, e + 64) of one weight row (e a multiple of 64), and the row's scales.
template <DType T>
struct Unpack;

template <>
struct Unpack<DType::Q8_0> {
    static constexpr int kSub = 32;
    static constexpr int kBlockBytes = 34;  // of one 32-value block (rows of an odd count: see pack_panel)
    static __m512i values(const uint8_t* row, int64_t e) {
        const uint8_t* blk = row + (e / 32) * 34;
        const __m512i v = join(_mm256_loadu_si256(reinterpret_cast<const VI*>(blk + 2)),
                               _mm256_loadu_si256(reinterpret_cast<const VI*>(blk + 36)));
        return _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80)));
    }
    static void scales(const uint8_t* row, int64_t k, float* a, float* b, int r) {
        (void)b;
        for (int64_t s = 0; s < k / 32; ++s) a[s * 16 + r] = half_to_float(row + 34 * s);
    }
};

template <>
struct Unpack<DType::Q4_0> {
    static constexpr int kSub = 32;
    static constexpr int kBlockBytes = 18;
    static __m512i values(const uint8_t* row, int64_t e) {
        const uint8_t* blk = row + (e / 32) * 18;
        return join(q4_0_nibbles(blk + 2), q4_0_nibbles(blk + 20));
    }
    static void scales(const uint8_t* row, int64_t k, float* a, float* b, int r) {
        (void)b;
        for (int64_t s = 0; s < k / 32; ++s) a[s * 16 + r] = half_to_float(row + 18 * s);
    }
};

template <>
struct Unpack<DType::Q4_K> {
    static constexpr int kSub = 32;
    static constexpr int kBlockBytes = 0;  // k is a multiple of 256: no odd tail
    static __m512i values(const uint8_t* row, int64_t e) {
        const VI q = _mm256_loadu_si256(reinterpret_cast<const VI*>(row + (e / 256) * 144 + 16 + (e % 256) / 2));
        return join(_mm256_and_si256(q, splat8(0x0F)), _mm256_and_si256(_mm256_srli_epi16(q, 4), splat8(0x0F)));
    }
    static void scales(const uint8_t* row, int64_t k, float* a, float* b, int r) {
        for (int64_t i = 0; i < k / 256; ++i) {
            const uint8_t* blk = row + 144 * i;
            const float d = half_to_float(blk), dmin = half_to_float(blk + 2);
            uint64_t sc, mn;
            q4_k_scales(blk + 4, &sc, &mn);
            for (int s = 0; s < 8; ++s) {
                a[(8 * i + s) * 16 + r] = d * static_cast<float>((sc >> (8 * s)) & 0xFF);
                b[(8 * i + s) * 16 + r] = dmin * static_cast<float>((mn >> (8 * s)) & 0xFF);
            }
        }
    }
};

template <>
struct Unpack<DType::Q6_K> {
    static constexpr int kSub = 16;
    static constexpr int kBlockBytes = 0;
    static __m512i values(const uint8_t* row, int64_t e) {
        const uint8_t* blk = row + (e / 256) * 210;
        const int h = static_cast<int>(e % 256) / 128, j = static_cast<int>(e % 128) / 32;  // j: 0 or 2
        return join(q6_k_block(blk + 64 * h, blk + 128 + 32 * h, j),
                    q6_k_block(blk + 64 * h, blk + 128 + 32 * h, j + 1));
    }
    static void scales(const uint8_t* row, int64_t k, float* a, float* b, int r) {
        (void)b;
        for (int64_t i = 0; i < k / 256; ++i) {
            const uint8_t* blk = row + 210 * i;
            const float d = half_to_float(blk + 208);
            for (int s = 0; s < 16; ++s)
                a[(16 * i + s) * 16 + r] = d * static_cast<float>(static_cast<int8_t>(blk[192 + s]));
        }
    }
};

// Unpacks weight rows [m0, m0 + rows) (rows <= 16; missing rows read as zeros) into `p`.
template <DType T>
void pack_panel(const MatmulArgs& a, int64_t m0, int rows, const Panel& p) {
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + m0 * a.w_row_bytes;
    // A row of an odd number of 32-value blocks (q8_0 / q4_0 with k % 64 == 32): the last step
    // reads its one block from a copy followed by a zero block, never past the row (past the
    // last row is past the weights). The activations there are zero, so the values do not count.
    alignas(64) uint8_t tail[2 * 64] = {};
    for (int64_t e = 0; e < a.k; e += 64) {
        __m512i r[16];
        const bool odd_tail = Unpack<T>::kBlockBytes > 0 && e + 64 > a.k;
        for (int i = 0; i < 16; ++i) {
            if (i >= rows) {
                r[i] = _mm512_setzero_si512();
            } else if (odd_tail) {
                std::memcpy(tail, w + i * a.w_row_bytes + (e / 32) * Unpack<T>::kBlockBytes, Unpack<T>::kBlockBytes);
                r[i] = Unpack<T>::values(tail, 0);
            } else {
                r[i] = Unpack<T>::values(w + i * a.w_row_bytes, e);
            }
        }
        transpose16x16(r);
        for (int j = 0; j < 16; ++j) _mm512_store_si512(p.q + (e / 4 + j) * 64, r[j]);
    }
    for (int i = 0; i < 16; ++i) {
        if (i < rows) {
            Unpack<T>::scales(w + i * a.w_row_bytes, a.k, p.a, p.b, i);
        } else {
            for (int64_t s = 0; s < a.k / Unpack<T>::kSub; ++s) p.a[s * 16 + i] = 0.0f;
            if (T == DType::Q4_K)
                for (int64_t s = 0; s < a.k / 32; ++s) p.b[s * 16 + i] = 0.0f;
        }
    }
}

inline int32_t load_i32(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// The panel's 16 rows x tokens t .. t + C - 1: out[t + c][m0 .. m0 + rows).
template <DType T, int C>
void panel_cols(const MatmulArgs& a, const Panel& p, const uint8_t* xq, size_t stride, int64_t m0, int rows,
                int64_t t) {
    constexpr int g = Unpack<T>::kSub;
    constexpr bool kOffset = T != DType::Q4_K;  // Q4_K has no offset: its mins take that part
    ActRow x[C];
    for (int c = 0; c < C; ++c) x[c] = act_row(const_cast<uint8_t*>(xq + (t + c) * stride), a.k);
    __m512 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t s = 0; s < a.k / g; ++s) {
        __m512i ai[C];
        for (int c = 0; c < C; ++c) ai[c] = kOffset ? _mm512_set1_epi32(x[c].off[s]) : _mm512_setzero_si512();
        const uint8_t* q = p.q + s * g * 16;
        for (int j = 0; j < g / 4; ++j) {
            const __m512i wv = _mm512_load_si512(q + 64 * j);
            for (int c = 0; c < C; ++c)
                ai[c] = _mm512_dpbusd_epi32(ai[c], wv, _mm512_set1_epi32(load_i32(x[c].q + s * g + 4 * j)));
        }
        const __m512 av = _mm512_load_ps(p.a + s * 16);
        for (int c = 0; c < C; ++c)
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[c]), _mm512_mul_ps(av, _mm512_set1_ps(x[c].d[s * g / 32])),
                                     acc[c]);
        if constexpr (T == DType::Q4_K) {
            const __m512 bv = _mm512_load_ps(p.b + s * 16);
            for (int c = 0; c < C; ++c) acc[c] = _mm512_fnmadd_ps(bv, _mm512_set1_ps(x[c].xs[s]), acc[c]);
        }
    }
    const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1);
    const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(mask, a.bias + m0) : _mm512_setzero_ps();
    for (int c = 0; c < C; ++c) _mm512_mask_storeu_ps(a.out + (t + c) * a.m + m0, mask, _mm512_add_ps(acc[c], bias));
}

template <DType T>
void panel_rows(const MatmulArgs& a, const uint8_t* xq, int64_t m_begin, int64_t m_end, uint8_t* scratch) {
    const size_t stride = act_row_bytes(a.k);
    const Panel p = panel_at(scratch, a.k);
    for (int64_t m0 = m_begin; m0 < m_end; m0 += kPanelRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kPanelRows, m_end - m0));
        pack_panel<T>(a, m0, rows, p);
        // The next panel's weights come from DRAM: prefetch them into L2, a share per tile.
        const int64_t next_rows = std::max<int64_t>(0, std::min<int64_t>(kPanelRows, m_end - m0 - kPanelRows));
        const char* next = static_cast<const char*>(a.w) + (m0 + kPanelRows) * a.w_row_bytes;
        const int64_t pf_total = static_cast<int64_t>((next_rows * a.w_row_bytes + 63) / 64);
        const int64_t pf_per = pf_total / (a.n / 8 + 1) + 1;
        int64_t pf_done = 0;
        int64_t t = 0;
        for (; t + 8 <= a.n; t += 8) {
            for (const int64_t e = std::min(pf_total, pf_done + pf_per); pf_done < e; ++pf_done)
                _mm_prefetch(next + 64 * pf_done, _MM_HINT_T1);
            panel_cols<T, 8>(a, p, xq, stride, m0, rows, t);
        }
        for (; pf_done < pf_total; ++pf_done) _mm_prefetch(next + 64 * pf_done, _MM_HINT_T1);
        switch (a.n - t) {
            case 7:
                panel_cols<T, 7>(a, p, xq, stride, m0, rows, t);
                break;
            case 6:
                panel_cols<T, 6>(a, p, xq, stride, m0, rows, t);
                break;
            case 5:
                panel_cols<T, 5>(a, p, xq, stride, m0, rows, t);
                break;
            case 4:
                panel_cols<T, 4>(a, p, xq, stride, m0, rows, t);
                break;
            case 3:
                panel_cols<T, 3>(a, p, xq, stride, m0, rows, t);
                break;
            case 2:
                panel_cols<T, 2>(a, p, xq, stride, m0, rows, t);
                break;
            case 1:
                panel_cols<T, 1>(a, p, xq, stride, m0, rows, t);
                break;
            default:
                break;
        }
    }
}
#endif

void qmatmul_rows(const MatmulArgs& a, const uint8_t* xq, int64_t m_begin, int64_t m_end, uint8_t* scratch) {
#if defined(PG_KERNEL_AVX512)
    if (a.n >= kPanelMinTokens) {
        switch (a.w_dtype) {
            case DType::Q8_0:
                return panel_rows<DType::Q8_0>(a, xq, m_begin, m_end, scratch);
            case DType::Q4_0:
                return panel_rows<DType::Q4_0>(a, xq, m_begin, m_end, scratch);
            case DType::Q4_K:
                return panel_rows<DType::Q4_K>(a, xq, m_begin, m_end, scratch);
            case DType::Q6_K:
                return panel_rows<DType::Q6_K>(a, xq, m_begin, m_end, scratch);
            default:
                __builtin_trap();
        }
    }
#else
    (void)scratch;
#endif
    switch (a.w_dtype) {
        case DType::Q8_0:
            return direct_rows<DirectQ8_0>(a, xq, m_begin, m_end);
        case DType::Q4_0:
            return direct_rows<DirectQ4_0>(a, xq, m_begin, m_end);
        case DType::Q4_K:
            return direct_rows<DirectQ4_K>(a, xq, m_begin, m_end);
        case DType::Q6_K:
            return direct_rows<DirectQ6_K>(a, xq, m_begin, m_end);
        default:
            __builtin_trap();  // the backend checks qmatmul_supports first
    }
}

int64_t qmatmul_align(const MatmulArgs& a) {
#if defined(PG_KERNEL_AVX512)
    if (a.n >= kPanelMinTokens) return kPanelRows;
#else
    (void)a;
#endif
    return 4;
}

#if defined(PG_KERNEL_AVX512)
constexpr const char* kQmatmulName = "int8 dot: avx512-vnni (q8_0, q4_0, q4_k, q6_k; prefill in 16-row VNNI panels)";
#else
constexpr const char* kQmatmulName = "int8 dot: avx2 (q8_0, q4_0, q4_k, q6_k)";
#endif

}  // namespace
}  // namespace peregrine::cpu::PG_KERNEL_NS
