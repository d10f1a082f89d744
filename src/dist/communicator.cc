#include "dist/communicator.h"

#include "core/error.h"

namespace peregrine {

size_t comm_element_size(DType dtype) {
    if (dtype != DType::F32 && dtype != DType::BF16)
        fail("collectives take f32 or bf16 buffers, not ", dtype_name(dtype));
    return static_cast<size_t>(dtype_block_bytes(dtype));
}

}  // namespace peregrine
