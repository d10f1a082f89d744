// GPU sampling: one CTA of 512 threads per logits row, no sort of the vocabulary.
//
// Per row, in vLLM's order (the CPU Sampler's semantics, src/engine/sampler.cc):
//   1. logprobs (when asked): log-sum-exp and the top ids of the RAW row, before anything else;
//   2. penalties, written into the row in place (repetition, then presence/frequency);
//   3. greedy (is_greedy, backend/sampling_row.h: temperature < 1e-5 or top_k == 1): the first
//      index of the maximum;
//   4. otherwise the candidate set, as the CPU builds it: logits >= floor, where floor is
//      max + T ln(min_p) (min_p) or max - 30 T (tokens below e^-30 of the best carry nothing),
//      then the top_k best, then the smallest best-first prefix holding top_p of their mass;
//      "best first" is (logit desc, id asc), so ties resolve to lower ids as on the CPU;
//   5. one draw: Philox4x32-10 keyed by row.seed at counter row.offset gives 64 bits u, the
//      token is where u * total falls in the kept weights' running sum.
// Weights e^((l - max) / T) are summed as 2^-40 fixed-point integers, so every sum is exact and
// independent of order: a seeded row gives the same token whatever the batch around it.
//
// Selection without sorting the vocabulary: a 2048-bin histogram of (max - l) over
// [floor, max] (count and mass per bin; bins are monotone in l and ties share a bin) locates
// the bin holding the top_k / top_p boundary. If everything up to that bin fits in 8192
// candidates they are collected into shared memory and bitonic-sorted (the usual case); else
// only the boundary bin is collected and sorted; if even that bin holds more than 8192 values
// (massive ties), an 8-pass radix select over the row resolves it.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/pdl.cuh"

