// The CUDA model (DeviceModel, device_model.h) as a class shared by the files that define it:
// device_model.cu (weights, memory plan, buffers, graphs, the step's staging, launch and results,
// swaps) and model_forward.cu (the layers and the head enqueued on the stream). CUDA-side: included
// only by those two.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/common/device_buffer.cuh"
#include "backend/cuda/common/device_util.cuh"
#include "backend/cuda/model/device_model.h"
#include "backend/cuda/gemm/gemm.cuh"
#include "backend/cuda/common/kernels.cuh"
#include "backend/cuda/measure/step_report.cuh"
#include "backend/cuda/comm/tp_group.h"

// Early returns of a string error from a CUDA call (and, device_util.cuh's LMSERVE_TRY, from a
// call that returns one).
#define LMSERVE_CUDA_TRY(call)                                                                  \
  do {                                                                                          \
    if (cudaError_t e_ = (call); e_ != cudaSuccess) return std::string(#call) + ": " + cudaGetErrorString(e_); \
  } while (0)

namespace lmserve::cuda {

struct LayerBuffers {
  DeviceBuffer input_norm, post_norm, qkv, qkv_bias, q_norm, k_norm, o, gate_up, down;
  DeviceBuffer qkv_scale, o_scale, gate_up_scale, down_scale;  // fp8_weights: per output row
};

class CudaModel final : public DeviceModel {
 public:
  CudaModel(int device, ModelDims d, std::shared_ptr<TpGroup> group, int rank)
      : device_(device), d_(std::move(d)), act_(static_cast<Act>(d_.act)), tp_(std::move(group)), rank_(rank),
        vocab_begin_(d_.vocab_ranges.empty() ? 0 : d_.vocab_ranges[static_cast<std::size_t>(rank)]),
        vocab_rows_(d_.vocab_ranges.empty() ? d_.vocab : d_.vocab_ranges[static_cast<std::size_t>(rank) + 1] - vocab_begin_) {}
  ~CudaModel() override;
  std::string init();
  std::string set_weight(Slot slot, std::int64_t layer, std::int64_t offset, const void* host, std::size_t bytes) override;
  std::string plan(const PlanOptions& o, MemoryPlan* out) override;

  // forward() in three parts (DeviceModel::prepare / launch / finish): prepare stages the step's
  // metadata in pinned memory (after the copy of the step before has read it), launch writes the
  // patched tokens into it and enqueues the copy, the layers, the head and the copies of the
  // results to pinned memory, finish waits for them and hands them over.
  std::string prepare(const StepInput& in) override;
  std::string launch(const std::int32_t* patch_index, const std::int32_t* patch_token, int patches) override;
  std::string finish(StepTimes* times) override;
  std::string supply_masks(const std::uint64_t* masks, int n) override;

 private:
  // A step between prepare() and finish(): its input (the caller's arrays stay valid until
  // finish), how it runs, the rows its results' copies cover and the time it took.
  struct Step {
    StepInput in;
    bool decode = false;
    int bucket = 0;
    bool report = false;
    int fetch_r0 = 0, fetch_rows = 0;  // the rows copied back and not yet handed over
    bool fetch_tokens = false, fetch_logits = false;
    int masked = 0;  // rows waiting for supply_masks (their fetch and the done event wait too)
    double stage_seconds = 0, launch_seconds = 0, device_seconds = 0;
  };

  std::string describe(std::size_t total) const;

  // Enqueues the copies of rows [r0, r0 + R) of the step's output to pinned memory: the tokens
  // of rows sampled on the device, and the logits unless every row of the step was.
  std::string enqueue_fetch(Step& s, int r0, int R);

  // Hands the fetched rows over to the caller's arrays; with `device_s`, waits for the stream
  // first and adds the wait to it.
  std::string collect(Step& s, double* device_s);

  // Key splits for the decode kernel's one-token items (none in a step without them).
  int splits_for(int single_items) const;
  std::string allocate_activations();
  std::string allocate_kv(std::int64_t blocks, DeviceBuffer* arena);

  // Lays the step's metadata out in the pinned staging region. `bucket` > 0: a decode graph of
  // that many sequences (padding has slot -1, position 0 and block table row 0).
  std::string stage(const StepInput& in, int bucket);

  // items: the item arrays (token, count, sequence), the first num_single of one token each.
  std::string enqueue_layers(int T, const char* items, int num_items, int num_single);
  std::string enqueue_head(const std::int32_t* rows, int R, const SampleSpec* specs);

  // cuBLASLt plans of every product's buckets of token counts (Gemm::prepare), so that no step
  // queries a heuristic; each bucket's algorithm timed on layer 0's weights and the activation
  // buffers the step uses.
  std::string prepare_gemms();

  // Rank 0 (the only one at TP 1) has the whole logits and hands the step's results back.
  bool sampling_on(const StepInput& in) const { return rank_ == 0 && o_.device_sampling && in.sample && in.sampled_tokens && in.num_rows > 0; }
  std::string plan_rank(const PlanOptions& o, MemoryPlan* out);

  // Sequences of `seq_len` pseudo-random tokens filling `tokens`, one logits row each.
  std::string run_dummy(int tokens, int seq_len);
  std::string capture_graphs();
  std::string set_scales(const PlanOptions& o);
  std::string swap(const std::int32_t* blocks, char* const* host, int n, bool to_host) override;

  int device_;
  ModelDims d_;
  Act act_;
  // Tensor parallelism (create_device_model): the group, this rank, its embedding / LM head rows.
  std::shared_ptr<TpGroup> tp_;
  int rank_ = 0;
  std::int64_t vocab_begin_ = 0, vocab_rows_ = 0;
  DeviceBuffer tp_sum_;  // the all-reduced o_proj / down output (float32), which the next norm adds
  Kv kv_ = Kv::kF32;
  PlanOptions o_;
  cudaStream_t stream_ = nullptr;
  int sms_ = 1;
  std::uint64_t weight_bytes_ = 0, activation_bytes_ = 0, graph_bytes_ = 0;
  DeviceBuffer embed_, final_norm_, lm_head_, inv_freq_;
  std::vector<LayerBuffers> layers_;
  DeviceBuffer x_, h_, qkv_, q_, attn_, out_, gu_, mlp_in_, hrows_, logits_, partial_, kv_ptrs_, k_scale_, v_scale_, amax_, meta_, decode_items_;
  DeviceBuffer tmp_kv_, kv_arena_, sampled_, swap_meta_, fold_ss_;
  DeviceBuffer fp8_xq_, fp8_xs_;  // fp8_weights: a product's input quantized per token (Gemm::set_fp8_scratch)
  // Constrained decoding: the masked rows' indices, then their masks (supply_masks), staged in
  // pinned memory and copied in one piece.
  DeviceBuffer masks_;
  void* mask_stage_ = nullptr;
  std::size_t mask_words_ = 0, mask_rows_off_ = 0;
  std::vector<char> swap_stage_;
  Gemm gemm_;
  void* stage_ = nullptr;
  void* upload_stage_ = nullptr;            // set_weight's two pinned halves, freed by plan()
  cudaEvent_t upload_done_[2] = {nullptr, nullptr};  // each half's last copy to the device
  float* host_logits_ = nullptr;
  std::int32_t* host_tokens_ = nullptr;
  std::size_t off_slots_ = 0, off_tokens_ = 0, off_pos_ = 0, off_item_tok_ = 0, off_item_cnt_ = 0, off_item_seq_ = 0, off_rows_ = 0, off_sample_ = 0,
              off_stride_ = 0, off_tables_ = 0, staged_bytes_ = 0;
  int max_tokens_ = 0, max_seqs_ = 0, max_blocks_per_seq_ = 0, num_items_ = 0;
  std::int64_t max_model_len_ = 0, num_blocks_ = 0, kv_blocks_now_ = 1;
  int num_single_ = 0;  // of the staged items, the one-token ones (they come first)
  bool calibrating_ = false, host_rows_ = false;
  int steps_ = 0;  // forward() calls of the kind PlanOptions::profile_step counts
  // prepare / launch / finish: the step prepared, the one in flight; the staging region's copy
  // (staged_event_) and the step's end (done_event_).
  Step next_, inflight_;
  bool prepared_ = false, launched_ = false, staged_pending_ = false;
  cudaEvent_t staged_event_ = nullptr, done_event_ = nullptr;
  std::vector<int> buckets_;
  std::map<int, cudaGraphExec_t> graphs_;
  std::vector<float> k_scales_host_, v_scales_host_;
  StepReport report_;  // PlanOptions::step_report
};

}  // namespace lmserve::cuda
