#include "grammar/number_range.h"

#include <cmath>
#include <string>

#include "core/error.h"

namespace peregrine::grammar {

namespace {

int digit_range(Grammar& g, char lo, char hi) {
    return g.byte_range(uint8_t(lo), uint8_t(hi));
}

// Digit strings of one length n between lo and hi (equal length, lo <= hi).
int same_length(Grammar& g, const std::string& lo, const std::string& hi) {
    if (lo == hi) return g.literal(lo);
    size_t n = lo.size();
    if (n == 1) return digit_range(g, lo[0], hi[0]);
    std::string lo_rest = lo.substr(1), hi_rest = hi.substr(1);
    if (lo[0] == hi[0]) return g.seq({g.literal(lo.substr(0, 1)), same_length(g, lo_rest, hi_rest)});
    std::vector<int> alts;
    std::string nines(n - 1, '9'), zeros(n - 1, '0');
    char mid_lo = lo[0], mid_hi = hi[0];
    if (lo_rest != zeros) alts.push_back(g.seq({g.literal(lo.substr(0, 1)), same_length(g, lo_rest, nines)})), ++mid_lo;
    bool hi_full = hi_rest == nines;
    if (!hi_full) --mid_hi;
    if (mid_lo <= mid_hi)
        alts.push_back(
            g.seq({digit_range(g, mid_lo, mid_hi), g.repeat(digit_range(g, '0', '9'), int(n - 1), int(n - 1))}));
    if (!hi_full) alts.push_back(g.seq({g.literal(hi.substr(0, 1)), same_length(g, zeros, hi_rest)}));
    return g.alt(std::move(alts));
}

uint64_t pow10(size_t n) {
    uint64_t v = 1;
    while (n--) v *= 10;
    return v;
}

// Non-negative integers in [lo, hi] (hi empty: unbounded), no leading zeros.
int unsigned_range(Grammar& g, uint64_t lo, std::optional<uint64_t> hi) {
    std::vector<int> alts;
    size_t dlo = std::to_string(lo).size();
    size_t dhi = hi ? std::to_string(*hi).size() : dlo;
    for (size_t d = dlo; d <= dhi; ++d) {
        uint64_t a = std::max<uint64_t>(lo, d == 1 ? 0 : pow10(d - 1));
        uint64_t b = pow10(d) - 1;
        if (hi) b = std::min(b, *hi);
        if (a <= b) alts.push_back(same_length(g, std::to_string(a), std::to_string(b)));
    }
    if (!hi)  // every number with more digits than lo
        alts.push_back(g.seq({digit_range(g, '1', '9'), g.repeat(digit_range(g, '0', '9'), int(dlo), kUnbounded)}));
    return g.alt(std::move(alts));
}

constexpr double kLimit = 1e18;

std::optional<int64_t> clamp_bound(std::optional<double> v) {
    if (!v || std::fabs(*v) > kLimit) return std::nullopt;
    return int64_t(*v);
}

}  // namespace

int integer_range(Grammar& g, std::optional<int64_t> lo, std::optional<int64_t> hi) {
    if (lo && hi && *lo > *hi) fail("integer range [", *lo, ", ", *hi, "] is empty");
    std::vector<int> alts;
    // Negative part: magnitudes [max(1, -hi), -lo].
    if (!lo || *lo < 0) {
        uint64_t mlo = hi && *hi < 0 ? uint64_t(-*hi) : 1;
        std::optional<uint64_t> mhi;
        if (lo) mhi = uint64_t(-*lo);
        alts.push_back(g.seq({g.literal("-"), unsigned_range(g, mlo, mhi)}));
    }
    if (!hi || *hi >= 0) {
        uint64_t a = lo && *lo > 0 ? uint64_t(*lo) : 0;
        std::optional<uint64_t> b;
        if (hi) b = uint64_t(*hi);
        alts.push_back(unsigned_range(g, a, b));
    }
    return g.alt(std::move(alts));
}

int number_range(Grammar& g, std::optional<double> lo, bool lo_open, std::optional<double> hi, bool hi_open) {
    if (lo && hi && (*lo > *hi || (*lo == *hi && (lo_open || hi_open))))
        fail("number range (", *lo, ", ", *hi, ") is empty");
    std::vector<int> alts;
    // Integers a <= x <= b.
    std::optional<double> a_d, b_d;
    if (lo) a_d = lo_open ? std::floor(*lo) + 1 : std::ceil(*lo);
    if (hi) b_d = hi_open ? std::ceil(*hi) - 1 : std::floor(*hi);
    std::optional<int64_t> a = clamp_bound(a_d), b = clamp_bound(b_d);
    if (!a || !b || *a <= *b) alts.push_back(integer_range(g, a, b));
    int digits = g.plus(g.byte_range('0', '9'));
    int frac = g.seq({g.literal("."), digits});
    // k.fff, in [k, k+1): inside when k >= lo (k > lo if open) and k + 1 <= hi.
    std::optional<int64_t> kmin =
        clamp_bound(lo ? std::optional<double>(lo_open ? std::floor(*lo) + 1 : std::ceil(*lo)) : std::nullopt);
    std::optional<int64_t> kmax = clamp_bound(hi ? std::optional<double>(std::floor(*hi) - 1) : std::nullopt);
    int64_t k0 = kmin ? std::max<int64_t>(*kmin, 0) : 0;
    if (!kmax || *kmax >= k0) {
        std::optional<uint64_t> khi;
        if (kmax) khi = uint64_t(*kmax);
        alts.push_back(g.seq({unsigned_range(g, uint64_t(k0), khi), frac}));
    }
    // -m.fff, in (-(m+1), -m]: inside when -(m+1) >= lo and -m <= hi (-m < hi if open).
    std::optional<int64_t> mmin =
        clamp_bound(hi ? std::optional<double>(hi_open ? std::floor(-*hi) + 1 : std::ceil(-*hi)) : std::nullopt);
    std::optional<int64_t> mmax = clamp_bound(lo ? std::optional<double>(-std::ceil(*lo) - 1) : std::nullopt);
    int64_t m0 = mmin ? std::max<int64_t>(*mmin, 0) : 0;
    if (!mmax || *mmax >= m0) {
        std::optional<uint64_t> mhi;
        if (mmax) mhi = uint64_t(*mmax);
        alts.push_back(g.seq({g.literal("-"), unsigned_range(g, uint64_t(m0), mhi), frac}));
    }
    // An open integer bound: its own integer part with a non-zero fraction, e.g. 0.25 in (0, 1).
    int nonzero =
        g.seq({g.literal("."), g.star(g.byte_range('0', '9')), g.byte_range('1', '9'), g.star(g.byte_range('0', '9'))});
    if (lo && lo_open && std::floor(*lo) == *lo && *lo >= 0 && *lo < kLimit && (!hi || *lo + 1 <= *hi))
        alts.push_back(g.seq({g.literal(std::to_string(int64_t(*lo))), nonzero}));
    if (hi && hi_open && std::floor(*hi) == *hi && *hi <= 0 && *hi > -kLimit && (!lo || *hi - 1 >= *lo))
        alts.push_back(g.seq({g.literal("-" + std::to_string(int64_t(-*hi))), nonzero}));
    if (alts.empty())
        fail("number range holds no value this grammar can produce (bounds ", lo.value_or(NAN), ", ", hi.value_or(NAN),
             ")");
    return g.alt(std::move(alts));
}

}  // namespace peregrine::grammar
