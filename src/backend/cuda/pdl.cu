#include <cstdlib>
#include <cstring>

#include "backend/cuda/pdl.cuh"

namespace peregrine::cuda {

bool pdl_enabled() {
    static const bool on = [] {
        const char* v = std::getenv("PEREGRINE_PDL");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    return on;
}

}  // namespace peregrine::cuda
