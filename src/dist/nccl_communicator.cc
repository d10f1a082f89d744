#include "dist/nccl_communicator.h"

#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace peregrine {

// ---- the ABI we use, as nccl.h (2.x) and cuda.h declare it ----------------------------------
// Declared here so this file compiles without CUDA and nothing links against NCCL or the driver.
namespace {

using ncclResult_t = int;  // enum: ncclSuccess = 0, ncclInProgress = 7
using ncclDataType_t = int;
using ncclRedOp_t = int;
using ncclComm_t = void*;  // struct ncclComm*
using cudaStream_t = void*;
struct ncclUniqueId {
    char internal[128];  // NCCL_UNIQUE_ID_BYTES
};
static_assert(sizeof(ncclUniqueId) == 128);

constexpr ncclResult_t kNcclSuccess = 0;
constexpr ncclResult_t kNcclInProgress = 7;
constexpr ncclDataType_t kNcclFloat32 = 7;
constexpr ncclDataType_t kNcclBfloat16 = 9;
constexpr ncclRedOp_t kNcclSum = 0;

using CUresult = int;  // CUDA_SUCCESS = 0, CUDA_ERROR_NOT_READY = 600
using CUdevice = int;
using CUcontext = void*;
using CUdeviceptr = unsigned long long;
using CUstream = void*;
constexpr CUresult kCudaSuccess = 0;
constexpr CUresult kCudaErrorNotReady = 600;
constexpr int kCaptureStatusNone = 0;  // CU_STREAM_CAPTURE_STATUS_NONE

ncclDataType_t nccl_type(DType dtype) {
    switch (dtype) {
        case DType::F32:
            return kNcclFloat32;
        case DType::BF16:
            return kNcclBfloat16;
        default:
            comm_element_size(dtype);  // throws naming the dtype
            return kNcclFloat32;
    }
}

}  // namespace

// The entry points, resolved once per process. `error` is set (and the pointers null) when a
// library or symbol is missing.
struct NcclLibrary {
    std::string error;

    // libnccl.so.2
    ncclResult_t (*GetVersion)(int*) = nullptr;
    ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
    ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
    ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
    ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
    ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
    const char* (*GetErrorString)(ncclResult_t) = nullptr;
    const char* (*GetLastError)(ncclComm_t) = nullptr;  // NCCL >= 2.13; may stay null
    ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                              cudaStream_t) = nullptr;
    ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
    ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
    ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
    ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
    ncclResult_t (*GroupStart)() = nullptr;
    ncclResult_t (*GroupEnd)() = nullptr;

    // libcuda.so.1 (the driver API: contexts, the barrier's scratch, stream polling)
    CUresult (*cuInit)(unsigned) = nullptr;
    CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;
    CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
    CUresult (*cuMemAlloc)(CUdeviceptr*, size_t) = nullptr;
    CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
    CUresult (*cuMemsetD32)(CUdeviceptr, unsigned, size_t) = nullptr;
    CUresult (*cuStreamQuery)(CUstream) = nullptr;
    CUresult (*cuStreamIsCapturing)(CUstream, int*) = nullptr;
    CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;

    int version = 0;  // e.g. 22809 for 2.28.9
};

