#include "core/tensor.h"

namespace peregrine {

std::string Tensor::shape_str() const {
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) {
        if (i) s += ", ";
        s += std::to_string(shape[i]);
    }
    return s + "]";
}

}  // namespace peregrine
