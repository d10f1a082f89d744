// The KV host tier's CUDA copies (CudaBackend::copy_blocks_to_host / _from_host, one kernel
// through the pinned buffer's device alias, cudaMemcpyAsync for pieces that are not 16-byte
// sized): blocks go out to their slots byte for byte in the slot layout device.h documents,
// and come back to other blocks unchanged, for a batch larger than the kernel's grid.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace peregrine {
namespace {

// `rows_per_block` x `row_elems` bf16 values a block in each of 2 layers' K and V.
void round_trip(int64_t row_elems, int num_blocks, int num_moves) {
    CudaBackend b;
    const int64_t rows_per_block = 4;
    std::vector<Tensor> caches;
    std::vector<std::vector<uint16_t>> contents;
    std::mt19937 rng(static_cast<uint32_t>(row_elems * 131 + num_moves));
    for (int c = 0; c < 4; ++c) {  // layer 0 K, V, layer 1 K, V
        caches.push_back(b.allocate(DType::BF16, {num_blocks, rows_per_block, row_elems}));
        std::vector<uint16_t> v(static_cast<size_t>(num_blocks * rows_per_block * row_elems));
        for (auto& x : v) x = static_cast<uint16_t>(rng());
        b.upload(v.data(), caches.back());
        contents.push_back(std::move(v));
    }
    const size_t block_bytes = static_cast<size_t>(rows_per_block * row_elems) * 2;
    const size_t slot_bytes = 4 * block_bytes;
    const int num_slots = num_moves + 3;
    char* host = static_cast<char*>(b.allocate_host(num_slots * slot_bytes));
    std::memset(host, 0, num_slots * slot_bytes);

    // Out: block i -> slot num_slots - 1 - i (reversed, so no identity mapping hides an error).
    std::vector<std::pair<int32_t, int32_t>> out;
    for (int i = 0; i < num_moves; ++i) out.emplace_back(i % num_blocks, num_slots - 1 - i);
    b.copy_blocks_to_host(caches, out, host, slot_bytes);
    b.synchronize();
    for (const auto& [block, slot] : out)
        for (int c = 0; c < 4; ++c)
            ASSERT_EQ(std::memcmp(host + slot * slot_bytes + c * block_bytes,
                                  contents[c].data() + block * rows_per_block * row_elems, block_bytes),
                      0)
                << "block " << block << " slot " << slot << " cache " << c;

    // Back: slot -> block (num_blocks - 1 - block), over blocks the copies overwrite.
    std::vector<std::pair<int32_t, int32_t>> in;
    for (const auto& [block, slot] : out)
        if (static_cast<int>(in.size()) < num_blocks) in.emplace_back(slot, num_blocks - 1 - block);
    b.copy_blocks_from_host(host, slot_bytes, in, caches);
    b.synchronize();
    for (int c = 0; c < 4; ++c) {
        std::vector<uint16_t> got(contents[c].size());
        b.download(caches[c], got.data());
        for (const auto& [slot, block] : in) {
            const uint16_t* want = reinterpret_cast<const uint16_t*>(host + slot * slot_bytes + c * block_bytes);
            ASSERT_EQ(std::memcmp(got.data() + block * rows_per_block * row_elems, want, block_bytes), 0)
                << "slot " << slot << " block " << block << " cache " << c;
        }
    }
    b.free_host(host);
    for (Tensor& t : caches) b.release(t);
}

TEST(CudaHostTier, BlocksRoundTripThroughTheCopyKernel) {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    round_trip(/*row_elems=*/64, /*num_blocks=*/64, /*num_moves=*/40);
    round_trip(128, 4096, 4500);  // 18,000 pieces: more than the kernel's 4,096-CTA grid
}

TEST(CudaHostTier, UnalignedPiecesGoByMemcpy) {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    round_trip(/*row_elems=*/3, /*num_blocks=*/16, /*num_moves=*/10);  // 24-byte pieces
}

}  // namespace
}  // namespace peregrine
