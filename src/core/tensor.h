// A non-owning view of a dense, row-major tensor. Quantized tensors hold whole blocks along
// the last dimension, so a row of `shape.back()` elements is `dtype_row_bytes(dtype, cols)`.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace peregrine {

enum class Device : uint8_t { CPU, CUDA };

struct Tensor {
    static constexpr int kMaxDims = 4;

    void* data = nullptr;
    DType dtype = DType::F32;
    Device device = Device::CPU;
    int ndim = 0;
    std::array<int64_t, kMaxDims> shape{};
    // F8_E4M3 weights: [rows()] f32 factors on the tensor's device, element (r, c) of the matrix
    // being value(r, c) * scale[r]. Null for every other tensor.
    const float* scale = nullptr;

    Tensor() = default;
    Tensor(void* d, DType t, std::initializer_list<int64_t> dims, Device dev = Device::CPU)
        : data(d), dtype(t), device(dev) {
        PG_CHECK(dims.size() <= kMaxDims);
        for (int64_t v : dims) shape[ndim++] = v;
    }

    bool empty() const { return data == nullptr; }
    int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
    int64_t numel() const {
        int64_t n = 1;
        for (int i = 0; i < ndim; ++i) n *= shape[i];
        return n;
    }
    int64_t cols() const { return ndim == 0 ? 1 : shape[ndim - 1]; }
    int64_t rows() const { return numel() / cols(); }
    size_t row_bytes() const { return dtype_row_bytes(dtype, cols()); }
    size_t nbytes() const { return static_cast<size_t>(rows()) * row_bytes(); }

    template <typename T>
    T* ptr() const {
        return static_cast<T*>(data);
    }
    // Row `r` of the tensor seen as [rows(), cols()]. Not for the GQ device layouts, whose
    // codes and factors are stored apart (core/dtype.h).
    const void* row(int64_t r) const { return static_cast<const char*>(data) + r * row_bytes(); }

    std::string shape_str() const;
};

}  // namespace peregrine