namespace peregrine::cuda {

namespace {

constexpr int kArgmaxChunks = 128;  // CTAs per row in greedy_argmax (a multiple of 32)
constexpr int kArgmaxThreads = 128;
struct ArgmaxPartial {
    float value;
    int index;
};

using u64 = unsigned long long;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2048;
constexpr int kCand = 8192;                     // shared-memory candidates (power of two)
constexpr int kRawTop = kThreads;               // per-warp top-32 lists of the raw row
constexpr float kMassScale = 1099511627776.0f;  // 2^40: fixed-point unit of the weights

struct Smem {
    u64 cand[kCand];                // candidates: composite keys (see comp())
    u64 raw_top[kRawTop];           // raw row: union of the warps' top-32, sorted descending
    u64 bin_mass[kBins + 1];        // per-bin mass, then its exclusive prefix ([kBins] = total)
    uint32_t bin_count[kBins + 1];  // per-bin count, then its exclusive prefix
    u64 radix_mass[256];
    uint32_t radix_count[256];
    u64 red[kWarps];  // reduction scratch
    float redf[kWarps];
    float redf2[kWarps];
    u64 s_u64[4];  // broadcast scalars
    int s_int[4];
    float s_f;
};

// ---- keys ------------------------------------------------------------------------------------

// Order-preserving map of a float to uint32 (-0 folded into +0 so that they tie, as on the CPU).
__device__ __forceinline__ uint32_t fkey(float l) {
    uint32_t b = __float_as_uint(l);
    if (b == 0x80000000u) b = 0;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float fkey_value(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
// Composite key: larger = better = (logit desc, id asc); unique per element; 0 for NaN (never
// kept; real elements are >= 1 since id < 2^32 - 1).
__device__ __forceinline__ u64 comp(float l, int id) {
    if (isnan(l)) return 0;
    return (static_cast<u64>(fkey(l)) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ int comp_id(u64 c) {
    return static_cast<int>(0xffffffffu - static_cast<uint32_t>(c));
}
__device__ __forceinline__ float comp_value(u64 c) {
    return fkey_value(static_cast<uint32_t>(c >> 32));
}

// ---- the row's sampling state ------------------------------------------------------------------

struct RowCtx {
    const float* row;  // [vocab] processed logits
    int vocab;
    float mx;         // processed maximum
    float inv_t;      // 1 / temperature
    float floor;      // candidates: l >= floor
    float bin_scale;  // bin(l) = (mx - l) * bin_scale, clamped to kBins - 1
};

// Fixed-point weight e^((l - mx) / T) * 2^40 (as the CPU forms it: f32 difference times f32 1/T).
__device__ __forceinline__ u64 wfix(const RowCtx& c, float l) {
    const float w = expf(__fmul_rn(__fsub_rn(l, c.mx), c.inv_t));
    return w > 0.0f ? static_cast<u64>(__fmul_rn(w, kMassScale)) : 0ull;  // NaN -> 0
}
__device__ __forceinline__ int bin_of(const RowCtx& c, float l) {
    const float t = __fmul_rn(__fsub_rn(c.mx, l), c.bin_scale);
    return t < static_cast<float>(kBins) ? static_cast<int>(t) : kBins - 1;  // NaN -> last
}
__device__ __forceinline__ bool in_set(const RowCtx& c, float l) {
    return l >= c.floor;  // false for NaN
}

// The kept set: in_set and (bin < bin_cut or (bin == bin_cut and comp >= comp_cut)).
struct Cut {
    int bin = kBins;  // kBins: no cut
    u64 comp = 0;
};
__device__ __forceinline__ bool kept(const RowCtx& c, const Cut& cut, float l, int id) {
    if (!in_set(c, l)) return false;
    if (cut.bin >= kBins) return true;
    const int b = bin_of(c, l);
    return b < cut.bin || (b == cut.bin && comp(l, id) >= cut.comp);
}

// Calls f(l, i) for every element of the row; thread j sees ids j, j + kThreads, ... in order,
// four loads in flight (the mapping does not depend on the row's address, so a row's results
// do not depend on where it sits in the batch).
template <typename F>
__device__ __forceinline__ void for_row(const float* row, int vocab, F f) {
    int i = threadIdx.x;
    for (; i + 3 * kThreads < vocab; i += 4 * kThreads) {
        float v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = row[i + u * kThreads];
#pragma unroll
        for (int u = 0; u < 4; ++u) f(v[u], i + u * kThreads);
    }
    for (; i < vocab; i += kThreads) f(row[i], i);
}

// As for_row, but every lane of a warp runs every step (for warp collectives inside f); ids
// past the end come as (NaN, -1).
template <typename F>
__device__ __forceinline__ void for_row_uniform(const float* row, int vocab, F f) {
    const float nan = __int_as_float(0x7fc00000);
    for (int base = 0; base < vocab; base += 4 * kThreads) {
        float v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = base + u * kThreads + threadIdx.x;
            v[u] = i < vocab ? row[i] : nan;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = base + u * kThreads + threadIdx.x;
            f(v[u], i < vocab ? i : -1);
        }
    }
}

// ---- block primitives (every thread of the CTA calls them; each ends with a barrier) -------------

__device__ __forceinline__ u64 block_max_u64(u64 v, Smem& s) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
        const u64 o = __shfl_xor_sync(0xffffffffu, v, off);
        v = o > v ? o : v;
    }
    if (threadIdx.x % 32 == 0) s.red[threadIdx.x / 32] = v;
    __syncthreads();
    u64 r = s.red[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) r = s.red[w] > r ? s.red[w] : r;
    __syncthreads();
    return r;
}

// Exclusive prefix sum over threads in threadIdx order; `total` gets the sum of all.
__device__ __forceinline__ u64 block_exclusive_scan(u64 v, u64& total, Smem& s) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    u64 inc = v;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
        const u64 o = __shfl_up_sync(0xffffffffu, inc, off);
        if (lane >= off) inc += o;
    }
    if (lane == 31) s.red[warp] = inc;
    __syncthreads();
    u64 before = 0;
    total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
        if (w < warp) before += s.red[w];
        total += s.red[w];
    }
    __syncthreads();
    return before + inc - v;
}

// Bitonic sort of s.cand[0, m) descending (m <= kCand), padding with 0 to a power of two.
__device__ void sort_candidates(Smem& s, int m) {
    int p = 2;
    while (p < m) p *= 2;
    for (int i = m + threadIdx.x; i < p; i += kThreads) s.cand[i] = 0;
    __syncthreads();
    for (int size = 2; size <= p; size *= 2) {
        for (int stride = size / 2; stride > 0; stride /= 2) {
            for (int i = threadIdx.x; i < p / 2; i += kThreads) {
                const int lo = 2 * i - (i & (stride - 1));
                const int hi = lo + stride;
                const bool desc = (lo & size) == 0;
                const u64 a = s.cand[lo], b = s.cand[hi];
                if ((a < b) == desc) {
                    s.cand[lo] = b;
                    s.cand[hi] = a;
                }
            }
            __syncthreads();
        }
    }
}

