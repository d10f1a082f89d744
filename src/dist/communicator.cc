#include "dist/communicator.h"

#include "core/error.h"

namespace peregrine {

size_t comm_element_size(DType dtype) {
    switch (dtype) {
        case DType::F32:
            return 4;
        case DType::BF16:
            return 2;
        default:
            break;
    }
    fail("collectives take f32 or bf16 buffers, not ", dtype_name(dtype));
}

}  // namespace peregrine
