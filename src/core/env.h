// Measurement knobs read from the environment (PEREGRINE_*): callers keep the answer in a
// function-local static, so a knob is read once per process.
#pragma once

#include <cstdlib>
#include <string_view>

namespace peregrine {

// Whether environment variable `name` is set to exactly `value`.
inline bool env_equals(const char* name, std::string_view value) {
    const char* v = std::getenv(name);
    return v != nullptr && value == v;
}

// Environment variable `name` as an int, or `fallback` where it is unset.
inline int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v != nullptr ? std::atoi(v) : fallback;
}

}  // namespace peregrine