namespace {

// Where NCCL may live when the loader's path does not list it: the CUDA toolkit's folders.
void* open_nccl(std::string& dl_error) {
    const char* names[] = {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2", "/usr/local/cuda/lib/libnccl.so.2"};
    std::string from_home;
    if (const char* home = std::getenv("CUDA_HOME")) from_home = std::string(home) + "/lib64/libnccl.so.2";
    for (const char* name : names) {
        if (void* h = ::dlopen(name, RTLD_NOW | RTLD_LOCAL)) return h;
        if (dl_error.empty()) dl_error = ::dlerror();
    }
    if (!from_home.empty())
        if (void* h = ::dlopen(from_home.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    return nullptr;
}

template <typename F>
bool resolve(void* handle, const char* symbol, F& out, std::string& error) {
    out = reinterpret_cast<F>(::dlsym(handle, symbol));
    if (!out && error.empty()) error = str_cat("symbol ", symbol, " missing from the loaded library");
    return out != nullptr;
}

NcclLibrary load_library() {
    NcclLibrary lib;
    std::string dl_error;
    void* nccl = open_nccl(dl_error);
    if (!nccl) {
        lib.error = str_cat("NCCL not found (libnccl.so.2): install NCCL or run with one rank (", dl_error, ")");
        return lib;
    }
    void* cuda = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) {
        lib.error = str_cat("the CUDA driver (libcuda.so.1) is not installed: ", ::dlerror());
        return lib;
    }
    std::string& e = lib.error;
    resolve(nccl, "ncclGetVersion", lib.GetVersion, e);
    resolve(nccl, "ncclGetUniqueId", lib.GetUniqueId, e);
    resolve(nccl, "ncclCommInitRank", lib.CommInitRank, e);
    resolve(nccl, "ncclCommDestroy", lib.CommDestroy, e);
    resolve(nccl, "ncclCommAbort", lib.CommAbort, e);
    resolve(nccl, "ncclCommGetAsyncError", lib.CommGetAsyncError, e);
    resolve(nccl, "ncclGetErrorString", lib.GetErrorString, e);
    resolve(nccl, "ncclAllReduce", lib.AllReduce, e);
    resolve(nccl, "ncclAllGather", lib.AllGather, e);
    resolve(nccl, "ncclBroadcast", lib.Broadcast, e);
    resolve(nccl, "ncclSend", lib.Send, e);
    resolve(nccl, "ncclRecv", lib.Recv, e);
    resolve(nccl, "ncclGroupStart", lib.GroupStart, e);
    resolve(nccl, "ncclGroupEnd", lib.GroupEnd, e);
    lib.GetLastError = reinterpret_cast<const char* (*)(ncclComm_t)>(::dlsym(nccl, "ncclGetLastError"));
    resolve(cuda, "cuInit", lib.cuInit, e);
    resolve(cuda, "cuDeviceGet", lib.cuDeviceGet, e);
    resolve(cuda, "cuDevicePrimaryCtxRetain", lib.cuDevicePrimaryCtxRetain, e);
    resolve(cuda, "cuDevicePrimaryCtxRelease_v2", lib.cuDevicePrimaryCtxRelease, e);
    resolve(cuda, "cuCtxSetCurrent", lib.cuCtxSetCurrent, e);
    resolve(cuda, "cuMemAlloc_v2", lib.cuMemAlloc, e);
    resolve(cuda, "cuMemFree_v2", lib.cuMemFree, e);
    resolve(cuda, "cuMemsetD32_v2", lib.cuMemsetD32, e);
    resolve(cuda, "cuStreamQuery", lib.cuStreamQuery, e);
    resolve(cuda, "cuStreamIsCapturing", lib.cuStreamIsCapturing, e);
    resolve(cuda, "cuGetErrorString", lib.cuGetErrorString, e);
    if (!e.empty()) return lib;
    if (lib.GetVersion(&lib.version) != kNcclSuccess) lib.version = 0;
    // The handles stay open for the life of the process: NCCL's threads outlive any one object.
    return lib;
}

const NcclLibrary& library() {
    static const NcclLibrary lib = load_library();
    return lib;
}

const NcclLibrary& loaded_library() {
    const NcclLibrary& lib = library();
    if (!lib.error.empty()) throw Error(lib.error);
    return lib;
}

void check_cu(const NcclLibrary& lib, CUresult r, const char* call, int device) {
    if (r == kCudaSuccess) return;
    const char* text = nullptr;
    if (lib.cuGetErrorString(r, &text) != kCudaSuccess || !text) text = "unknown error";
    fail(call, " failed on CUDA device ", device, ": ", text, " (CUresult ", r, ")");
}

}  // namespace

NcclId NcclId::from_bytes(std::string_view bytes) {
    NcclId id;
    if (bytes.size() != id.data.size())
        fail("an NCCL unique id is ", id.data.size(), " bytes, got ", bytes.size(),
             " (the rendezvous store handed out something else)");
    std::memcpy(id.data.data(), bytes.data(), bytes.size());
    return id;
}

bool NcclCommunicator::available(std::string* why) {
    const NcclLibrary& lib = library();
    if (why) *why = lib.error;
    return lib.error.empty();
}

NcclId NcclCommunicator::new_id() {
    const NcclLibrary& lib = loaded_library();
    ncclUniqueId raw{};
    const ncclResult_t r = lib.GetUniqueId(&raw);
    if (r != kNcclSuccess) fail("ncclGetUniqueId failed: ", lib.GetErrorString(r));
    NcclId id;
    std::memcpy(id.data.data(), raw.internal, sizeof(raw.internal));
    return id;
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(const NcclId& id, int rank, int size, int device,
                                                           void* stream) {
    return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(id, rank, size, device, stream));
}

NcclCommunicator::NcclCommunicator(const NcclId& id, int rank, int size, int device, void* stream)
    : Communicator(rank, size), lib_(&loaded_library()), stream_(stream), device_(device) {
    if (size < 1 || rank < 0 || rank >= size) fail("NCCL communicator: rank ", rank, " is not in [0, ", size, ")");
    const NcclLibrary& lib = *lib_;
    check_cu(lib, lib.cuInit(0), "cuInit", device);
    check_cu(lib, lib.cuDeviceGet(&cu_device_, device), "cuDeviceGet", device);
    check_cu(lib, lib.cuDevicePrimaryCtxRetain(&context_, cu_device_), "cuDevicePrimaryCtxRetain", device);
    try {
        // NCCL and the CUDA runtime both take the device from the thread's current context.
        check_cu(lib, lib.cuCtxSetCurrent(context_), "cuCtxSetCurrent", device);
        check_cu(lib, lib.cuMemAlloc(&scratch_, sizeof(float)), "cuMemAlloc (barrier scratch)", device);
        check_cu(lib, lib.cuMemsetD32(scratch_, 0, 1), "cuMemsetD32 (barrier scratch)", device);
        ncclUniqueId raw{};
        std::memcpy(raw.internal, id.data.data(), sizeof(raw.internal));
        ncclComm_t comm = nullptr;
        const ncclResult_t r = lib.CommInitRank(&comm, size, raw, rank);
        if (r != kNcclSuccess)
            fail("ncclCommInitRank (rank ", rank, " of ", size, ", CUDA device ", device,
                 ") failed: ", lib.GetErrorString(r));
        comm_ = comm;
    } catch (...) {
        if (scratch_) lib.cuMemFree(scratch_);
        lib.cuDevicePrimaryCtxRelease(cu_device_);
        throw;
    }
}

NcclCommunicator::~NcclCommunicator() {
    const NcclLibrary& lib = *lib_;
    if (comm_) {
        // Destroy waits for queued work; an aborted (failed) group is torn down without waiting.
        if (aborted_) {
            lib.CommAbort(comm_);
        } else {
            lib.CommDestroy(comm_);
        }
    }
    if (scratch_) lib.cuMemFree(scratch_);
    lib.cuDevicePrimaryCtxRelease(cu_device_);
}

std::string NcclCommunicator::name() const {
    return str_cat("nccl ", lib_->version / 10000, ".", lib_->version / 100 % 100, ".", lib_->version % 100, " (rank ",
                   rank_, " of ", size_, ", CUDA device ", device_, ")");
}

// " (NCCL's last error text)", or nothing when NCCL has none.
std::string NcclCommunicator::last_error_suffix() const {
    const char* detail = lib_->GetLastError ? lib_->GetLastError(static_cast<ncclComm_t>(comm_)) : nullptr;
    return detail && *detail ? str_cat(" (", detail, ")") : std::string();
}

void NcclCommunicator::check(int result, const char* call) {
    if (result == kNcclSuccess || result == kNcclInProgress) return;
    fail(call, " failed on rank ", rank_, " of ", size_, ": ", lib_->GetErrorString(result), last_error_suffix());
}

void NcclCommunicator::check_peer(int peer, const char* op) const {
    if (peer < 0 || peer >= size_) fail("NCCL ", op, ": peer ", peer, " is not in [0, ", size_, ")");
}

void NcclCommunicator::all_reduce_sum(void* buf, size_t count, DType dtype) {
    check(lib_->AllReduce(buf, buf, count, nccl_type(dtype), kNcclSum, comm_, stream_), "ncclAllReduce");
}

void NcclCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype) {
    check(lib_->AllGather(send, recv, count, nccl_type(dtype), comm_, stream_), "ncclAllGather");
}

void NcclCommunicator::broadcast(void* buf, size_t count, DType dtype, int root) {
    check_peer(root, "broadcast");
    check(lib_->Broadcast(buf, buf, count, nccl_type(dtype), root, comm_, stream_), "ncclBroadcast");
}

void NcclCommunicator::send(const void* buf, size_t count, DType dtype, int peer) {
    check_peer(peer, "send");
    const ncclDataType_t type = nccl_type(dtype);
    if (peer == rank_) {
        self_sends_.push_back(PendingSend{buf, count, dtype});
        return;
    }
    check(lib_->Send(buf, count, type, peer, comm_, stream_), "ncclSend");
}

void NcclCommunicator::recv(void* buf, size_t count, DType dtype, int peer) {
    check_peer(peer, "recv");
    const ncclDataType_t type = nccl_type(dtype);
    if (peer != rank_) {
        check(lib_->Recv(buf, count, type, peer, comm_, stream_), "ncclRecv");
        return;
    }
    if (self_sends_.empty()) fail("NCCL recv from rank ", rank_, " itself with no send to itself before it");
    const PendingSend s = self_sends_.front();
    self_sends_.pop_front();
    if (s.count != count || s.dtype != dtype)
        fail("NCCL recv of ", count, " ", dtype_name(dtype), " from rank ", rank_, " itself matches a send of ",
             s.count, " ", dtype_name(s.dtype));
    // One group: NCCL pairs the two inside it, where on one stream the send alone would block.
    check(lib_->GroupStart(), "ncclGroupStart");
    const ncclResult_t rs = lib_->Send(s.buf, count, type, rank_, comm_, stream_);
    const ncclResult_t rr = lib_->Recv(buf, count, type, rank_, comm_, stream_);
    const ncclResult_t re = lib_->GroupEnd();
    check(rs, "ncclSend (to itself)");
    check(rr, "ncclRecv (from itself)");
    check(re, "ncclGroupEnd");
}

void NcclCommunicator::check_async_error() {
    ncclResult_t async = kNcclSuccess;
    check(lib_->CommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
    if (async == kNcclSuccess || async == kNcclInProgress) return;
    aborted_ = true;
    fail("NCCL group failed on rank ", rank_, " of ", size_, ": ", lib_->GetErrorString(async), last_error_suffix(),
         " (a peer rank may have died)");
}

void NcclCommunicator::barrier() {
    const NcclLibrary& lib = *lib_;
    int capturing = kCaptureStatusNone;
    check_cu(lib, lib.cuStreamIsCapturing(stream_, &capturing), "cuStreamIsCapturing", device_);
    PG_CHECK(capturing == kCaptureStatusNone, "NCCL barrier called while the stream is captured into a graph");
    check(lib.AllReduce(reinterpret_cast<void*>(scratch_), reinterpret_cast<void*>(scratch_), 1, kNcclFloat32, kNcclSum,
                        comm_, stream_),
          "ncclAllReduce (barrier)");
    // Poll instead of cuStreamSynchronize: a dead peer leaves the kernel waiting forever, and only
    // NCCL's asynchronous error (seen here) lets this rank give up.
    auto pause = std::chrono::microseconds(20);
    for (;;) {
        const CUresult r = lib.cuStreamQuery(stream_);
        if (r == kCudaSuccess) return;
        if (r != kCudaErrorNotReady) check_cu(lib, r, "cuStreamQuery (barrier)", device_);
        check_async_error();
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
}

}  // namespace peregrine
