// The FP8 KV-cache writes (rope_and_cache_fp8, rope_and_cache_packed_fp8) against the bf16
// launchers on the same inputs: q (rotated) bit for bit the same, and each written (slot, kv head)
// of k and v the host quantizer's codes and scale of what the bf16 launcher wrote (core/kv_fp8.h:
// the same IEEE steps, so the same bits; a code may differ by one step at most). Slots nobody
// writes (padding tokens, unused slots) keep their bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "core/kv_fp8.h"
#include "support/cuda_test_util.h"

namespace peregrine {
namespace {

using cuda_test::DeviceBuffer;

struct WriteCase {
    int head_dim, num_heads, num_kv_heads, rotary_dim;
    bool neox;
    bool packed;
};

// |a - b| in E4M3 steps for codes of one sign (a sign change counts as far).
int code_distance(uint8_t a, uint8_t b) {
    if ((a ^ b) & 0x80) return (a & 0x7f) == 0 && (b & 0x7f) == 0 ? 0 : 1000;
    return std::abs(static_cast<int>(a & 0x7f) - static_cast<int>(b & 0x7f));
}

void check_write(const WriteCase& c, std::mt19937& rng) {
    SCOPED_TRACE(testing::Message() << "head_dim " << c.head_dim << " heads " << c.num_heads << "/" << c.num_kv_heads
                                    << " rotary " << c.rotary_dim << " neox " << c.neox << " packed " << c.packed);
    const int n = 19, bs = 16, blocks = 4;
    const int D = c.head_dim, H = c.num_heads, KVH = c.num_kv_heads;
    const int64_t q_dim = int64_t{H} * D, kv_dim = int64_t{KVH} * D;
    std::vector<float> inv_freq(c.rotary_dim / 2);
    for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / c.rotary_dim);
    // Rows of q | k | v; heads of very different magnitudes (scales far apart).
    std::vector<float> qkv = cuda_test::random_floats(n * (q_dim + 2 * kv_dim), rng, -3.0f, 3.0f);
    for (size_t i = 0; i < qkv.size(); ++i)
        if ((i / D) % 3 == 1) qkv[i] *= 40.0f;
    for (int d = 0; d < D; ++d) qkv[q_dim + 2 * kv_dim + q_dim + d] = 0.0f;  // token 1's first k head: zeros
    const std::vector<uint16_t> qkv_bf = cuda_test::to_bf16(qkv);
    std::vector<int32_t> positions(n), slots(n), perm(blocks * bs);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int t = 0; t < n; ++t) {
        positions[t] = t < 4 ? t : static_cast<int32_t>(rng() % 30000);
        slots[t] = t % 6 == 4 ? -1 : perm[t];
    }
    DeviceBuffer<float> d_inv(inv_freq);
    DeviceBuffer<int32_t> d_pos(positions), d_slots(slots);
    cuda::DeviceBatch db;
    db.num_tokens = n;
    db.num_seqs = 1;
    db.block_size = bs;
    db.positions = d_pos.get();
    db.slot_mapping = d_slots.get();

    // bf16 caches and FP8 caches (poisoned: every byte 0x5a, never a valid scale of a written slot).
    DeviceBuffer<uint16_t> kc(int64_t{blocks} * bs * kv_dim), vc(kc.size());
    const int64_t f8_bytes = int64_t{blocks} * bs * KVH * kv_fp8_cols(D);
    DeviceBuffer<uint8_t> k8(f8_bytes), v8(f8_bytes);
    k8.fill_bytes(0x5a);
    v8.fill_bytes(0x5a);
    std::vector<uint16_t> q_bf16, q_f8;
    if (c.packed) {
        DeviceBuffer<uint16_t> a(qkv_bf), b(qkv_bf), qa(n * q_dim), qb(n * q_dim);
        cuda::rope_and_cache_packed(a.get(), qa.get(), db, d_inv.get(), c.rotary_dim, 1.0f, c.neox, H, KVH, D, kc.get(),
                                    vc.get(), nullptr);
        cuda::rope_and_cache_packed_fp8(b.get(), qb.get(), db, d_inv.get(), c.rotary_dim, 1.0f, c.neox, H, KVH, D,
                                        k8.get(), v8.get(), nullptr);
        q_bf16 = qa.download();
        q_f8 = qb.download();
    } else {
        // Unpacked: q, k, v apart (the qk-norm layers' path).
        std::vector<uint16_t> q(n * q_dim), k(n * kv_dim), v(n * kv_dim);
        for (int t = 0; t < n; ++t) {
            const uint16_t* row = qkv_bf.data() + t * (q_dim + 2 * kv_dim);
            std::copy(row, row + q_dim, q.begin() + t * q_dim);
            std::copy(row + q_dim, row + q_dim + kv_dim, k.begin() + t * kv_dim);
            std::copy(row + q_dim + kv_dim, row + q_dim + 2 * kv_dim, v.begin() + t * kv_dim);
        }
        DeviceBuffer<uint16_t> qa(q), ka(k), qb(q), kb(k), dv(v);
        cuda::rope_and_cache(qa.get(), ka.get(), dv.get(), db, d_inv.get(), c.rotary_dim, 1.0f, c.neox, H, KVH, D,
                             kc.get(), vc.get(), nullptr);
        cuda::rope_and_cache_fp8(qb.get(), kb.get(), dv.get(), db, d_inv.get(), c.rotary_dim, 1.0f, c.neox, H, KVH, D,
                                 k8.get(), v8.get(), nullptr);
        q_bf16 = qa.download();
        q_f8 = qb.download();
        EXPECT_EQ(ka.download(), kb.download()) << "k is rotated in place the same";
    }
    EXPECT_EQ(q_bf16, q_f8) << "q is rotated the same";

