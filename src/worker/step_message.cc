#include "worker/step_message.h"

#include <cstring>

#include "core/error.h"

namespace peregrine {

namespace {

void put(std::string& out, const void* p, size_t n) {
    if (n > 0) out.append(static_cast<const char*>(p), n);  // an empty vector's data() may be null
}

void put_array(std::string& out, const std::vector<int32_t>& v) {
    const uint32_t n = static_cast<uint32_t>(v.size());
    put(out, &n, 4);
    put(out, v.data(), v.size() * 4);
}

// Reads fields off the front of a message, failing on a short one.
struct Reader {
    const std::string& in;
    size_t at = 1;  // past the op

    void take(void* p, size_t n) {
        if (n == 0) return;  // an empty vector's data() may be null: no memcpy from or to it
        if (in.size() - at < n) fail("step message: truncated (", in.size(), " bytes)");
        std::memcpy(p, in.data() + at, n);
        at += n;
    }
    uint32_t count(size_t element_bytes) {
        uint32_t n = 0;
        take(&n, 4);
        if ((in.size() - at) / element_bytes < n) fail("step message: an array of ", n, " runs past the end");
        return n;
    }
    void array(std::vector<int32_t>& v) {
        v.resize(count(4));
        take(v.data(), v.size() * 4);
    }
};

}  // namespace

std::string encode_execute(const BatchInput& b) {
    std::string out(1, static_cast<char>(StepMessage::kExecute));
    put(out, &b.max_blocks_per_seq, 4);
    for (const std::vector<int32_t>* v : {&b.token_ids, &b.positions, &b.query_start, &b.context_lens, &b.block_tables,
                                          &b.slot_mapping, &b.logits_indices})
        put_array(out, *v);
    return out;
}

std::string encode_copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    return encode_tier_copies(StepMessage::kCopyBlocks, pairs);
}

std::string encode_tier_copies(StepMessage::Op op, const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    PG_CHECK(op == StepMessage::kCopyBlocks || op == StepMessage::kOffload || op == StepMessage::kOnload);
    std::string out(1, static_cast<char>(op));
    const uint32_t n = static_cast<uint32_t>(pairs.size());
    put(out, &n, 4);
    for (const auto& [src, dst] : pairs) {
        put(out, &src, 4);
        put(out, &dst, 4);
    }
    return out;
}

std::string encode_stop() {
    return std::string(1, static_cast<char>(StepMessage::kStop));
}

StepMessage decode_step(const std::string& bytes) {
    if (bytes.empty()) fail("step message: empty");
    StepMessage m;
    Reader r{bytes};
    switch (static_cast<uint8_t>(bytes[0])) {
        case StepMessage::kExecute: {
            m.op = StepMessage::kExecute;
            BatchInput& b = m.batch;
            r.take(&b.max_blocks_per_seq, 4);
            for (std::vector<int32_t>* v : {&b.token_ids, &b.positions, &b.query_start, &b.context_lens,
                                            &b.block_tables, &b.slot_mapping, &b.logits_indices})
                r.array(*v);
            break;
        }
        case StepMessage::kCopyBlocks:
        case StepMessage::kOffload:
        case StepMessage::kOnload: {
            m.op = static_cast<StepMessage::Op>(bytes[0]);
            m.copies.resize(r.count(8));
            for (auto& [src, dst] : m.copies) {
                r.take(&src, 4);
                r.take(&dst, 4);
            }
            break;
        }
        case StepMessage::kStop:
            m.op = StepMessage::kStop;
            break;
        default:
            fail("step message: unknown op ", static_cast<int>(static_cast<uint8_t>(bytes[0])));
    }
    if (r.at != bytes.size()) fail("step message: ", bytes.size() - r.at, " bytes past the end");
    return m;
}

}  // namespace peregrine