// Appends comp(l, i) of every element with pred(l, i) to s.cand; returns the count. The caller
// knows from the histogram that at most kCand elements match.
template <typename Pred>
__device__ int collect(const RowCtx& c, Smem& s, Pred pred) {
    if (threadIdx.x == 0) s.s_int[0] = 0;
    __syncthreads();
    const int lane = threadIdx.x % 32;
    for_row_uniform(c.row, c.vocab, [&](float l, int i) {
        const bool take = i >= 0 && pred(l, i);
        const unsigned mask = __ballot_sync(0xffffffffu, take);
        if (mask == 0) return;
        const int leader = __ffs(mask) - 1;
        int pos = 0;
        if (lane == leader) pos = atomicAdd(&s.s_int[0], __popc(mask));
        pos = __shfl_sync(0xffffffffu, pos, leader) + __popc(mask & ((1u << lane) - 1));
        if (take && pos < kCand) s.cand[pos] = comp(l, i);
    });
    __syncthreads();
    const int m = min(s.s_int[0], kCand);
    __syncthreads();
    return m;
}

// Over the sorted candidates s.cand[0, m): with mass_mode, the first index J whose inclusive
// running mass reaches `target` (>= 1; m - 1 if none does); else J = target - 1 (a count).
// Returns J; `incl` gets the running mass through J.
__device__ int find_in_sorted(const RowCtx& c, Smem& s, int m, bool mass_mode, u64 target, u64& incl) {
    const int per = (m + kThreads - 1) / kThreads;
    const int lo = min(m, static_cast<int>(threadIdx.x) * per), hi = min(m, lo + per);
    u64 mine = 0;
    for (int i = lo; i < hi; ++i) mine += wfix(c, comp_value(s.cand[i]));
    u64 total;
    u64 run = block_exclusive_scan(mine, total, s);
    if (threadIdx.x == 0) {
        s.s_int[1] = m - 1;
        s.s_u64[1] = total;
    }
    __syncthreads();
    for (int i = lo; i < hi; ++i) {
        const u64 prev = run;
        run += wfix(c, comp_value(s.cand[i]));
        const bool hit = mass_mode ? (prev < target && run >= target) : (i == static_cast<int>(target) - 1);
        if (hit) {  // unique
            s.s_int[1] = i;
            s.s_u64[1] = run;
        }
    }
    __syncthreads();
    const int j = s.s_int[1];
    incl = s.s_u64[1];
    __syncthreads();
    return j;
}

// The r-th best element (count mode) or the first whose running mass reaches `target` (mass
// mode) among the in-set elements of bin b, when that bin holds more than kCand of them: radix
// select over the composite keys, 8 bits a pass. Returns the element's key; `incl_mass` gets
// the mass of the bin's elements up to and including it.
__device__ __noinline__ u64 radix_select_bin(const RowCtx c, Smem& s, int b, bool mass_mode, u64 target,
                                             u64& incl_mass) {
    u64 prefix = 0, above_mass = 0;
    uint32_t above_count = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < 256; d += kThreads) s.radix_count[d] = 0, s.radix_mass[d] = 0;
        __syncthreads();
        for_row(c.row, c.vocab, [&](float l, int i) {
            if (!in_set(c, l) || bin_of(c, l) != b) return;
            const u64 k = comp(l, i);
            if (shift < 56 && (k >> (shift + 8)) != prefix) return;
            const int d = static_cast<int>((k >> shift) & 255u);
            atomicAdd(&s.radix_count[d], 1u);
            atomicAdd(&s.radix_mass[d], wfix(c, l));
        });
        __syncthreads();
        if (threadIdx.x == 0) {
            int pick = 0;
            for (int d = 255; d >= 0; --d) {
                const bool here = mass_mode ? (s.radix_count[d] > 0 && above_mass + s.radix_mass[d] >= target)
                                            : (above_count + s.radix_count[d] >= target);
                if (here || d == 0) {
                    pick = d;
                    break;
                }
                above_count += s.radix_count[d];
                above_mass += s.radix_mass[d];
            }
            s.s_u64[2] = (prefix << 8) | static_cast<u64>(pick);
            s.s_u64[3] = above_mass;
            s.s_int[2] = static_cast<int>(above_count);
        }
        __syncthreads();
        prefix = s.s_u64[2];
        above_mass = s.s_u64[3];
        above_count = static_cast<uint32_t>(s.s_int[2]);
        __syncthreads();
    }
    incl_mass = above_mass + wfix(c, comp_value(prefix));
    return prefix;
}

