// What rank 0 sends its group each step (src/worker/step_message.h): every field survives the
// trip, and a damaged message is an Error, never a batch.
#include <gtest/gtest.h>

#include "core/error.h"
#include "worker/step_message.h"

namespace peregrine {
namespace {

BatchInput sample_batch() {
    BatchInput b;
    b.token_ids = {1, 403, 407, 9, -3};  // -3: a device draw fed back
    b.positions = {0, 1, 2, 0, 7};
    b.query_start = {0, 3, 5};
    b.context_lens = {3, 8};
    b.max_blocks_per_seq = 2;
    b.block_tables = {0, -1, 4, 5};
    b.slot_mapping = {0, 1, 2, 64, 87};
    b.logits_indices = {2, 4};
    return b;
}

TEST(StepMessage, ExecuteKeepsEveryField) {
    const BatchInput b = sample_batch();
    const StepMessage m = decode_step(encode_execute(b));
    ASSERT_EQ(m.op, StepMessage::kExecute);
    EXPECT_EQ(m.batch.token_ids, b.token_ids);
    EXPECT_EQ(m.batch.positions, b.positions);
    EXPECT_EQ(m.batch.query_start, b.query_start);
    EXPECT_EQ(m.batch.context_lens, b.context_lens);
    EXPECT_EQ(m.batch.max_blocks_per_seq, b.max_blocks_per_seq);
    EXPECT_EQ(m.batch.block_tables, b.block_tables);
    EXPECT_EQ(m.batch.slot_mapping, b.slot_mapping);
    EXPECT_EQ(m.batch.logits_indices, b.logits_indices);
}

TEST(StepMessage, EmptyBatchCopiesAndStop) {
    EXPECT_EQ(decode_step(encode_execute(BatchInput{})).batch.num_tokens(), 0);
    const std::vector<std::pair<int32_t, int32_t>> pairs = {{3, 9}, {0, 1 << 30}};
    const StepMessage c = decode_step(encode_copy_blocks(pairs));
    EXPECT_EQ(c.op, StepMessage::kCopyBlocks);
    EXPECT_EQ(c.copies, pairs);
    EXPECT_EQ(decode_step(encode_stop()).op, StepMessage::kStop);
}

TEST(StepMessage, HostTierCopiesKeepTheirOpAndPairs) {
    const std::vector<std::pair<int32_t, int32_t>> pairs = {{7, 0}, {2, 63}};
    for (const auto op : {StepMessage::kOffload, StepMessage::kOnload}) {
        const StepMessage m = decode_step(encode_tier_copies(op, pairs));
        EXPECT_EQ(m.op, op);
        EXPECT_EQ(m.copies, pairs);
        const std::string bytes = encode_tier_copies(op, pairs);
        EXPECT_THROW(decode_step(bytes.substr(0, bytes.size() - 3)), Error);
    }
    EXPECT_TRUE(decode_step(encode_tier_copies(StepMessage::kOnload, {})).copies.empty());
}

TEST(StepMessage, DamagedMessagesAreErrors) {
    const std::string good = encode_execute(sample_batch());
    EXPECT_THROW(decode_step(""), Error);
    EXPECT_THROW(decode_step(std::string(1, '\x7f')), Error);  // unknown op
    for (size_t cut : {size_t{1}, size_t{4}, size_t{9}, good.size() - 1})
        EXPECT_THROW(decode_step(good.substr(0, cut)), Error) << "cut at " << cut;
    EXPECT_THROW(decode_step(good + "x"), Error);  // trailing bytes
    std::string huge = good;
    huge[5] = '\xff';  // token count 0xff.. past the end: refused before any allocation
    huge[6] = '\xff';
    EXPECT_THROW(decode_step(huge), Error);
    EXPECT_THROW(decode_step(encode_stop() + "x"), Error);
}

}  // namespace
}  // namespace peregrine
