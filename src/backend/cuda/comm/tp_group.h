// A tensor-parallel group's collectives on the GPUs (issue #36; model/shard.h says what each rank
// holds): the ranks of one process, a host thread and a GPU each, their partial sums added up
// (all-reduce), and the ranks' vocabulary ranges of the logits gathered on rank 0. Plain C++17:
// the backend (cuda_backend.cpp, g++) makes the group and the device model (CUDA) enqueues its
// collectives on its stream. Two transports, chosen when the group is made:
//  - kPeer: a one-shot all-reduce over peer pointers (below). Two ranks may share one GPU (tests
//    do, on a one-GPU machine) when CUDA loads its modules eagerly (create() checks).
//  - kNccl: NCCL's all-reduce and send/receive, NCCL loaded at run time (libnccl.so.2: the GPU
//    machine's own, as CUDA's libraries), one communicator per rank; one GPU per rank.
//
// Every rank must enqueue the same collectives in the same order, as the forward pass does; a
// collective waits on the device until every rank has reached it. kPeer (tp_group.cu): each rank
// owns buffers that its peers read; the blocks of a collective meet their peers' blocks of the
// same index through flags in each rank's memory (a release store at system scope to each peer,
// acquire loads of its own), then read the peers' buffers. The products' two buffers alternate
// and the embedding has its own, so a rank writes a buffer again only after every peer has
// started a later collective, which it does after finishing the one that read the buffer. The
// gather meets twice: before rank 0 reads the peers' logits and after. A rank that never arrives
// (its host thread failed) stops its peers' kernels with a trap after kWaitSeconds: a device
// error for the backend to report, not a hang.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/dtypes.h"

struct CUstream_st;

namespace lmserve::cuda {

class TpGroup {
 public:
  static constexpr int kMaxRanks = 8;
  static constexpr double kWaitSeconds = 60;
  enum class Transport { kPeer, kNccl };

  // One rank per entry of `devices` (a device may repeat). Each rank gets two product buffers of
  // `product_bytes`, an embedding buffer of `embed_bytes` and a logits buffer of `gather_bytes`
  // on its device, which every other rank can read (peer access is enabled between distinct
  // devices; an error names a pair that has none).
  static std::shared_ptr<TpGroup> create(const std::vector<int>& devices, std::size_t product_bytes, std::size_t embed_bytes,
                                         std::size_t gather_bytes, Transport transport, std::string* error);
  ~TpGroup();
  TpGroup(const TpGroup&) = delete;
  TpGroup& operator=(const TpGroup&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }
  int device(int rank) const { return ranks_[static_cast<std::size_t>(rank)].device; }

  // The host threads' meeting point: returns true once every rank has called it, false at once
  // when a rank has called fail(). The memory plan meets before each phase that runs collectives:
  // a rank must not be inside a call that waits for its whole device (cudaFree, instantiating a
  // graph) while collectives that wait for it run there, as they do when ranks share a GPU.
  bool meet();
  void fail();

  // Where rank `rank`'s o_proj / down products write (which = 0 or 1, alternating) and its
  // embedding rows (which = 2, float32); its logits rows (float32, its vocabulary range).
  void* product_buffer(int rank, int which) const { return ranks_[static_cast<std::size_t>(rank)].buf[which]; }
  float* gather_buffer(int rank) const { return static_cast<float*>(ranks_[static_cast<std::size_t>(rank)].buf[3]); }

  // out (n floats on the rank's device) = the sum, in rank order in float32, of the first n
  // elements (of dtype `act`) of every rank's buffer `which`. Enqueued on `stream`.
  std::string all_reduce(int rank, int which, backend::ActDtype act, float* out, std::int64_t n, CUstream_st* stream) const;
  // Rank 0's out [rows x vocab] = every rank k's gather_buffer [rows x (ranges[k + 1] -
  // ranges[k])] in columns ranges[k] .. ranges[k + 1]; the other ranks only meet (out unused).
  std::string gather_rows(int rank, float* out, int rows, const std::vector<std::int64_t>& ranges, CUstream_st* stream) const;

 private:
  struct Rank {
    int device = 0;
    void* buf[4] = {nullptr, nullptr, nullptr, nullptr};
    void* signals = nullptr;
    void* stage = nullptr;  // kNccl, rank 0: the other ranks' logits as received
    void* comm = nullptr;   // kNccl: the rank's communicator
  };
  struct Nccl;  // the library's entry points (tp_group.cu)
  TpGroup() = default;
  std::string start_nccl(std::size_t gather_bytes);
  std::string nccl_all_reduce(int rank, int which, backend::ActDtype act, float* out, std::int64_t n, CUstream_st* stream) const;
  std::string nccl_gather(int rank, float* out, int rows, const std::vector<std::int64_t>& ranges, CUstream_st* stream) const;
  Transport transport_ = Transport::kPeer;
  int blocks_ = 0;  // kPeer: each collective's grid (tp_group.cu's kBlocks, less for ranks sharing a GPU)
  std::unique_ptr<Nccl> nccl_;
  std::vector<Rank> ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::uint64_t round_ = 0;
  bool failed_ = false;
};

}  // namespace lmserve::cuda