    const std::vector<uint16_t> kbf = kc.download(), vbf = vc.download();
    const std::vector<uint8_t> g8[2] = {k8.download(), v8.download()};
    const KvFp8Layout f{bs, KVH, D};
    std::vector<bool> written(blocks * bs, false);
    int off_by_one = 0;
    for (int t = 0; t < n; ++t) {
        if (slots[t] < 0) continue;
        written[slots[t]] = true;
        for (int h = 0; h < KVH; ++h) {
            for (int which = 0; which < 2; ++which) {
                const uint16_t* src = (which == 0 ? kbf : vbf).data() + (int64_t{slots[t]} * KVH + h) * D;
                std::vector<float> x(D);
                for (int d = 0; d < D; ++d) x[d] = bf16_to_f32(src[d]);
                std::vector<uint8_t> want(D);
                uint16_t want_scale = 0;
                kv_fp8_quantize_head(x.data(), D, want.data(), &want_scale);
                const uint8_t* got = g8[which].data() + f.code_offset(slots[t], h);
                uint16_t got_scale;
                std::memcpy(&got_scale, g8[which].data() + f.scale_offset(slots[t], h), 2);
                ASSERT_EQ(got_scale, want_scale) << "token " << t << " head " << h << (which ? " v" : " k");
                for (int d = 0; d < D; ++d) {
                    const int dist = code_distance(got[d], want[d]);
                    ASSERT_LE(dist, 1) << "token " << t << " head " << h << " dim " << d << (which ? " v" : " k");
                    off_by_one += dist;
                }
            }
        }
    }
    EXPECT_EQ(off_by_one, 0) << "codes one step off (allowed, but the same IEEE steps should agree exactly)";
    for (int s = 0; s < blocks * bs; ++s) {
        if (written[s]) continue;
        for (int which = 0; which < 2; ++which)
            for (int h = 0; h < KVH; ++h) {
                for (int d = 0; d < D; ++d) ASSERT_EQ(g8[which][f.code_offset(s, h) + d], 0x5a) << "slot " << s;
                ASSERT_EQ(g8[which][f.scale_offset(s, h)], 0x5a) << "slot " << s;
            }
    }
}

TEST(CudaKvFp8, CacheWritesQuantizeWhatBf16WritesWouldHold) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(21);
    for (bool packed : {false, true}) {
        for (bool neox : {true, false}) {
            check_write({64, 8, 2, 64, neox, packed}, rng);
            check_write({128, 4, 4, 128, neox, packed}, rng);
            check_write({128, 8, 1, 64, neox, packed}, rng);  // partial rotary, one kv head
        }
        check_write({8, 4, 4, 8, true, packed}, rng);
        check_write({80, 4, 2, 80, true, packed}, rng);
        check_write({256, 2, 2, 256, true, packed}, rng);
    }
}

TEST(CudaKvFp8, CacheWritesRefuseShapesTheReadersCannotTake) {
    PG_SKIP_WITHOUT_CUDA();
    DeviceBuffer<uint8_t> k8(4096), v8(4096);
    DeviceBuffer<uint16_t> qkv(64 * 4), q(64 * 2);
    DeviceBuffer<int32_t> pos(std::vector<int32_t>{0}), slots(std::vector<int32_t>{0});
    DeviceBuffer<float> inv(std::vector<float>(32, 1.0f));
    cuda::DeviceBatch db;
    db.num_tokens = 1;
    db.num_seqs = 1;
    db.positions = pos.get();
    db.slot_mapping = slots.get();
    db.block_size = 2;  // 2 tokens x 1 kv head: codes of a head not 8-byte aligned
    EXPECT_THROW(cuda::rope_and_cache_packed_fp8(qkv.get(), q.get(), db, inv.get(), 64, 1.0f, true, 2, 1, 64, k8.get(),
                                                 v8.get(), nullptr),
                 Error);
    db.block_size = 12;  // not a power of two
    EXPECT_THROW(cuda::rope_and_cache_packed_fp8(qkv.get(), q.get(), db, inv.get(), 64, 1.0f, true, 2, 1, 64, k8.get(),
                                                 v8.get(), nullptr),
                 Error);
}

}  // namespace
}  // namespace peregrine
