// Scalar conversions between f32 and the 16-bit float formats (no ISA extensions needed).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace peregrine {

inline float bf16_to_f32(uint16_t h) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else {  // subnormal: normalise
            exp = 127 - 15 + 1;
            while ((mant & 0x400u) == 0) {
                mant <<= 1;
                --exp;
            }
            mant &= 0x3ffu;
            u = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even, with overflow to infinity and gradual underflow.
inline uint16_t f32_to_f16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
    if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
    if (abs < 0x38800000u) {                                               // below the smallest normal
        float a;
        std::memcpy(&a, &abs, 4);
        // Subnormal f16 counts steps of 2^-24; the product is exact, nearbyint rounds half to even.
        // 1024 steps carry into the smallest normal, whose bits are exactly 0x0400.
        return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));
    }
    uint32_t r = abs - ((127u - 15u) << 23);
    r += 0xfffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
}

// FP8 E4M3 (OCP): exponent bias 7, 3 mantissa bits, subnormals in steps of 2^-9, largest
// finite 448 (0x7e), NaN 0x7f / 0xff, no infinity.
inline float f8e4m3_to_f32(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 0)
        v = std::ldexp(static_cast<float>(m), -9);
    else if (e == 15 && m == 7)
        v = std::nanf("");
    else
        v = std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
    return (b & 0x80) ? -v : v;
}

// Round to nearest even, saturating to +-448 (what the GPU's cvt.rn.satfinite does); NaN -> 0x7f.
inline uint8_t f32_to_f8e4m3(float f) {
    if (std::isnan(f)) return 0x7f;
    const uint8_t sign = std::signbit(f) ? 0x80 : 0;
    const float a = std::fabs(f);
    if (a >= 448.0f) return sign | 0x7e;
    if (a < 0.015625f)  // below 2^-6: subnormal steps of 2^-9; 8 steps carry into 0x08 exactly
        return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
    int ex = 0;
    std::frexp(a, &ex);  // a = f * 2^ex, f in [0.5, 1): the unbiased exponent is ex - 1
    int e = ex - 1;
    int m = static_cast<int>(std::nearbyint((std::ldexp(a, -e) - 1.0f) * 8.0f));
    if (m == 8) m = 0, ++e;
    const int code = ((e + 7) << 3) | m;
    return sign | static_cast<uint8_t>(code > 0x7e ? 0x7e : code);
}

}  // namespace peregrine
