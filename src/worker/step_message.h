// What rank 0 sends the other ranks of its group for each thing they must do in step with it
// (dist/control_channel.h carries the bytes): run a batch, copy KV blocks (within the pool, or
// to and from the host tier), stop.
//
// Wire format (host byte order: every rank of a group runs the same build on the same kind of
// host): [u8 op], then for kExecute [i32 max_blocks_per_seq] and the seven int32 arrays of
// BatchInput in declaration order, each [u32 count][count x i32]; for kCopyBlocks, kOffload and
// kOnload [u32 count][count x (i32 src, i32 dst)]; kStop has nothing more.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/batch.h"

namespace peregrine {

struct StepMessage {
    enum Op : uint8_t { kExecute = 1, kCopyBlocks = 2, kStop = 3, kOffload = 4, kOnload = 5 };
    Op op = kStop;
    BatchInput batch;  // kExecute
    // kCopyBlocks: (src, dst) blocks; kOffload: (device block, host slot); kOnload: (host slot,
    // device block).
    std::vector<std::pair<int32_t, int32_t>> copies;
};

std::string encode_execute(const BatchInput& batch);
std::string encode_copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs);
// kOffload or kOnload with its pairs (ModelExecutor::offload_blocks / onload_blocks).
std::string encode_tier_copies(StepMessage::Op op, const std::vector<std::pair<int32_t, int32_t>>& pairs);
std::string encode_stop();
// Throws Error when `bytes` is not a whole message of a known op.
StepMessage decode_step(const std::string& bytes);

}  // namespace peregrine
