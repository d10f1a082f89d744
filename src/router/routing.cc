#include "router/routing.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdint>

#include "core/error.h"

namespace peregrine::router {

Policy policy_from_name(const std::string& name) {
    if (name == "round-robin") return Policy::RoundRobin;
    if (name == "least-load") return Policy::LeastLoad;
    if (name == "cache-aware") return Policy::CacheAware;
    fail("--policy must be cache-aware, least-load or round-robin, got '", name, "'");
}

const char* policy_name(Policy p) {
    switch (p) {
        case Policy::RoundRobin:
            return "round-robin";
        case Policy::LeastLoad:
            return "least-load";
        case Policy::CacheAware:
            return "cache-aware";
    }
    return "?";
}

// ---- PrefixIndex ---------------------------------------------------------------------------

std::vector<uint64_t> PrefixIndex::keys_of(std::string_view text) {
    std::vector<uint64_t> keys;
    uint64_t h = 0;
    for (size_t at = 0; at + kChunkChars <= text.size(); at += kChunkChars) {
        h = XXH3_64bits_withSeed(text.data() + at, kChunkChars, h);
        keys.push_back(h);
    }
    return keys;
}

size_t PrefixIndex::match(int replica, const std::vector<uint64_t>& keys) const {
    const auto it = replicas_.find(replica);
    if (it == replicas_.end()) return 0;
    size_t n = 0;
    while (n < keys.size() && it->second.where.count(keys[n])) ++n;
    return n;
}

bool PrefixIndex::diverges(int replica, const std::vector<uint64_t>& keys, size_t matched) const {
    if (matched == 0 || matched >= keys.size()) return false;
    const auto it = replicas_.find(replica);
    if (it == replicas_.end()) return false;
    const auto e = it->second.where.find(keys[matched - 1]);
    return e != it->second.where.end() && e->second.next != 0 && e->second.next != keys[matched];
}

void PrefixIndex::insert(int replica, const std::vector<uint64_t>& keys) {
    Replica& r = replicas_[replica];
    // Last chunk first, so the prompt's first chunk ends most recent: under pressure a prefix
    // loses its leaves before its root (a key is only matched after every key before it).
    for (size_t i = keys.size(); i-- > 0;) {
        const auto found = r.where.find(keys[i]);
        if (found != r.where.end()) r.lru.erase(found->second.at);
        r.lru.push_front(keys[i]);
        Entry& e = found != r.where.end() ? found->second : r.where[keys[i]];
        e.at = r.lru.begin();
        if (i + 1 < keys.size()) e.next = keys[i + 1];
    }
    evict(r, r.capacity ? r.capacity : default_capacity_);
}

void PrefixIndex::evict(Replica& r, size_t capacity) {
    while (r.lru.size() > capacity) {
        r.where.erase(r.lru.back());
        r.lru.pop_back();
    }
}

void PrefixIndex::forget(int replica) {
    replicas_.erase(replica);
}

size_t PrefixIndex::size() const {
    size_t n = 0;
    for (const auto& [id, r] : replicas_) n += r.lru.size();
    return n;
}

size_t PrefixIndex::size(int replica) const {
    const auto it = replicas_.find(replica);
    return it == replicas_.end() ? 0 : it->second.lru.size();
}

void PrefixIndex::set_capacity(int replica, size_t keys) {
    Replica& r = replicas_[replica];
    r.capacity = keys;
    evict(r, keys ? keys : default_capacity_);
}

size_t PrefixIndex::capacity(int replica) const {
    const auto it = replicas_.find(replica);
    return it == replicas_.end() || it->second.capacity == 0 ? default_capacity_ : it->second.capacity;
}

// ---- CacheFacts ----------------------------------------------------------------------------

namespace {

// The number after `name="` in a label set, or -1.
double label_value(std::string_view labels, std::string_view name) {
    size_t at = 0;
    while ((at = labels.find(name, at)) != std::string_view::npos) {
        const bool starts = at == 0 || labels[at - 1] == '{' || labels[at - 1] == ',';
        at += name.size();
        if (starts && labels.substr(at, 2) == "=\"") {
            try {
                return std::stod(std::string(labels.substr(at + 2, labels.find('"', at + 2) - at - 2)));
            } catch (...) {
                return -1;
            }
        }
    }
    return -1;
}

}  // namespace

CacheFacts parse_cache_facts(std::string_view text) {
    CacheFacts f;
    size_t at = 0;
    while (at < text.size()) {
        size_t end = text.find('\n', at);
        if (end == std::string_view::npos) end = text.size();
        const std::string_view line = text.substr(at, end - at);
        at = end + 1;
        if (line.empty() || line[0] == '#') continue;
        const size_t name_end = line.find_first_of("{ ");
        if (name_end == std::string_view::npos) continue;
        const std::string_view name = line.substr(0, name_end);
        if (name == "vllm:cache_config_info") {
            f.block_size = label_value(line, "block_size");
            f.num_blocks = label_value(line, "num_gpu_blocks");
        } else if (name == "vllm:prefix_cache_queries_total") {
            const size_t space = line.rfind(' ');
            try {
                f.queried_tokens = std::max(0.0, f.queried_tokens) + std::stod(std::string(line.substr(space + 1)));
            } catch (...) {
            }
        }
    }
    return f;
}

// ---- ConsistentHashRing --------------------------------------------------------------------

void ConsistentHashRing::set_replicas(const std::vector<std::string>& names) {
    ring_.clear();
    for (size_t i = 0; i < names.size(); ++i)
        for (int v = 0; v < kVirtualNodes; ++v) {
            const std::string point = names[i] + "#" + std::to_string(v);
            ring_.emplace(XXH3_64bits(point.data(), point.size()), static_cast<int>(i));
        }
}

int ConsistentHashRing::pick(std::string_view key, const std::vector<bool>& eligible) const {
    if (ring_.empty()) return -1;
    auto it = ring_.lower_bound(XXH3_64bits(key.data(), key.size()));
    for (size_t step = 0; step < ring_.size(); ++step, ++it) {
        if (it == ring_.end()) it = ring_.begin();
        if (it->second < static_cast<int>(eligible.size()) && eligible[it->second]) return it->second;
    }
    return -1;
}

// ---- Router --------------------------------------------------------------------------------

Router::Router(Policy policy, std::vector<std::string> urls, CacheAwareOptions cache_aware)
    : policy_(policy), cache_aware_(cache_aware) {
    set_urls(urls);
}

int Router::least_loaded(int exclude) const {
    int best = -1;
    const size_t n = replicas_.size();
    for (size_t k = 0; k < n; ++k) {
        const int i = static_cast<int>((next_ + k) % n);
        if (!replicas_[i].healthy || i == exclude) continue;
        if (best < 0 || replicas_[i].outstanding < replicas_[best].outstanding) best = i;
    }
    return best;
}

void Router::pick_by_cost(std::string_view text, const std::vector<uint64_t>& keys, const std::vector<bool>& eligible,
                          Decision& d) const {
    const size_t n = replicas_.size();
    // held: leading keys a replica holds (what it would not prefill). own: the same, except that
    // a match stopping where the replica's own latest prompt through it went on differently is a
    // prefix other conversations share (a system prompt it saw with other users): that counts
    // as the least any replica holds, not as this conversation's history, even before every
    // replica has seen it.
    std::vector<size_t> held(n, 0), own(n, 0);
    size_t least_match = SIZE_MAX, most_match = 0;
    for (size_t i = 0; i < n; ++i) {
        if (!eligible[i]) continue;
        held[i] = own[i] = index_.match(replicas_[i].id, keys);
        least_match = std::min(least_match, held[i]);
    }
    for (size_t i = 0; i < n; ++i) {
        if (!eligible[i]) continue;
        if (index_.diverges(replicas_[i].id, keys, own[i])) own[i] = least_match;
        most_match = std::max(most_match, own[i]);
    }
    const double chars = static_cast<double>(text.size()), chunk = static_cast<double>(PrefixIndex::kChunkChars);
    auto cost = [&](size_t i) {
        const ReplicaState& r = replicas_[i];
        return r.queued_chars + kDecodeRowChars * (r.outstanding - r.prefilling) + (chars - chunk * held[i]) -
               (cache_aware_.prefix_weight - 1) * chunk * own[i];
    };
    int best = -1;
    double best_cost = 0;
    for (size_t k = 0; k < n; ++k) {
        const int i = static_cast<int>((next_ + k) % n);  // equal costs rotate
        if (!eligible[i]) continue;
        const double c = cost(i);
        if (best < 0 || c < best_cost || (c == best_cost && replicas_[i].outstanding < replicas_[best].outstanding)) {
            best = i;
            best_cost = c;
        }
    }
    d.replica = best;
    d.reason = "least_load";
    if (own[best] > least_match) {
        d.reason = "prefix";
        d.matched_chunks = own[best];
    } else if (most_match == least_match) {
        // No replica holds more of it than the others (a new conversation, or one every replica
        // evicted): of the replicas within a chunk of the cheapest, the smallest cache footprint
        // takes it, so conversations spread by what the replicas hold, not only by load.
        int smallest = best;
        for (size_t i = 0; i < n; ++i) {
            if (!eligible[i] || cost(i) > best_cost + chunk) continue;
            const size_t keys_i = index_.size(replicas_[i].id), keys_s = index_.size(replicas_[smallest].id);
            if (keys_i < keys_s || (keys_i == keys_s && replicas_[i].outstanding < replicas_[smallest].outstanding))
                smallest = static_cast<int>(i);
        }
        if (index_.size(replicas_[smallest].id) < index_.size(replicas_[best].id)) {
            d.replica = smallest;
            d.reason = "smallest_cache";
        }
    }
}

Decision Router::pick(std::string_view text, std::string_view session_key, int exclude) {
    std::lock_guard lock(mu_);
    Decision d;
    const size_t n = replicas_.size();
    std::vector<bool> eligible(n);
    for (size_t i = 0; i < n; ++i) eligible[i] = replicas_[i].healthy && static_cast<int>(i) != exclude;
    const std::vector<uint64_t> keys =
        policy_ == Policy::CacheAware ? PrefixIndex::keys_of(text) : std::vector<uint64_t>{};

    if (!session_key.empty()) {
        d.replica = ring_.pick(session_key, eligible);
        d.reason = "session";
    } else if (policy_ == Policy::RoundRobin) {
        for (size_t k = 0; k < n && d.replica < 0; ++k) {
            const int i = static_cast<int>((next_ + k) % n);
            if (eligible[i]) d.replica = i;
        }
        d.reason = "round_robin";
    } else {
        const int light = least_loaded(exclude);
        d.replica = light;
        d.reason = "least_load";
        if (policy_ == Policy::CacheAware && light >= 0) {
            int heavy = light;
            for (size_t i = 0; i < n; ++i)
                if (eligible[i] && replicas_[i].outstanding > replicas_[heavy].outstanding) heavy = static_cast<int>(i);
            const int lo = replicas_[light].outstanding, hi = replicas_[heavy].outstanding;
            if (hi - lo > cache_aware_.balance_abs_threshold && hi > cache_aware_.balance_rel_threshold * lo) {
                d.reason = "imbalanced";
            } else if (!keys.empty()) {
                pick_by_cost(text, keys, eligible, d);
            }
        }
    }
    if (d.replica < 0) {
        d.reason = "no_replica";
    } else {
        ReplicaState& r = replicas_[d.replica];
        d.id = r.id;
        d.url = r.url;
        ++r.outstanding;
        ++r.requests;
        r.prompt_chars += text.size();
        next_ = static_cast<size_t>(d.replica) + 1;
        if (!text.empty()) {
            d.prefill_chars = static_cast<double>(text.size() - PrefixIndex::kChunkChars * index_.match(r.id, keys));
            d.ticket = next_ticket_++;
            queued_[d.ticket] = {r.id, d.prefill_chars};
            ++r.prefilling;
            r.queued_chars += d.prefill_chars;
        }
        if (!keys.empty()) index_.insert(r.id, keys);
    }
    ++decisions_[d.reason];
    return d;
}

ReplicaState* Router::by_id(int id) {
    for (ReplicaState& r : replicas_)
        if (r.id == id) return &r;
    return nullptr;  // left with a DNS change
}

void Router::settle(uint64_t ticket) {
    const auto it = queued_.find(ticket);
    if (it == queued_.end()) return;
    if (ReplicaState* r = by_id(it->second.id)) {
        r->prefilling = std::max(0, r->prefilling - 1);
        r->queued_chars = r->prefilling ? std::max(0.0, r->queued_chars - it->second.chars) : 0;
    }
    queued_.erase(it);
}

void Router::first_token(const Decision& d) {
    std::lock_guard lock(mu_);
    settle(d.ticket);
}

void Router::finish(const Decision& d, bool failed) {
    std::lock_guard lock(mu_);
    settle(d.ticket);
    if (ReplicaState* r = by_id(d.id)) {
        r->outstanding = std::max(0, r->outstanding - 1);
        if (failed) ++r->errors;
    }
}

void Router::set_healthy(int id, bool healthy) {
    std::lock_guard lock(mu_);
    if (ReplicaState* r = by_id(id)) r->healthy = healthy;
}

void Router::observe_cache(int id, const CacheFacts& facts) {
    std::lock_guard lock(mu_);
    ReplicaState* r = by_id(id);
    if (!r || !facts.complete()) return;
    r->pool_tokens = facts.block_size * facts.num_blocks;
    const double chars = static_cast<double>(r->prompt_chars);
    if (r->queried_baseline >= 0 && facts.queried_tokens < r->queried_baseline) {
        index_.forget(id);  // its counters went back: a new process, an empty cache
        r->queried_baseline = -1;
        r->chars_per_token = 0;
    }
    if (r->queried_baseline < 0) {
        r->queried_baseline = facts.queried_tokens;
        r->chars_baseline = chars;
        return;
    }
    const double tokens = facts.queried_tokens - r->queried_baseline;
    if (tokens < kMinTokensForRatio || chars <= r->chars_baseline) return;
    r->chars_per_token = (chars - r->chars_baseline) / tokens;
    const double keys = r->pool_tokens * r->chars_per_token / static_cast<double>(PrefixIndex::kChunkChars);
    index_.set_capacity(id, static_cast<size_t>(std::max(1.0, keys)));
}

void Router::set_urls(const std::vector<std::string>& urls) {
    std::lock_guard lock(mu_);
    std::vector<ReplicaState> next;
    for (const std::string& u : urls) {
        const auto same =
            std::find_if(replicas_.begin(), replicas_.end(), [&](const ReplicaState& r) { return r.url == u; });
        if (same != replicas_.end()) {
            next.push_back(*same);
        } else {
            ReplicaState r;
            r.url = u;
            r.id = next_id_++;
            next.push_back(r);
        }
    }
    for (const ReplicaState& old : replicas_)
        if (std::none_of(next.begin(), next.end(), [&](const ReplicaState& r) { return r.id == old.id; }))
            index_.forget(old.id);
    replicas_ = std::move(next);
    ring_.set_replicas(urls);
    next_ = 0;
}

std::vector<ReplicaState> Router::snapshot() const {
    std::lock_guard lock(mu_);
    std::vector<ReplicaState> out = replicas_;
    for (ReplicaState& r : out) {
        r.index_keys = index_.size(r.id);
        r.index_capacity = index_.capacity(r.id);
    }
    return out;
}

size_t Router::prefix_index_size() const {
    std::lock_guard lock(mu_);
    return index_.size();
}

std::map<std::string, uint64_t> Router::decisions() const {
    std::lock_guard lock(mu_);
    return decisions_;
}

}  // namespace peregrine::router