// Resolves the cut inside bin b (see radix_select_bin): collects and sorts the bin when it fits.
__device__ u64 resolve_bin(const RowCtx& c, Smem& s, int b, bool mass_mode, u64 target, u64& incl_mass) {
    const uint32_t pop = s.bin_count[b + 1] - s.bin_count[b];
    if (pop > static_cast<uint32_t>(kCand)) return radix_select_bin(c, s, b, mass_mode, target, incl_mass);
    const int m = collect(c, s, [&](float l, int) { return in_set(c, l) && bin_of(c, l) == b; });
    sort_candidates(s, m);
    const int j = find_in_sorted(c, s, m, mass_mode, target, incl_mass);
    return s.cand[j];
}

// Index of the bin whose exclusive prefix (in `prefix`, kBins + 1 entries) is < target <= the
// next one; target >= 1 and <= prefix[kBins].
template <typename T>
__device__ int find_bin(Smem& s, const T* prefix, u64 target) {
    constexpr int kPer = kBins / kThreads;
    if (threadIdx.x == 0) s.s_int[3] = kBins - 1;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int b = threadIdx.x * kPer + j;
        if (static_cast<u64>(prefix[b]) < target && target <= static_cast<u64>(prefix[b + 1])) s.s_int[3] = b;
    }
    __syncthreads();
    const int b = s.s_int[3];
    __syncthreads();
    return b;
}

// Philox4x32-10 (Salmon et al. 2011): 64 random bits of (key, counter).
__device__ __forceinline__ u64 philox64(u64 key, u64 counter) {
    uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return (static_cast<u64>(c0) << 32) | c1;
}

// Draw over the whole row: the kept elements' weights in a fixed order (thread-major over
// tiles of kThreads: thread j owns ids j, j + kThreads, ...), and `bits` picks the point.
__device__ __noinline__ int draw_global(const RowCtx c, const Cut cut, Smem& s, u64 bits) {
    u64 mine = 0;
    for_row(c.row, c.vocab, [&](float l, int i) {
        if (kept(c, cut, l, i)) mine += wfix(c, l);
    });
    u64 total;
    const u64 before = block_exclusive_scan(mine, total, s);
    if (total == 0) return -1;
    const u64 u = __umul64hi(bits, total);  // uniform in [0, total)
    // Exactly one thread's interval [before, before + mine) holds u.
    if (before <= u && u < before + mine) {
        s.s_int[0] = threadIdx.x;
        s.s_u64[0] = before;
    }
    __syncthreads();
    const int j = s.s_int[0];
    // Warp 0 walks column j (ids j, j + kThreads, ...): lane L owns tiles [L * q, (L + 1) * q).
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        const int tiles = (c.vocab - j + kThreads - 1) / kThreads;
        const int q = (tiles + 31) / 32;
        const int t0 = min(tiles, lane * q), t1 = min(tiles, t0 + q);
        u64 lane_sum = 0;
        for (int t = t0; t < t1; ++t) {
            const int i = t * kThreads + j;
            const float l = c.row[i];
            if (kept(c, cut, l, i)) lane_sum += wfix(c, l);
        }
        u64 inc = lane_sum;
#pragma unroll
        for (int off = 1; off < 32; off *= 2) {
            const u64 o = __shfl_up_sync(0xffffffffu, inc, off);
            if (lane >= off) inc += o;
        }
        u64 run = s.s_u64[0] + inc - lane_sum;
        if (run <= u && u < run + lane_sum) {  // exactly one lane
            int token = t1 > t0 ? (t1 - 1) * kThreads + j : j;
            for (int t = t0; t < t1; ++t) {
                const int i = t * kThreads + j;
                const float l = c.row[i];
                if (!kept(c, cut, l, i)) continue;
                run += wfix(c, l);
                if (u < run) {
                    token = i;
                    break;
                }
            }
            s.s_int[1] = token;
        }
    }
    __syncthreads();
    const int token = s.s_int[1];
    __syncthreads();
    return token;
}

