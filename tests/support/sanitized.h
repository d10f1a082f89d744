// Whether this test binary runs under AddressSanitizer (scripts/ci-sanitize.sh). The heaviest
// randomized and exhaustive tests take fewer rounds or the small vocabulary there: their code
// paths are the same at any count, sanitized code runs them 10-40x slower, and the Release run
// (`make test`) keeps the full counts.
#pragma once

namespace peregrine {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kUnderSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kUnderSanitizer = true;
#else
inline constexpr bool kUnderSanitizer = false;
#endif
#else
inline constexpr bool kUnderSanitizer = false;
#endif

// `full` in a plain build, `sanitized` under ASan.
inline constexpr int full_or_sanitized(int full, int sanitized) {
    return kUnderSanitizer ? sanitized : full;
}

}  // namespace peregrine
