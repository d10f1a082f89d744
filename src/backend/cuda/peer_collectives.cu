// The push-and-barrier peer collectives of peer_collectives.h: the kernel and its IPC setup.
#include "backend/cuda/peer_collectives.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl.cuh"
#include "core/error.h"

namespace peregrine::cuda {

namespace {

constexpr int kThreads = 256;
constexpr uint64_t kTimeoutNs = 30ull * 1000 * 1000 * 1000;  // a peer 30 s late is gone
constexpr uint32_t kSlot4 = PeerCollectives::kSlotBytes / sizeof(float4);
constexpr size_t kFlagBytes = sizeof(uint32_t) * PeerCollectives::kBlocks * PeerCollectives::kMaxRanks;

enum Mode { kReduceAdd = 0, kReduce = 1, kGather = 2 };

struct PeerBases {
    float4* base[PeerCollectives::kMaxRanks];  // each rank's staging area, as mapped on this GPU
};

__device__ __forceinline__ void store_release(uint32_t* p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// R ranks; x, out: float4 units, n4 a rank. Every CTA runs the barrier, also one with no
// elements, so the CTAs' epochs stay equal on every rank.
template <int R, int M>
__global__ void __launch_bounds__(kThreads)
    peer_kernel(PeerBases p, int rank, uint32_t* epochs, const float4* x, float4* out, uint32_t n4) {
    // Nothing is read or written before the previous kernel's writes (x, out) are complete; the
    // next kernel may start (and prefetch its weights) meanwhile.
    pdl_launch_dependents();
    pdl_wait();
    const int b = blockIdx.x;
    const uint32_t epoch = epochs[b] + 1;  // read by every thread before thread 0 stores it, at the end
    const uint32_t parity = (epoch & 1) * R * kSlot4;
    const uint32_t stride = gridDim.x * blockDim.x;
    const uint32_t first = b * blockDim.x + threadIdx.x;
    // Push this rank's share into slot `rank` of every rank (plain stores; remote ones over NVLink).
    for (uint32_t i = first; i < n4; i += stride) {
        const float4 v = x[i];
#pragma unroll
        for (int r = 0; r < R; ++r) p.base[r][parity + rank * kSlot4 + i] = v;
    }
    __syncthreads();
    // Thread t (a peer) tells rank t this CTA's share has been written, then waits for rank t's.
    // The CTA barrier orders every thread's stores before thread t's release (cumulative), and
    // rank t's acquire plus its barrier order them before its CTA's loads, as in vLLM's kernels.
    const int t = threadIdx.x;
    if (t < R && t != rank) {
        uint32_t* flags = reinterpret_cast<uint32_t*>(p.base[t] + 2 * R * kSlot4);
        store_release(flags + b * PeerCollectives::kMaxRanks + rank, epoch);
        const uint32_t* mine = reinterpret_cast<const uint32_t*>(p.base[rank] + 2 * R * kSlot4);
        const uint32_t* slot = mine + b * PeerCollectives::kMaxRanks + t;
        const uint64_t start = global_ns();
        while (static_cast<int32_t>(load_acquire(slot) - epoch) < 0)  // distance: wraps after 2^32 calls
            if (global_ns() - start > kTimeoutNs) __trap();
    }
    __syncthreads();
    const float4* slots = p.base[rank] + parity;  // local memory the peers wrote
    for (uint32_t i = first; i < n4; i += stride) {
        if constexpr (M == kGather) {
#pragma unroll
            for (int r = 0; r < R; ++r) out[r * n4 + i] = __ldcg(slots + r * kSlot4 + i);
        } else {
            float4 s = __ldcg(slots + i);
#pragma unroll
            for (int r = 1; r < R; ++r) {
                const float4 v = __ldcg(slots + r * kSlot4 + i);
                s.x += v.x;
                s.y += v.y;
                s.z += v.z;
                s.w += v.w;
            }
            if constexpr (M == kReduceAdd) {
                const float4 o = out[i];
                s.x = o.x + s.x;
                s.y = o.y + s.y;
                s.z = o.z + s.z;
                s.w = o.w + s.w;
            }
            out[i] = s;
        }
    }
    if (t == 0) epochs[b] = epoch;
}

template <int R>
void launch_ranks(int mode, const PeerBases& p, int rank, uint32_t* epochs, const float4* x, float4* out, uint32_t n4,
                  cudaStream_t stream) {
    static constexpr decltype(&peer_kernel<R, kReduceAdd>) kernels[] = {
        peer_kernel<R, kReduceAdd>, peer_kernel<R, kReduce>, peer_kernel<R, kGather>};
    launch_pdl(kernels[mode], PeerCollectives::kBlocks, kThreads, 0, stream, p, rank, epochs, x, out, n4);
}

std::string hex(const void* p, size_t n) {
    static const char* digits = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; ++i) {
        const unsigned char c = static_cast<const unsigned char*>(p)[i];
        s += digits[c >> 4];
        s += digits[c & 15];
    }
    return s;
}

int nibble(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

}  // namespace

PeerCollectives::PeerCollectives(int rank, int size, int device) : rank_(rank), size_(size), device_(device) {
    PG_CHECK(size >= 2 && size <= kMaxRanks && rank >= 0 && rank < size, "PeerCollectives: rank ", rank, " of ", size);
    const size_t bytes = 2 * size * kSlotBytes + kFlagBytes;
    PG_CUDA_CHECK(cudaMalloc(&local_, bytes));
    PG_CUDA_CHECK(cudaMemset(local_, 0, bytes));
    PG_CUDA_CHECK(cudaMalloc(&epochs_, sizeof(uint32_t) * kBlocks));
    PG_CUDA_CHECK(cudaMemset(epochs_, 0, sizeof(uint32_t) * kBlocks));
    PG_CUDA_CHECK(cudaDeviceSynchronize());
}

PeerCollectives::~PeerCollectives() {
    for (int r = 0; r < static_cast<int>(peers_.size()); ++r)
        if (r != rank_ && peers_[r]) cudaIpcCloseMemHandle(peers_[r]);
    if (local_) cudaFree(local_);
    if (epochs_) cudaFree(epochs_);
}

std::string PeerCollectives::handle() const {
    cudaIpcMemHandle_t h;
    PG_CUDA_CHECK(cudaIpcGetMemHandle(&h, local_));
    return std::to_string(device_) + ":" + hex(&h, sizeof h);
}

int PeerCollectives::handle_device(const std::string& handle) {
    const size_t colon = handle.find(':');
    PG_CHECK(colon != std::string::npos && colon > 0 && colon < 4, "PeerCollectives: malformed handle '", handle, "'");
    return std::stoi(handle.substr(0, colon));
}

bool PeerCollectives::can_reach(int peer_device) const {
    int ok = 0;
    return peer_device != device_ && cudaDeviceCanAccessPeer(&ok, device_, peer_device) == cudaSuccess && ok == 1;
}

void PeerCollectives::open(const std::vector<std::string>& handles) {
    PG_CHECK(static_cast<int>(handles.size()) == size_, "PeerCollectives::open: ", handles.size(), " handles for ",
             size_, " ranks");
    std::vector<void*> peers(size_, nullptr);
    peers[rank_] = local_;
    auto close_opened = [&] {
        for (int q = 0; q < size_; ++q)
            if (q != rank_ && peers[q]) cudaIpcCloseMemHandle(peers[q]);
    };
    for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        const std::string& s = handles[r];
        const std::string digits = s.substr(s.find(':') + 1);
        cudaIpcMemHandle_t h;
        bool well_formed = digits.size() == 2 * sizeof h;
        for (size_t i = 0; well_formed && i < sizeof h; ++i) {
            const int hi = nibble(digits[2 * i]), lo = nibble(digits[2 * i + 1]);
            well_formed = hi >= 0 && lo >= 0;
            reinterpret_cast<unsigned char*>(&h)[i] = static_cast<unsigned char>(hi << 4 | lo);
        }
        if (!well_formed) {
            close_opened();
            fail("PeerCollectives: rank ", r, "'s handle is malformed");
        }
        const cudaError_t e = cudaIpcOpenMemHandle(&peers[r], h, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
            cudaGetLastError();  // not sticky: clear it
            peers[r] = nullptr;
            close_opened();
            fail("PeerCollectives: cannot map rank ", r, "'s staging area (GPU ", handle_device(s),
                 "): ", cudaGetErrorString(e));
        }
    }
    peers_ = std::move(peers);
}

bool PeerCollectives::fits(size_t count) const {
    return !peers_.empty() && count % 4 == 0 && count * sizeof(float) <= kSlotBytes;
}

void PeerCollectives::launch(int mode, const float* x, float* out, size_t count, cudaStream_t stream) {
    PG_CHECK(fits(count), "PeerCollectives: ", count, " elements do not fit");
    PG_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0,
             "PeerCollectives: buffers must be 16-byte aligned");
    if (count == 0) return;  // every rank skips alike: no epoch is spent
    PeerBases p{};
    for (int r = 0; r < size_; ++r) p.base[r] = static_cast<float4*>(peers_[r]);
    const auto* x4 = reinterpret_cast<const float4*>(x);
    auto* o4 = reinterpret_cast<float4*>(out);
    const uint32_t n4 = static_cast<uint32_t>(count / 4);
    switch (size_) {
        case 2:
            launch_ranks<2>(mode, p, rank_, epochs_, x4, o4, n4, stream);
            break;
        case 3:
            launch_ranks<3>(mode, p, rank_, epochs_, x4, o4, n4, stream);
            break;
        case 4:
            launch_ranks<4>(mode, p, rank_, epochs_, x4, o4, n4, stream);
            break;
        case 5:
            launch_ranks<5>(mode, p, rank_, epochs_, x4, o4, n4, stream);
            break;
        case 6:
            launch_ranks<6>(mode, p, rank_, epochs_, x4, o4, n4, stream);
            break;
        case 7:
            launch_ranks<7>(mode, p, rank_, epochs_, x4, o4, n4, stream);
            break;
        case 8:
            launch_ranks<8>(mode, p, rank_, epochs_, x4, o4, n4, stream);
            break;
        default:
            fail("PeerCollectives: ", size_, " ranks");
    }
    check_launch("peer collective");
}

void PeerCollectives::reduce_add(const float* x, float* out, size_t count, cudaStream_t stream) {
    launch(kReduceAdd, x, out, count, stream);
}

void PeerCollectives::all_reduce(float* buf, size_t count, cudaStream_t stream) {
    launch(kReduce, buf, buf, count, stream);
}

void PeerCollectives::all_gather(const float* send, float* recv, size_t count, cudaStream_t stream) {
    launch(kGather, send, recv, count, stream);
}

}  // namespace peregrine::cuda
