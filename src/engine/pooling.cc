#include "engine/pooling.h"

#include <algorithm>
#include <cmath>

namespace peregrine {

const char* pooling_type_name(PoolingType t) {
    switch (t) {
        case PoolingType::Last:
            return "last";
        case PoolingType::Mean:
            return "mean";
        case PoolingType::Cls:
            return "cls";
    }
    return "";
}

std::pair<int, int> pooled_positions(PoolingType type, int begin, int end, int num_tokens) {
    switch (type) {
        case PoolingType::Mean:
            return {begin, end};
        case PoolingType::Last:
            return end == num_tokens ? std::pair{end - 1, end} : std::pair{end, end};
        case PoolingType::Cls:
            return begin == 0 ? std::pair{0, 1} : std::pair{end, end};
    }
    return {end, end};
}

std::vector<float> finish_embedding(const std::vector<double>& sum, int num_tokens, const PoolingParams& p) {
    size_t dims = sum.size();
    if (p.dimensions > 0) dims = std::min(dims, static_cast<size_t>(p.dimensions));
    const double scale = p.type == PoolingType::Mean ? 1.0 / std::max(1, num_tokens) : 1.0;
    std::vector<double> v(sum.begin(), sum.begin() + static_cast<std::ptrdiff_t>(dims));
    for (double& x : v) x *= scale;
    if (p.normalize) {
        double ss = 0;
        for (double x : v) ss += x * x;
        // sentence-transformers' Normalize: x / max(||x||, 1e-12).
        const double norm = std::max(std::sqrt(ss), 1e-12);
        for (double& x : v) x /= norm;
    }
    return std::vector<float>(v.begin(), v.end());
}

}  // namespace peregrine
