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

void PrefixIndex::insert(int replica, const std::vector<uint64_t>& keys) {
    Replica& r = replicas_[replica];
    for (uint64_t k : keys) {
        const auto found = r.where.find(k);
        if (found != r.where.end()) r.lru.erase(found->second);
        r.lru.push_front(k);
        r.where[k] = r.lru.begin();
    }
    while (r.lru.size() > capacity_) {
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
                // Load share: outstanding over the mean (+1), so a replica with no prefix wins
                // the request once the holder is loaded about prefix_weight x share over the mean.
                double mean = 0;
                int healthy = 0;
                for (size_t i = 0; i < n; ++i)
                    if (eligible[i]) mean += replicas_[i].outstanding, ++healthy;
                mean /= std::max(1, healthy);
                double best_score = 0;
                int best = -1;
                size_t best_match = 0, least_match = SIZE_MAX;
                for (size_t k = 0; k < n; ++k) {
                    const int i = static_cast<int>((next_ + k) % n);  // equal scores rotate
                    if (!eligible[i]) continue;
                    const size_t m = index_.match(replicas_[i].id, keys);
                    least_match = std::min(least_match, m);
                    const double score =
                        cache_aware_.prefix_weight * static_cast<double>(m) / static_cast<double>(keys.size()) -
                        static_cast<double>(replicas_[i].outstanding) / (mean + 1);
                    if (best < 0 || score > best_score ||
                        (score == best_score && replicas_[i].outstanding < replicas_[best].outstanding)) {
                        best = i;
                        best_score = score;
                        best_match = m;
                    }
                }
                d.replica = best;
                if (best_match > least_match) {  // else every replica held as much: the load decided
                    d.reason = "prefix";
                    d.matched_chunks = best_match;
                }
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
        next_ = static_cast<size_t>(d.replica) + 1;
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

void Router::finish(int id, bool failed) {
    std::lock_guard lock(mu_);
    if (ReplicaState* r = by_id(id)) {
        r->outstanding = std::max(0, r->outstanding - 1);
        if (failed) ++r->errors;
    }
}

void Router::set_healthy(int id, bool healthy) {
    std::lock_guard lock(mu_);
    if (ReplicaState* r = by_id(id)) r->healthy = healthy;
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
    return replicas_;
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