// Non-greedy choice for one row; `best` is the processed row's maximum composite key.
__device__ __noinline__ int sample_row(const SamplingRow& p, const float* row, int vocab, u64 best, Smem& s) {
    RowCtx c;
    c.row = row;
    c.vocab = vocab;
    c.mx = comp_value(best);
    if (!isfinite(c.mx)) return comp_id(best);
    const float t = p.temperature;
    c.inv_t = 1.0f / t;
    float fl = p.min_p > 0.0f ? __fadd_rn(c.mx, __fmul_rn(t, logf(p.min_p))) : __fsub_rn(c.mx, __fmul_rn(30.0f, t));
    if (!(fl <= c.mx)) fl = c.mx;  // min_p > 1 (or NaN): keep the maximum
    c.floor = fl;
    const float range = __fsub_rn(c.mx, c.floor);
    c.bin_scale = range > 0.0f ? static_cast<float>(kBins) / range : 0.0f;
    const u64 bits = philox64(p.seed, p.offset);

    const bool use_k = p.top_k > 0 && p.top_k < vocab;
    const bool use_p = p.top_p < 1.0f;
    if (!use_k && !use_p) return draw_global(c, Cut{}, s, bits);

    // Histogram of the candidates, then exclusive prefixes over bins.
    for (int b = threadIdx.x; b <= kBins; b += kThreads) s.bin_count[b] = 0, s.bin_mass[b] = 0;
    __syncthreads();
    for_row(row, vocab, [&](float l, int) {
        if (!in_set(c, l)) return;
        const int b = bin_of(c, l);
        atomicAdd(&s.bin_count[b], 1u);
        atomicAdd(&s.bin_mass[b], wfix(c, l));
    });
    __syncthreads();
    {
        constexpr int kPer = kBins / kThreads;
        uint32_t cnt[kPer];
        u64 mass[kPer], my_mass = 0, my_cnt = 0;
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            cnt[j] = s.bin_count[threadIdx.x * kPer + j];
            mass[j] = s.bin_mass[threadIdx.x * kPer + j];
            my_cnt += cnt[j];
            my_mass += mass[j];
        }
        u64 total_cnt, total_mass;
        u64 run_cnt = block_exclusive_scan(my_cnt, total_cnt, s);
        u64 run_mass = block_exclusive_scan(my_mass, total_mass, s);
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            s.bin_count[threadIdx.x * kPer + j] = static_cast<uint32_t>(run_cnt);
            s.bin_mass[threadIdx.x * kPer + j] = run_mass;
            run_cnt += cnt[j];
            run_mass += mass[j];
        }
        if (threadIdx.x == 0) {
            s.bin_count[kBins] = static_cast<uint32_t>(total_cnt);
            s.bin_mass[kBins] = total_mass;
        }
        __syncthreads();
    }
    const uint32_t c0 = s.bin_count[kBins];
    if (c0 == 0) return comp_id(best);  // cannot happen (the maximum is in the set)

    Cut cut;
    u64 total = s.bin_mass[kBins];
    int in_smem = 0;  // > 0: the kept set is s.cand[0, in_smem), sorted
    // top_k: the first kk elements.
    const uint32_t kk = use_k && static_cast<uint32_t>(p.top_k) < c0 ? static_cast<uint32_t>(p.top_k) : c0;
    if (kk < c0) {
        const int bk = find_bin(s, s.bin_count, kk);
        if (s.bin_count[bk + 1] <= static_cast<uint32_t>(kCand)) {
            const int m = collect(c, s, [&](float l, int) { return in_set(c, l) && bin_of(c, l) <= bk; });
            sort_candidates(s, m);
            in_smem = static_cast<int>(kk);
            find_in_sorted(c, s, m, false, kk, total);
        } else {
            u64 incl;
            cut.comp = resolve_bin(c, s, bk, false, kk - s.bin_count[bk], incl);
            cut.bin = bk;
            total = s.bin_mass[bk] + incl;
        }
    }
    // top_p: the first element whose running mass reaches top_p * total.
    if (use_p) {
        u64 target = static_cast<u64>(static_cast<double>(p.top_p) * static_cast<double>(total));
        if (target < 1) target = 1;
        if (target > total) target = total;
        if (in_smem > 0) {
            u64 incl;
            in_smem = find_in_sorted(c, s, in_smem, true, target, incl) + 1;
            total = incl;
        } else {
            const int bp = find_bin(s, s.bin_mass, target);
            if (s.bin_count[bp + 1] <= static_cast<uint32_t>(kCand)) {
                const Cut kc = cut;
                const int m = collect(c, s, [&](float l, int i) {
                    if (!in_set(c, l)) return false;
                    const int b = bin_of(c, l);
                    return b < bp || (b == bp && (b < kc.bin || (b == kc.bin && comp(l, i) >= kc.comp)));
                });
                sort_candidates(s, m);
                u64 incl;
                in_smem = find_in_sorted(c, s, m, true, target, incl) + 1;
                total = incl;
            } else {
                u64 incl;
                cut.comp = resolve_bin(c, s, bp, true, target - s.bin_mass[bp], incl);
                cut.bin = bp;
                total = s.bin_mass[bp] + incl;
            }
        }
    }
    if (in_smem > 0) {
        // u in [0, total): the first candidate whose running mass exceeds u.
        const u64 u = __umul64hi(bits, total);
        u64 incl;
        const int j = find_in_sorted(c, s, in_smem, true, u + 1, incl);
        return comp_id(s.cand[j]);
    }
    const int token = draw_global(c, cut, s, bits);
    return token >= 0 ? token : comp_id(best);
}

