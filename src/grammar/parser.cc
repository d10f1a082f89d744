#include "grammar/parser.h"

#include <algorithm>

#include "core/error.h"

namespace peregrine::grammar {

namespace {

uint64_t key_of(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32 | uint32_t(b)) + 1;
}

size_t hash_of(uint64_t k) {
    return size_t((k * 0x9E3779B97F4A7C15ull) >> 20);
}

}  // namespace

Parser::Parser(const CompiledGrammar& g) : g_(g) {
    seen_.assign(64, 0);
    reset(g.rule_start[size_t(g.root)]);
}

void Parser::reset(int32_t node) {
    frames_.clear();
    frame_need_.clear();
    frame_keys_.assign(1024, 0);
    frame_vals_.assign(1024, -1);
    tops_.clear();
    step_begin_.assign(1, 0);
    step_end_.assign(1, 0);
    close(node, -1);
    for (uint64_t s : seen_slots_) seen_[size_t(s)] = 0;
    seen_slots_.clear();
}

int32_t Parser::intern_frame(int32_t node, int32_t parent) {
    if ((frames_.size() + 1) * 2 > frame_keys_.size()) {
        std::vector<uint64_t> keys(frame_keys_.size() * 2, 0);
        std::vector<int32_t> vals(keys.size(), -1);
        size_t mask = keys.size() - 1;
        for (size_t i = 0; i < frame_keys_.size(); ++i) {
            if (!frame_keys_[i]) continue;
            size_t h = hash_of(frame_keys_[i]) & mask;
            while (keys[h]) h = (h + 1) & mask;
            keys[h] = frame_keys_[i];
            vals[h] = frame_vals_[i];
        }
        frame_keys_ = std::move(keys);
        frame_vals_ = std::move(vals);
    }
    uint64_t k = key_of(node, parent);
    size_t mask = frame_keys_.size() - 1;
    size_t h = hash_of(k) & mask;
    while (frame_keys_[h]) {
        if (frame_keys_[h] == k) return frame_vals_[h];
        h = (h + 1) & mask;
    }
    frame_keys_[h] = k;
    frame_vals_[h] = int32_t(frames_.size());
    frames_.push_back(Top{node, parent});
    const int64_t need = int64_t(g_.min_bytes[size_t(node)]) + (parent >= 0 ? frame_need_[size_t(parent)] : 0);
    frame_need_.push_back(int32_t(std::min<int64_t>(need, kNoCompletion)));
    return frame_vals_[h];
}

// Adds to the current (last) step every top reachable from (node, frame) without reading a byte:
// entering called rules and returning from completed ones.
void Parser::close(int32_t node0, int32_t frame0) {
    work_.clear();
    work_.push_back(Top{node0, frame0});
    while (!work_.empty()) {
        Top t = work_.back();
        work_.pop_back();
        // Visited set: open addressing in seen_, cleared through seen_slots_ at step end.
        uint64_t k = key_of(t.node, t.frame);
        if (seen_slots_.size() * 2 >= seen_.size()) {
            std::vector<uint64_t> old;
            old.swap(seen_);
            seen_.assign(old.size() * 2, 0);
            std::vector<uint64_t> slots;
            size_t mask = seen_.size() - 1;
            for (uint64_t s : seen_slots_) {
                uint64_t key = old[size_t(s)];
                size_t h = hash_of(key) & mask;
                while (seen_[h]) h = (h + 1) & mask;
                seen_[h] = key;
                slots.push_back(h);
            }
            seen_slots_ = std::move(slots);
        }
        size_t mask = seen_.size() - 1;
        size_t h = hash_of(k) & mask;
        bool dup = false;
        while (seen_[h]) {
            if (seen_[h] == k) {
                dup = true;
                break;
            }
            h = (h + 1) & mask;
        }
        if (dup) continue;
        seen_[h] = k;
        seen_slots_.push_back(h);

        const Node& n = g_.nodes[size_t(t.node)];
        if (n.byte_begin != n.byte_end) tops_.push_back(t);
        for (uint32_t c = n.call_begin; c < n.call_end; ++c) {
            const CallEdge& e = g_.call_edges[c];
            work_.push_back(Top{g_.rule_start[size_t(e.rule)], intern_frame(e.target, t.frame)});
        }
        if (n.final) {
            if (t.frame < 0)
                step_end_.back() = 1;
            else
                work_.push_back(frames_[size_t(t.frame)]);
        }
    }
}

bool Parser::advance(uint8_t b) {
    size_t begin = step_begin_.back(), end = tops_.size();
    step_begin_.push_back(uint32_t(end));
    step_end_.push_back(0);
    for (size_t i = begin; i < end; ++i) {
        Top t = tops_[i];
        const Node& n = g_.nodes[size_t(t.node)];
        for (uint32_t k = n.byte_begin; k < n.byte_end; ++k) {
            const ByteEdge& e = g_.byte_edges[k];
            if (b >= e.lo && b <= e.hi) close(e.target, t.frame);
        }
    }
    for (uint64_t s : seen_slots_) seen_[size_t(s)] = 0;
    seen_slots_.clear();
    if (tops_.size() == end && !step_end_.back()) {
        step_begin_.pop_back();
        step_end_.pop_back();
        return false;
    }
    return true;
}

void Parser::truncate(size_t num_steps) {
    PG_CHECK(num_steps >= 1 && num_steps <= step_begin_.size());
    if (num_steps == step_begin_.size()) return;
    tops_.resize(step_begin_[num_steps]);
    step_begin_.resize(num_steps);
    step_end_.resize(num_steps);
}

}  // namespace peregrine::grammar
