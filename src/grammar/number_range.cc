#include "grammar/number_range.h"

#include <algorithm>
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

constexpr int kMaxOpenDigits = 16;

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
    // Every number with more digits than lo, up to 16 digits (or lo's + 1): a longer one could
    // overflow a double where validators read it (JSON.parse: Infinity, not an integer).
    if (!hi)
        alts.push_back(g.seq({digit_range(g, '1', '9'),
                              g.repeat(digit_range(g, '0', '9'), int(dlo), std::max(int(dlo), kMaxOpenDigits - 1))}));
    return g.alt(std::move(alts));
}

constexpr double kLimit = 1e18;

// Fraction digits that keep a decimal next to the integer `bound` distinct from it as a double:
// within 10^-p of a d-digit integer, p = 15 - d leaves a gap over 4 times the double's spacing
// there (2^-52 relative). 0 (no fraction) from 10^15 on.
int fraction_digits(double bound) {
    const double a = std::fabs(bound);
    int d = 1;
    for (double v = 10; v <= a && d < 16; v *= 10) ++d;
    return std::max(0, 15 - d);
}

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
    // Next to an open integer bound a long fraction would round onto it when read as a double
    // ("4.99999999999999999" is 5.0, outside exclusiveMaximum 5): that integer part gets at
    // most fraction_digits() digits.
    if (kmax && hi_open && std::floor(*hi) == *hi && *kmax >= k0) {
        const int p = fraction_digits(*hi);
        if (p > 0)
            alts.push_back(
                g.seq({g.literal(std::to_string(*kmax)), g.literal("."), g.repeat(g.byte_range('0', '9'), 1, p)}));
        --*kmax;
    }
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
    if (mmax && lo_open && std::floor(*lo) == *lo && *mmax >= m0) {  // as above, for -(m+1) = lo
        const int p = fraction_digits(*lo);
        if (p > 0)
            alts.push_back(g.seq(
                {g.literal("-" + std::to_string(*mmax)), g.literal("."), g.repeat(g.byte_range('0', '9'), 1, p)}));
        --*mmax;
    }
    if (!mmax || *mmax >= m0) {
        std::optional<uint64_t> mhi;
        if (mmax) mhi = uint64_t(*mmax);
        alts.push_back(g.seq({g.literal("-"), unsigned_range(g, uint64_t(m0), mhi), frac}));
    }
    // An open integer bound: its own integer part with a non-zero fraction, e.g. 0.25 in (0, 1).
    // At most fraction_digits() digits, the last one non-zero, so that the value read as a
    // double stays off the bound (and off the next integer, which may be the other bound).
    auto nonzero = [&](double bound) {
        const int p = fraction_digits(bound);
        return g.seq({g.literal("."), g.repeat(g.byte_range('0', '9'), 0, p - 1), g.byte_range('1', '9')});
    };
    if (lo && lo_open && std::floor(*lo) == *lo && *lo >= 0 && *lo < kLimit && (!hi || *lo + 1 <= *hi) &&
        fraction_digits(*lo) > 0)
        alts.push_back(g.seq({g.literal(std::to_string(int64_t(*lo))), nonzero(*lo)}));
    if (hi && hi_open && std::floor(*hi) == *hi && *hi <= 0 && *hi > -kLimit && (!lo || *hi - 1 >= *lo) &&
        fraction_digits(*hi) > 0)
        alts.push_back(g.seq({g.literal("-" + std::to_string(int64_t(-*hi))), nonzero(*hi)}));
    if (alts.empty())
        fail("number range holds no value this grammar can produce (bounds ", lo.value_or(NAN), ", ", hi.value_or(NAN),
             ")");
    return g.alt(std::move(alts));
}

}  // namespace peregrine::grammar