__global__ void __launch_bounds__(kThreads, 2)
    sample_kernel(float* logits, int vocab, const SamplingRow* rows, PenaltyArgs pen, int32_t* out_tokens,
                  float* out_logprob, int32_t* top_ids, float* top_logprobs) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem& s = *reinterpret_cast<Smem*>(smem_raw);
    const int r = blockIdx.x;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float* row = logits + static_cast<int64_t>(r) * vocab;
    const SamplingRow p = rows[r];
    const bool want_lp = p.num_logprobs >= 0 && out_logprob != nullptr;
    const int num_top = want_lp && top_ids != nullptr ? min(p.num_logprobs, kMaxSampleLogprobs) : 0;
    const bool greedy = p.greedy();
    const bool pen_active = p.penalised();
    const int pen_begin = pen.offsets && pen_active ? pen.offsets[r] : 0;
    const int pen_end = pen.offsets && pen_active ? pen.offsets[r + 1] : 0;
    const bool has_pen = pen_end > pen_begin;
    // Raw top lists: for the reported top ids, and to recover a penalised token's raw logit.
    const bool build_lists = num_top > 0 || has_pen;

    u64 best = 0;
    float log_z = 0.0f;
    if (want_lp) {
        // Raw row: per-thread online log-sum-exp, per-warp top-32 list (lane i holds rank i).
        float m = -INFINITY, z = 0.0f;
        u64 top = 0;
        u64 mybest = 0;
        for_row_uniform(row, vocab, [&](float l, int i) {
            const u64 k = i >= 0 ? comp(l, i) : 0;
            if (k != 0) {
                if (l > m) {
                    z = z * expf(m - l) + 1.0f;
                    m = l;
                } else if (l != -INFINITY) {
                    z += expf(l - m);
                }
                mybest = k > mybest ? k : mybest;
            }
            if (!build_lists) return;
            unsigned ins = __ballot_sync(0xffffffffu, k > __shfl_sync(0xffffffffu, top, 31));
            while (ins) {
                const int src = __ffs(ins) - 1;
                ins &= ins - 1;
                const u64 kk = __shfl_sync(0xffffffffu, k, src);
                if (kk <= __shfl_sync(0xffffffffu, top, 31)) continue;
                const int pos = __popc(__ballot_sync(0xffffffffu, top > kk));
                const u64 up = __shfl_up_sync(0xffffffffu, top, 1);
                if (lane == pos)
                    top = kk;
                else if (lane > pos)
                    top = up;
            }
        });
        // Combine (m, z) over the CTA.
        float mw = m;
#pragma unroll
        for (int off = 16; off > 0; off /= 2) mw = fmaxf(mw, __shfl_xor_sync(0xffffffffu, mw, off));
        if (lane == 0) s.redf[warp] = mw;
        __syncthreads();
        float mall = -INFINITY;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) mall = fmaxf(mall, s.redf[w]);
        float zt = m == -INFINITY ? 0.0f : z * expf(m - mall);
