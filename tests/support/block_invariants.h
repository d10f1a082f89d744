// The block manager's invariants as engine tests check them after every step: a block's count
// equals the live tables holding it, no table holds a block twice, the used blocks are exactly
// the held ones, and the host tier holds at most its slots (reserved swap slots included).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "engine/engine_core.h"

namespace peregrine::testing {

inline void check_invariants(const EngineCore& core) {
    const BlockManager& bm = core.block_manager();
    std::vector<int> refs(bm.num_blocks(), 0);
    for (const Sequence* s : core.live_sequences()) {
        std::vector<int32_t> t = s->block_table;
        std::sort(t.begin(), t.end());
        ASSERT_EQ(std::adjacent_find(t.begin(), t.end()), t.end()) << "a table holds a block twice";
        for (int32_t b : t) ++refs[b];
    }
    int used = 0;
    for (int b = 0; b < bm.num_blocks(); ++b) {
        ASSERT_EQ(bm.ref_count(b), refs[b]) << "block " << b;
        used += refs[b] > 0;
    }
    ASSERT_EQ(bm.num_used(), used);
    if (const HostBlockPool* host = bm.host()) {
        ASSERT_LE(host->num_used(), host->num_slots());
        ASSERT_LE(host->num_reserved(), host->num_used());
    }
}

}  // namespace peregrine::testing
