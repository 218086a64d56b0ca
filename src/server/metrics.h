// Prometheus text exposition of the server's metrics: vLLM's names (so dashboards and the
// Gateway API Inference Extension work unchanged) plus lmserve's own under "lmserve:".
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backend/device/device_memory.h"
#include "common/prometheus.h"
#include "engine/engine.h"

namespace lmserve::server {

using prometheus::Histogram;

struct RequestRecord {
  double queue_s = 0, ttft_s = 0, e2e_s = 0;
  std::vector<double> itl_s;
  std::int64_t prompt_tokens = 0, generation_tokens = 0;
  std::string finish_reason;
  std::string lane;  // the lane's name: per-lane histograms for lanes declared
};

// lmserve:startup_seconds{model_name, phase} (common/startup.h), when any phase is done: in the
// server's /metrics, and alone in the one it answers while starting.
void render_startup_seconds(std::string& out, const std::string& model_name);

class ServerMetrics {
 public:
  ServerMetrics();
  void record_request(const RequestRecord& r);
  void record_http(const std::string& route, int status);
  void record_rejection(const std::string& reason, const std::string& lane);
  // Exports lmserve:admission_rejections_total at 0 for every rejection reason on each of
  // these lanes from now on, so that rate() and alerts see the first rejection; the per-lane
  // latency histograms (TTFT, time per output token, queue time) and the lanes' targets too.
  void declare_lanes(const std::vector<engine::LaneOptions>& lanes);
  // `plan` and `gpus` add the memory plan and per-GPU memory (lmserve:memory_plan_bytes,
  // lmserve:gpu_memory_used_bytes / _total_bytes) where there are any.
  std::string render(const engine::EngineStats& s, const std::string& model_name, double kv_watermark, int block_size,
                     const std::string& kv_dtype, const backend::MemoryInfo& plan = {},
                     const std::vector<GpuMemorySample>& gpus = {}) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, itl_, e2e_, queue_, prompt_tokens_, generation_tokens_;
  std::map<std::string, std::uint64_t> finished_;                       // finished_reason -> count
  std::map<std::pair<std::string, int>, std::uint64_t> http_;           // (route, status)
  std::map<std::pair<std::string, std::string>, std::uint64_t> rejected_;  // (reason, lane)
  struct LaneHistograms {
    engine::LaneOptions options;
    Histogram ttft, tpot, queue;
  };
  std::vector<LaneHistograms> lanes_;  // in lane order
};

// Resident set size of this process in bytes (0 if unknown).
std::uint64_t process_resident_bytes();

}  // namespace lmserve::server