#pragma unroll
        for (int off = 16; off > 0; off /= 2) zt += __shfl_xor_sync(0xffffffffu, zt, off);
        if (lane == 0) s.redf2[warp] = zt;
        s.raw_top[warp * 32 + lane] = top;
        __syncthreads();
        float zall = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) zall += s.redf2[w];
        log_z = mall + logf(zall);
        // Sort the union of the warp lists (kRawTop == kThreads: one pair per thread per stage).
        for (int size = 2; build_lists && size <= kRawTop; size *= 2) {
            for (int stride = size / 2; stride > 0; stride /= 2) {
                const int i = threadIdx.x;
                if (i < kRawTop / 2) {
                    const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
                    const bool desc = (lo & size) == 0;
                    const u64 a = s.raw_top[lo], b = s.raw_top[hi];
                    if ((a < b) == desc) s.raw_top[lo] = b, s.raw_top[hi] = a;
                }
                __syncthreads();
            }
        }
        if (top_ids != nullptr && threadIdx.x < kMaxSampleLogprobs) {
            const u64 k = s.raw_top[threadIdx.x];
            const bool ok = static_cast<int>(threadIdx.x) < num_top && k != 0;
            top_ids[static_cast<int64_t>(r) * kMaxSampleLogprobs + threadIdx.x] = ok ? comp_id(k) : -1;
            if (top_logprobs)
                top_logprobs[static_cast<int64_t>(r) * kMaxSampleLogprobs + threadIdx.x] =
                    ok ? comp_value(k) - log_z : -INFINITY;
        }
        if (!has_pen) best = block_max_u64(mybest, s);  // raw = processed
    } else if (top_ids != nullptr && threadIdx.x < kMaxSampleLogprobs) {
        top_ids[static_cast<int64_t>(r) * kMaxSampleLogprobs + threadIdx.x] = -1;
        if (top_logprobs) top_logprobs[static_cast<int64_t>(r) * kMaxSampleLogprobs + threadIdx.x] = -INFINITY;
    }

    if (has_pen) {
        // Tokens are unique within a row's list; count 0: prompt only (repetition penalty only).
        for (int j = pen_begin + threadIdx.x; j < pen_end; j += kThreads) {
            const int t = pen.tokens[j];
            if (t < 0 || t >= vocab) continue;
            float l = row[t];
            if (p.repetition_penalty != 1.0f) l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
            const int cnt = pen.counts ? pen.counts[j] : 0;
            if (cnt > 0)
                l = __fsub_rn(l,
                              __fadd_rn(__fmul_rn(p.frequency_penalty, static_cast<float>(cnt)), p.presence_penalty));
            row[t] = l;
        }
        __syncthreads();
    }
    if (!want_lp || has_pen) {
        u64 mine = 0;
        for_row(row, vocab, [&](float l, int i) {
            const u64 k = comp(l, i);
            mine = k > mine ? k : mine;
        });
        best = block_max_u64(mine, s);
    }

    int token;
    if (best == 0)
        token = 0;  // every logit NaN
    else if (greedy)
        token = comp_id(best);
    else
        token = sample_row(p, row, vocab, best, s);

    if (want_lp) {
        // The chosen token's raw logit: the row's value unless a penalty changed it; then the
        // raw top lists hold it exactly when it was among them, else the penalty is undone.
        if (threadIdx.x == 0) s.s_f = row[token];
        __syncthreads();
        float raw = s.s_f;
        if (has_pen) {
            __syncthreads();
            for (int j = pen_begin + threadIdx.x; j < pen_end; j += kThreads) {
                if (pen.tokens[j] != token) continue;  // at most one entry
                float l = raw;
                const int cnt = pen.counts ? pen.counts[j] : 0;
                if (cnt > 0)
                    l = __fadd_rn(
                        l, __fadd_rn(__fmul_rn(p.frequency_penalty, static_cast<float>(cnt)), p.presence_penalty));
                if (p.repetition_penalty != 1.0f) l = l > 0.0f ? l * p.repetition_penalty : l / p.repetition_penalty;
                s.s_f = l;
            }
            __syncthreads();
            for (int i = threadIdx.x; i < kRawTop; i += kThreads) {
                const u64 k = s.raw_top[i];
                if (k != 0 && comp_id(k) == token) s.s_f = comp_value(k);  // exact
            }
            __syncthreads();
            raw = s.s_f;
        }
        if (threadIdx.x == 0) out_logprob[r] = raw - log_z;
    } else if (threadIdx.x == 0 && out_logprob != nullptr) {
        out_logprob[r] = 0.0f;
    }
    if (threadIdx.x == 0) out_tokens[r] = token;
}

constexpr size_t kSmemBytes = sizeof(Smem);

// ---- greedy fast path ----------------------------------------------------------------------
// A row's argmax over kArgmaxChunks CTAs whose threads each issue all their loads at once (16
// bytes each; a 128K-logit row is then one round trip from L2, where the LM head left it), then
// one warp per row folds the partials. Same rule as the greedy path of sample_kernel: the
// largest value, the lowest id on ties, NaN never chosen (an order-independent fold).
__device__ __forceinline__ bool argmax_better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);  // false for NaN v
}

