// The activation buffers a backend's blocks use between their kernels. The backend owns them
// (which ones a block needs depends on the kernels it fuses); the model owns only the residual
// stream and the logits. Capacities grow in begin_step to the step's size and never shrink, so
// steady-state steps allocate nothing, and a recorded step (run_step) finds its buffers where
// it left them: moving a buffer drops the device's recordings first.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "backend/device.h"
#include "core/error.h"

namespace peregrine {

// What each buffer holds, for a step of n tokens; `act` is the backend's activation dtype.
enum class ScratchSlot {
    Normed,    // [n, hidden] act: a block's normalised input (also of the final norm)
    Q,         // [n, q_dim] act: queries (rotated in place, or written rotated from Qkv)
    K,         // [n, kv_dim] act: keys, apart
    V,         // [n, kv_dim] act: values, apart
    Qkv,       // [n, q_dim + 2 kv_dim] act: q | k | v per row, from stacked projections
    Attn,      // [n, q_dim] act: attention output, the o projection's input
    Gate,      // [n, intermediate] act: gate product, then silu(gate) * up
    Up,        // [n, intermediate] act: up product, apart
    GateUp,    // [n, 2 intermediate] act: gate | up per row, from a stacked projection
    Product,   // [n, hidden] f32: an o / down product before its residual add
    Selected,  // [logit rows, hidden] act: the normalised rows whose logits are wanted
    Count
};

class Scratch {
  public:
    explicit Scratch(DeviceServices& device) : device_(device) {}
    // The owner calls clear() in its destructor, while its device can still release.
    ~Scratch() = default;
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;

    // Room for a step of `tokens` tokens returning `logit_rows` rows of logits. Growing either
    // capacity reallocates the buffers made so far (dropping the device's recordings once).
    void reserve(int64_t tokens, int64_t logit_rows) {
        if (tokens <= tokens_ && logit_rows <= logit_rows_) return;
        tokens_ = std::max(tokens, tokens_);
        logit_rows_ = std::max(logit_rows, logit_rows_);
        bool moves = false;
        for (const Buffer& b : buffers_) moves = moves || !b.t.empty();
        if (moves) device_.forget_steps();  // recordings hold the old addresses
        for (Buffer& b : buffers_) {        // all released first: old and new never coexist
            if (!b.t.empty()) device_.release(b.t);
        }
        for (size_t s = 0; s < buffers_.size(); ++s) {
            Buffer& b = buffers_[s];
            if (b.cols > 0) b.t = device_.allocate(b.dtype, {capacity(static_cast<ScratchSlot>(s)) * b.cols});
        }
    }

    // A [rows, cols] view of `slot`'s buffer; rows within the reserved capacity (logit rows for
    // Selected, tokens for the rest). A buffer is made on first use, at the reserved capacity
    // (which moves nothing); each slot keeps one dtype.
    Tensor get(ScratchSlot slot, DType dtype, int64_t rows, int64_t cols) {
        PG_CHECK(rows <= capacity(slot), "scratch slot ", static_cast<int>(slot), ": ", rows, " rows, reserved ",
                 capacity(slot), " (begin_step reserves a step's rows)");
        Buffer& b = buffers_[static_cast<size_t>(slot)];
        PG_CHECK(b.cols == 0 || b.dtype == dtype, "scratch slot ", static_cast<int>(slot), " holds ",
                 dtype_name(b.dtype), ", asked for ", dtype_name(dtype));
        if (cols > b.cols) {  // first use, or a wider model on the same backend
            if (!b.t.empty()) {
                device_.forget_steps();
                device_.release(b.t);
            }
            b.t = device_.allocate(dtype, {capacity(slot) * cols});
            b.dtype = dtype;
            b.cols = cols;
        }
        return Tensor(b.t.data, dtype, {rows, cols}, b.t.device);
    }

    void clear() {
        for (Buffer& b : buffers_) {
            if (!b.t.empty()) device_.release(b.t);
            b.cols = 0;
        }
        tokens_ = logit_rows_ = 0;
    }

  private:
    struct Buffer {
        Tensor t;  // [capacity(slot) * cols] elements
        DType dtype = DType::F32;
        int64_t cols = 0;  // 0: not made yet
    };
    int64_t capacity(ScratchSlot slot) const { return slot == ScratchSlot::Selected ? logit_rows_ : tokens_; }

    DeviceServices& device_;
    int64_t tokens_ = 0, logit_rows_ = 0;
    std::array<Buffer, static_cast<size_t>(ScratchSlot::Count)> buffers_;
};

}  // namespace peregrine
