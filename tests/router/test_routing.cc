// The router's decisions (src/router/routing.h) without sockets: the prefix index, the
// consistent-hash ring's key movement, and each policy's picks.
#include <gtest/gtest.h>

#include <algorithm>

#include <string>
#include <vector>

#include "core/error.h"
#include "router/routing.h"

namespace peregrine::router {
namespace {

std::string text_of(char c, size_t chunks) {
    return std::string(chunks * PrefixIndex::kChunkChars, c);
}

TEST(PrefixIndex, KeysChainOverTheWholePrefix) {
    const std::string a = text_of('a', 2) + text_of('b', 1), b = text_of('c', 1) + text_of('b', 1);
    const auto ka = PrefixIndex::keys_of(a), kb = PrefixIndex::keys_of(b);
    ASSERT_EQ(ka.size(), 3u);
    EXPECT_NE(ka[2], kb[1]);  // the same chunk after different prefixes: different keys
    EXPECT_EQ(PrefixIndex::keys_of(a + "partial").size(), 3u);
    PrefixIndex idx(100);
    idx.insert(1, ka);
    EXPECT_EQ(idx.match(1, ka), 3u);
    EXPECT_EQ(idx.match(1, PrefixIndex::keys_of(text_of('a', 2) + text_of('z', 2))), 2u);
    EXPECT_EQ(idx.match(2, ka), 0u);
    idx.forget(1);
    EXPECT_EQ(idx.size(), 0u);
}

TEST(PrefixIndex, EachReplicaKeepsItsMostRecentKeys) {
    PrefixIndex idx(4);
    const auto old_keys = PrefixIndex::keys_of(text_of('o', 3));
    idx.insert(0, old_keys);
    idx.insert(0, PrefixIndex::keys_of(text_of('n', 3)));
    EXPECT_EQ(idx.size(), 4u);
    EXPECT_EQ(idx.size(0), 4u);
    EXPECT_EQ(idx.match(0, old_keys), 1u);  // its last keys went first: the root still matches
}

TEST(PrefixIndex, CapacityPerReplica) {
    PrefixIndex idx(8);
    const auto keys = PrefixIndex::keys_of(text_of('k', 6));
    idx.insert(0, keys);
    idx.insert(1, keys);
    idx.set_capacity(0, 2);  // evicts at once, leaves first
    EXPECT_EQ(idx.capacity(0), 2u);
    EXPECT_EQ(idx.capacity(1), 8u);
    EXPECT_EQ(idx.size(0), 2u);
    EXPECT_EQ(idx.match(0, keys), 2u);
    EXPECT_EQ(idx.match(1, keys), 6u);
    idx.set_capacity(0, 0);  // the default again
    idx.insert(0, keys);
    EXPECT_EQ(idx.match(0, keys), 6u);
}

TEST(CacheFacts, ParsesVllmNames) {
    const std::string text =
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        "vllm:cache_config_info{model_name=\"m\",block_size=\"16\",num_gpu_blocks=\"307\"} 1\n"
        "vllm:prefix_cache_queries_total{model_name=\"m\"} 29571\n"
        "vllm:prefix_cache_hits_total{model_name=\"m\"} 100\n"
        "peregrine:prefix_cache_queries_total{model_name=\"m\"} 5\n";
    const CacheFacts f = parse_cache_facts(text);
    EXPECT_EQ(f.block_size, 16);
    EXPECT_EQ(f.num_blocks, 307);
    EXPECT_EQ(f.queried_tokens, 29571);
    EXPECT_TRUE(f.complete());
    EXPECT_FALSE(parse_cache_facts("vllm:prefix_cache_queries_total 3\n").complete());
}

TEST(ConsistentHashRing, AddingAReplicaMovesAboutOneNth) {
    const int keys = 20000;
    for (int n : {2, 3, 5, 8}) {
        std::vector<std::string> names;
        for (int i = 0; i < n; ++i) names.push_back("http://10.0.0." + std::to_string(i) + ":8000");
        ConsistentHashRing before, after;
        before.set_replicas(names);
        names.push_back("http://10.0.0.99:8000");
        after.set_replicas(names);
        int moved = 0;
        const std::vector<bool> all_before(n, true), all_after(n + 1, true);
        for (int k = 0; k < keys; ++k) {
            const std::string key = "session-" + std::to_string(k);
            moved += before.pick(key, all_before) != after.pick(key, all_after);
        }
        const double share = static_cast<double>(moved) / keys;
        std::printf("ring: %d -> %d replicas moved %.3f of the keys (1/(N+1) = %.3f)\n", n, n + 1, share,
                    1.0 / (n + 1));
        EXPECT_LE(share, 1.5 / (n + 1)) << n;  // the bound: <= 1.5 / N of the keys
        EXPECT_GT(share, 0.5 / (n + 1)) << n;  // and the new replica does take its share
    }
}

TEST(ConsistentHashRing, SkipsIneligibleReplicasStably) {
    ConsistentHashRing ring;
    ring.set_replicas({"a", "b", "c"});
    const int home = ring.pick("user-7", {true, true, true});
    std::vector<bool> without(3, true);
    without[home] = false;
    const int other = ring.pick("user-7", without);
    EXPECT_NE(other, home);
    EXPECT_EQ(ring.pick("user-7", without), other);
    EXPECT_EQ(ring.pick("user-7", {false, false, false}), -1);
}

TEST(Router, RoundRobinTakesTurns) {
    Router r(Policy::RoundRobin, {"http://a:1", "http://b:1", "http://c:1"});
    std::vector<int> got;
    for (int i = 0; i < 6; ++i) got.push_back(r.pick("x", "").replica);
    EXPECT_EQ(got, (std::vector<int>{0, 1, 2, 0, 1, 2}));
}

TEST(Router, LeastLoadPicksFewestOutstandingAndSkipsEjected) {
    Router r(Policy::LeastLoad, {"http://a:1", "http://b:1", "http://c:1"});
    const Decision first = r.pick("", "");
    const Decision second = r.pick("", "");
    EXPECT_NE(first.replica, second.replica);
    const Decision third = r.pick("", "");
    r.finish(second, false);
    EXPECT_EQ(r.pick("", "").replica, second.replica);  // the only one with room
    r.set_healthy(first.id, false);
    for (int i = 0; i < 5; ++i) EXPECT_NE(r.pick("", "").replica, first.replica);
    (void)third;
}

TEST(Router, CacheAwareFollowsThePrefixUntilLoadIsImbalanced) {
    Router r(Policy::CacheAware, {"http://a:1", "http://b:1"});
    const std::string system = text_of('s', 20);  // a long prefix, then short user texts
    const Decision d0 = r.pick(system + "user one", "");
    EXPECT_STREQ(d0.reason, "least_load");  // nothing known yet
    EXPECT_EQ(d0.prefill_chars, static_cast<double>(system.size() + 8));
    r.first_token(d0);
    for (int i = 0; i < 10; ++i) {
        const Decision d = r.pick(system + "user " + std::to_string(i), "");
        EXPECT_EQ(d.replica, d0.replica);
        EXPECT_STREQ(d.reason, "prefix");
        EXPECT_EQ(d.prefill_chars, 6.0);  // only the text after the held chunks
        r.first_token(d);                 // each then decodes
    }
    // The prefix's replica takes requests until it has 33 more outstanding than the other
    // (SGLang's bound: difference > 32 and more than 1.5 x): then one goes by load.
    int picks = 11;
    Decision d;
    do {
        d = r.pick(system + "more", "");
        r.first_token(d);
        ++picks;
    } while (std::string(d.reason) == "prefix" && picks < 100);
    EXPECT_STREQ(d.reason, "imbalanced");
    EXPECT_NE(d.replica, d0.replica);
    EXPECT_EQ(picks, 34);  // 33 outstanding on d0's replica, then this one
    // A prompt held only for a chunk that other text followed there (2 of 10 chunks: another
    // conversation's) goes where it is cheapest: the idle replica.
    Router fresh(Policy::CacheAware, {"http://a:1", "http://b:1"});
    const Decision f0 = fresh.pick(text_of('s', 2) + text_of('t', 2), "");
    EXPECT_STREQ(fresh.pick(text_of('s', 2) + text_of('t', 2), "").reason, "prefix");
    const Decision f2 = fresh.pick(text_of('s', 2) + text_of('u', 8), "");
    EXPECT_STREQ(f2.reason, "least_load");
    EXPECT_NE(f2.replica, f0.replica);
}

// A prefix every replica might hold (a shared system prompt) decides little: new users spread by
// queued prefill; a user's own history, held by one replica, brings their next turn back to it.
TEST(Router, CacheAwareSpreadsNewUsersAndKeepsConversations) {
    Router r(Policy::CacheAware, {"http://a:1", "http://b:1"});
    const std::string system = text_of('s', 1);
    std::vector<Decision> first(6);
    for (int u = 0; u < 6; ++u)  // first turns, all in flight at once
        first[u] = r.pick(system + text_of(static_cast<char>('A' + u), 2), "");
    const auto on_first =
        std::count_if(first.begin(), first.end(), [&](const Decision& d) { return d.replica == first[0].replica; });
    EXPECT_EQ(on_first, 3);  // spread, not all behind the system prompt
    for (int u = 0; u < 6; ++u) r.finish(first[u], false);
    EXPECT_EQ(r.snapshot()[0].queued_chars, 0.0);
    EXPECT_EQ(r.snapshot()[1].prefilling, 0);
    for (int u = 0; u < 6; ++u) {  // second turns, in flight together: each history is on one replica
        const Decision d = r.pick(system + text_of(static_cast<char>('A' + u), 2) + text_of('x', 4), "");
        EXPECT_STREQ(d.reason, "prefix") << u;
        EXPECT_EQ(d.replica, first[u].replica) << u;
    }
    // With no weight on the prefix, the cost alone decides: the held replica's queued prefill
    // (the first turn, still waiting) outweighs what it holds.
    Router loads(Policy::CacheAware, {"http://a:1", "http://b:1"}, CacheAwareOptions{0, 32, 1.5});
    const int held = loads.pick(system + text_of('A', 2), "").replica;
    const Decision again = loads.pick(system + text_of('A', 2) + text_of('x', 4), "");
    EXPECT_NE(again.replica, held);
    EXPECT_STREQ(again.reason, "least_load");
}

// Queued prefill, not the request count, is the load: a burst of prompts arriving together
// spreads although one replica has just finished everything it had, and a conversation leaves
// its replica only when the prefill queued there outweighs prefix_weight x its history.
TEST(Router, CacheAwareWeighsQueuedPrefillAgainstTheHistory) {
    Router r(Policy::CacheAware, {"http://a:1", "http://b:1"});
    const std::string system = text_of('s', 1);
    // Replica 1 decodes 4 requests; replica 0 is idle.
    std::vector<Decision> busy;
    for (int u = 0; u < 8; ++u) {
        busy.push_back(r.pick(system + text_of(static_cast<char>('a' + u), 1), ""));
        r.first_token(busy.back());
    }
    for (const Decision& d : busy)
        if (d.replica == busy[0].replica) r.finish(d, false);
    const int idle = busy[0].replica, decoding = 1 - idle;
    EXPECT_EQ(r.snapshot()[decoding].outstanding, 4);
    // Four new conversations at once: a request count sends them all to the idle replica; the
    // queued prefill of the first ones sends the later ones to the decoding replica.
    std::vector<int> where;
    for (int u = 0; u < 4; ++u) where.push_back(r.pick(system + text_of(static_cast<char>('K' + u), 4), "").replica);
    EXPECT_EQ(where[0], idle);
    EXPECT_EQ(std::count(where.begin(), where.end(), decoding), 2);
    EXPECT_GT(r.snapshot()[idle].queued_chars, 0.0);

    // A conversation held on one replica stays there while the prefill queued ahead of it costs
    // less than what it holds saves at prefix_weight 2, and leaves beyond.
    Router c(Policy::CacheAware, {"http://a:1", "http://b:1"});
    const Decision home = c.pick(text_of('h', 8), "");
    c.finish(home, false);
    const int away = 1 - home.replica;
    c.pick(text_of('q', 15), "", away);  // 960 characters queued at home (the other excluded)
    // Home: 960 queued + 64 new - (2 - 1) x 512 held = 512; away: all 576. Stays.
    const Decision turn1 = c.pick(text_of('h', 8) + text_of('y', 1), "");
    EXPECT_EQ(turn1.replica, home.replica);
    EXPECT_STREQ(turn1.reason, "prefix");
    c.pick(text_of('r', 3), "", away);  // 192 more
    // Home: 960 + 64 (turn 1, waiting too) + 192 queued + 64 new - 576 held = 704; away: 640.
    const Decision turn2 = c.pick(text_of('h', 8) + text_of('y', 1) + text_of('w', 1), "");
    EXPECT_EQ(turn2.replica, away);
    EXPECT_STREQ(turn2.reason, "least_load");
    EXPECT_EQ(turn2.prefill_chars, 640.0);
    EXPECT_EQ(c.snapshot()[home.replica].queued_chars, 960.0 + 64 + 192);
}

// A conversation no replica holds more of than the others goes, among the replicas about as
// cheap, where the index holds the fewest keys, even against the request count: the replicas'
// cache footprints stay even.
TEST(Router, CacheAwarePlacesNewConversationsOnTheSmallestCache) {
    Router r(Policy::CacheAware, {"http://a:1", "http://b:1"});
    const std::string system = text_of('s', 1);
    const Decision big = r.pick(system + text_of('A', 8), "");  // 9 keys
    r.finish(big, false);
    const Decision small = r.pick(system + text_of('B', 2), "");  // 3 keys, left decoding
    EXPECT_NE(small.replica, big.replica);
    r.first_token(small);
    // The small one decodes 1 request, the big one none: the count would pick the big one.
    const Decision next = r.pick(system + text_of('C', 2), "");
    EXPECT_EQ(next.replica, small.replica);
    EXPECT_STREQ(next.reason, "smallest_cache");
    const auto s = r.snapshot();
    EXPECT_EQ(s[big.replica].index_keys, 9u);
    EXPECT_EQ(s[small.replica].index_keys, 5u);  // the system prompt's key is shared
    // A turn of a held conversation still follows its prefix.
    EXPECT_EQ(r.pick(system + text_of('A', 8) + text_of('x', 2), "").replica, big.replica);
}

// The index sizes each replica's keys from its /metrics: pool tokens x prompt characters per
// token / 64, once enough tokens were counted; a counter going back empties the index.
TEST(Router, CacheAwareIndexMirrorsTheReplicaPool) {
    Router r(Policy::CacheAware, {"http://a:1"});
    const int id = r.snapshot()[0].id;
    CacheFacts f;
    f.block_size = 16;
    f.num_blocks = 8;  // 128 tokens
    f.queried_tokens = 500;
    r.observe_cache(id, f);                                                           // the baseline
    for (int i = 0; i < 8; ++i) r.pick(text_of(static_cast<char>('a' + i), 32), "");  // 8 x 2048 chars
    EXPECT_EQ(r.snapshot()[0].index_keys, 256u);
    f.queried_tokens = 500 + 512;  // too few tokens for a ratio yet
    r.observe_cache(id, f);
    EXPECT_EQ(r.snapshot()[0].index_capacity, 65536u);
    f.queried_tokens = 500 + 4096;  // 4 characters a token: 128 x 4 / 64 = 8 keys
    r.observe_cache(id, f);
    EXPECT_DOUBLE_EQ(r.snapshot()[0].chars_per_token, 4.0);
    EXPECT_EQ(r.snapshot()[0].index_capacity, 8u);
    EXPECT_EQ(r.snapshot()[0].index_keys, 8u);
    f.queried_tokens = 10;  // a restarted replica
    r.observe_cache(id, f);
    EXPECT_EQ(r.snapshot()[0].index_keys, 0u);
    EXPECT_EQ(r.snapshot()[0].index_capacity, 65536u);
}

TEST(Router, SessionKeysStickToOneReplica) {
    Router r(Policy::CacheAware, {"http://a:1", "http://b:1", "http://c:1"});
    const int home = r.pick("anything", "conversation-42").replica;
    for (int i = 0; i < 20; ++i) {
        const Decision d = r.pick("other text " + std::to_string(i), "conversation-42");
        EXPECT_EQ(d.replica, home);
        EXPECT_STREQ(d.reason, "session");
    }
}

TEST(Router, DnsChangesKeepStateOfKnownReplicas) {
    Router r(Policy::LeastLoad, {"http://a:1", "http://b:1"});
    const Decision d = r.pick("", "");
    r.set_urls({"http://b:1", "http://c:1", "http://a:1"});
    const auto snap = r.snapshot();
    ASSERT_EQ(snap.size(), 3u);
    int outstanding = 0;
    for (const auto& s : snap) outstanding += s.outstanding;
    EXPECT_EQ(outstanding, 1);
    r.finish(d, false);  // by its id, though its index moved
    for (const auto& s : r.snapshot()) EXPECT_EQ(s.outstanding, 0);
    EXPECT_THROW(policy_from_name("random"), Error);
}

}  // namespace
}  // namespace peregrine::router