// V: logits per load (4 when rows are 16-byte aligned, else 1).
template <int V>
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_partial_kernel(const float* __restrict__ logits, int vocab, ArgmaxPartial* __restrict__ partials) {
    pdl_launch_dependents();
    pdl_wait();
    const int row = blockIdx.y, chunk = blockIdx.x;
    const int vecs = (vocab + V - 1) / V;  // V-wide groups in the row
    const int per = (vecs + kArgmaxChunks - 1) / kArgmaxChunks;
    const int begin = chunk * per, end = min(vecs, begin + per);
    const float* l = logits + static_cast<int64_t>(row) * vocab;
    float bv = -INFINITY;
    int bi = INT_MAX;
    auto take = [&](float v, int i) {
        if (argmax_better(v, i, bv, bi)) bv = v, bi = i;
    };
#pragma unroll 4
    for (int g = begin + threadIdx.x; g < end; g += kArgmaxThreads) {
        if constexpr (V == 4) {
            const float4 v = __ldg(reinterpret_cast<const float4*>(l) + g);
            take(v.x, 4 * g), take(v.y, 4 * g + 1), take(v.z, 4 * g + 2), take(v.w, 4 * g + 3);
        } else {
            take(__ldg(l + g), g);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        take(ov, oi);
    }
    __shared__ ArgmaxPartial warp_best[kArgmaxThreads / 32];
    if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = {bv, bi};
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < kArgmaxThreads / 32; ++w) take(warp_best[w].value, warp_best[w].index);
        partials[static_cast<int64_t>(row) * kArgmaxChunks + chunk] = {bv, bi};
    }
}

// One warp per row, kArgmaxChunks / 32 partials per lane.
__global__ void argmax_final_kernel(const ArgmaxPartial* __restrict__ partials, int n, int32_t* __restrict__ out,
                                    int32_t* out_host) {
    pdl_launch_dependents();
    pdl_wait();
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    ArgmaxPartial b{-INFINITY, INT_MAX};
    for (int c = lane; c < kArgmaxChunks; c += 32) {
        const ArgmaxPartial p = partials[static_cast<int64_t>(row) * kArgmaxChunks + c];
        if (argmax_better(p.value, p.index, b.value, b.index)) b = p;
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
        const float ov = __shfl_xor_sync(0xffffffffu, b.value, o);
        const int oi = __shfl_xor_sync(0xffffffffu, b.index, o);
        if (argmax_better(ov, oi, b.value, b.index)) b.value = ov, b.index = oi;
    }
    if (lane == 0) {
        const int32_t token = b.index == INT_MAX ? 0 : b.index;  // a row of NaN only: token 0
        out[row] = token;
        if (out_host) out_host[row] = token;
    }
}

}  // namespace

size_t sample_workspace_bytes(int n, int vocab) {
    (void)vocab;
    // sample() keeps its scratch in shared memory; greedy_argmax needs its partials here.
    return static_cast<size_t>(std::max(n, 0)) * kArgmaxChunks * sizeof(ArgmaxPartial);
}

void sample(float* logits, int n, int vocab, const SamplingRow* rows, const PenaltyArgs& penalties, int32_t* out_tokens,
            float* out_logprob, int32_t* top_ids, float* top_logprobs, void* workspace, cudaStream_t stream) {
    (void)workspace;
    if (n <= 0) return;
    if (vocab <= 0) fail("sample: vocab ", vocab);
    // Opt in to > 48 KB of shared memory once per device (not a stream operation).
    static std::atomic<uint64_t> opted_in{0};
    int device = 0;
    PG_CUDA_CHECK(cudaGetDevice(&device));
    const uint64_t bit = 1ull << (device & 63);
    if (!(opted_in.load(std::memory_order_relaxed) & bit)) {
        PG_CUDA_CHECK(cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kSmemBytes)));
        opted_in.fetch_or(bit);
    }
    sample_kernel<<<n, kThreads, kSmemBytes, stream>>>(logits, vocab, rows, penalties, out_tokens, out_logprob, top_ids,
                                                       top_logprobs);
    check_launch("sample");
}

void greedy_argmax(const float* logits, int n, int vocab, int32_t* out_tokens, int32_t* out_host, void* workspace,
                   cudaStream_t stream) {
    if (n <= 0) return;
    if (vocab <= 0) fail("greedy_argmax: vocab ", vocab);
    auto* partials = static_cast<ArgmaxPartial*>(workspace);
    const dim3 grid(kArgmaxChunks, static_cast<unsigned>(n));
    if (vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0)
        launch_pdl(argmax_partial_kernel<4>, grid, dim3(kArgmaxThreads), 0, stream, logits, vocab, partials);
    else
        launch_pdl(argmax_partial_kernel<1>, grid, dim3(kArgmaxThreads), 0, stream, logits, vocab, partials);
    check_launch("greedy_argmax");
    launch_pdl(argmax_final_kernel, dim3(static_cast<unsigned>((n + 3) / 4)), dim3(128), 0, stream,
               static_cast<const ArgmaxPartial*>(partials), n, out_tokens, out_host);
    check_launch("greedy_argmax");
}

}  // namespace peregrine::cuda
