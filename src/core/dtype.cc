#include "core/dtype.h"

#include "core/error.h"

namespace peregrine {

namespace {
struct Info {
    std::string_view name;
    int64_t block_size;
    int64_t block_bytes;
};

Info info(DType t) {
    switch (t) {
        case DType::F32:
            return {"f32", 1, 4};
        case DType::F16:
            return {"f16", 1, 2};
        case DType::BF16:
            return {"bf16", 1, 2};
        case DType::I32:
            return {"i32", 1, 4};
        case DType::Q8_0:
            return {"q8_0", 32, 34};
        case DType::Q4_0:
            return {"q4_0", 32, 18};
        case DType::Q4_K:
            return {"q4_k", 256, 144};
        case DType::Q6_K:
            return {"q6_k", 256, 210};
        case DType::F8_E4M3:
            return {"f8_e4m3", 1, 1};
        case DType::GQ8_32:  // 32 code bytes + f16 scale
            return {"gq8_32", 32, 34};
        case DType::GQ8_16:  // 16 code bytes + f16 scale
            return {"gq8_16", 16, 18};
        case DType::GQ4_32:  // 16 code bytes + f16 (scale, min)
            return {"gq4_32", 32, 20};
        case DType::GQ6_32:  // 16 low-nibble bytes + 8 high-bit bytes + 2 f16 scales
            return {"gq6_32", 32, 28};
    }
    PG_CHECK(false, "unknown dtype ", static_cast<int>(t));
}
}  // namespace

std::string_view dtype_name(DType t) {
    return info(t).name;
}
int64_t dtype_block_size(DType t) {
    return info(t).block_size;
}
int64_t dtype_block_bytes(DType t) {
    return info(t).block_bytes;
}
bool dtype_is_quantized(DType t) {
    return info(t).block_size > 1;
}

bool dtype_is_gpu_layout(DType t) {
    return t == DType::GQ8_32 || t == DType::GQ8_16 || t == DType::GQ4_32 || t == DType::GQ6_32;
}

size_t dtype_row_bytes(DType t, int64_t n) {
    const Info i = info(t);
    PG_CHECK(n % i.block_size == 0, n, " elements of ", i.name, " is not a whole number of blocks");
    return static_cast<size_t>(n / i.block_size * i.block_bytes);
}

}  // namespace peregrine
