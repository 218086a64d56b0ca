#include "server/metrics.h"

#include "common/prometheus.h"
#include "common/startup.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <tuple>

namespace lmserve::server {

using prometheus::escape;
using prometheus::header;
using prometheus::latency_buckets;
using prometheus::num;
using prometheus::token_buckets;

ServerMetrics::ServerMetrics()
    : ttft_(latency_buckets()), itl_(latency_buckets()), e2e_(latency_buckets()), queue_(latency_buckets()),
      prompt_tokens_(token_buckets()), generation_tokens_(token_buckets()) {}

void ServerMetrics::record_request(const RequestRecord& r) {
  std::lock_guard lock(mu_);
  queue_.observe(r.queue_s);
  if (r.generation_tokens > 0) ttft_.observe(r.ttft_s);
  for (double x : r.itl_s) itl_.observe(x);
  e2e_.observe(r.e2e_s);
  prompt_tokens_.observe(static_cast<double>(r.prompt_tokens));
  generation_tokens_.observe(static_cast<double>(r.generation_tokens));
  ++finished_[r.finish_reason];
  for (auto& l : lanes_) {
    if (l.options.name != r.lane) continue;
    l.queue.observe(r.queue_s);
    if (r.generation_tokens > 0) l.ttft.observe(r.ttft_s);
    // Time per output token as vLLM defines it: the tokens after the first over the time after it.
    if (r.generation_tokens > 1) l.tpot.observe((r.e2e_s - r.ttft_s) / static_cast<double>(r.generation_tokens - 1));
  }
}

void ServerMetrics::record_http(const std::string& route, int status) {
  std::lock_guard lock(mu_);
  ++http_[{route, status}];
}

void ServerMetrics::record_rejection(const std::string& reason, const std::string& lane) {
  std::lock_guard lock(mu_);
  ++rejected_[{reason, lane}];
}

void ServerMetrics::declare_lanes(const std::vector<engine::LaneOptions>& lanes) {
  std::lock_guard lock(mu_);
  for (const auto& lane : lanes) {
    for (engine::Rejection r : engine::kAllRejections) rejected_.try_emplace({std::string(engine::rejection_name(r)), lane.name}, 0);
    lanes_.push_back({lane, Histogram(latency_buckets()), Histogram(latency_buckets()), Histogram(latency_buckets())});
  }
}

void render_startup_seconds(std::string& out, const std::string& model_name) {
  const auto phases = startup_phases();
  if (phases.empty()) return;
  header(out, "lmserve:startup_seconds", "gauge", "Seconds each start-up phase took; total: from the process's start to ready.");
  for (const auto& [phase, seconds] : phases) {
    out += "lmserve:startup_seconds{model_name=\"" + escape(model_name) + "\",phase=\"" + escape(phase) + "\"} " + num(seconds) + "\n";
  }
}

std::string ServerMetrics::render(const engine::EngineStats& s, const std::string& model, double watermark, int block_size,
                                  const std::string& kv_dtype, const backend::MemoryInfo& plan,
                                  const std::vector<GpuMemorySample>& gpus) const {
  std::lock_guard lock(mu_);
  const std::string m = "model_name=\"" + escape(model) + "\"";
  std::string out;
  auto gauge = [&](const std::string& name, const char* help, double v) {
    header(out, name, "gauge", help);
    out += name + "{" + m + "} " + num(v) + "\n";
  };
  auto counter = [&](const std::string& name, const char* help, double v) {
    header(out, name, "counter", help);
    out += name + "{" + m + "} " + num(v) + "\n";
  };
  std::int64_t waiting = 0;
  for (const auto& [lane, n] : s.waiting_per_lane) waiting += n;
  gauge("vllm:num_requests_running", "Number of requests in model execution batches.", static_cast<double>(s.running));
  gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", static_cast<double>(waiting));
  gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_usage);
  gauge("vllm:gpu_cache_usage_perc", "KV-cache usage (older name of vllm:kv_cache_usage_perc).", s.kv_usage);
  counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", static_cast<double>(s.prompt_tokens_total));
  counter("vllm:generation_tokens_total", "Number of generation tokens processed.", static_cast<double>(s.generation_tokens_total));
  counter("vllm:num_preemptions_total", "Cumulative number of preemptions.", static_cast<double>(s.preemptions_total));
  gauge("vllm:num_requests_swapped", "Preempted requests whose KV cache waits in host memory (the swap space).", static_cast<double>(s.swapped));
  gauge("vllm:cpu_cache_usage_perc", "Share of the swap space's blocks in use. 1 means 100 percent usage.", s.host_kv_usage);
  const std::tuple<const char*, double, double> swaps[] = {{"out", static_cast<double>(s.swap_outs_total), static_cast<double>(s.swap_bytes_out_total)},
                                                          {"in", static_cast<double>(s.swap_ins_total), static_cast<double>(s.swap_bytes_in_total)}};
  header(out, "lmserve:kv_swaps_total", "counter", "Requests whose KV cache moved to host memory on preemption (out) or back when resumed (in).");
  for (const auto& [dir, n, bytes] : swaps) out += "lmserve:kv_swaps_total{" + m + ",direction=\"" + dir + "\"} " + num(n) + "\n";
  header(out, "lmserve:kv_swap_bytes_total", "counter", "Bytes of KV cache moved to host memory (out) and back (in).");
  for (const auto& [dir, n, bytes] : swaps) out += "lmserve:kv_swap_bytes_total{" + m + ",direction=\"" + dir + "\"} " + num(bytes) + "\n";
  counter("lmserve:engine_steps_total", "Engine steps run.", static_cast<double>(s.steps_total));
  counter("lmserve:nonfinite_logits_rows_total", "Rows whose logits held NaN or infinity; each ended its request with an error.",
          static_cast<double>(s.nonfinite_rows_total));
  counter("lmserve:engine_forward_seconds_total",
          "Time engine steps spent in the backend launching and waiting for the forward pass (less than the device's with asynchronous scheduling).",
          s.forward_seconds_total);
  counter("lmserve:engine_steps_planned_ahead_total", "Engine steps planned while the step before ran on the device (asynchronous scheduling).",
          static_cast<double>(s.steps_planned_ahead_total));
  counter("lmserve:engine_host_seconds_total", "Time engine steps spent on the host: scheduling, inputs, sampling, outputs.",
          s.host_seconds_total);
  header(out, "lmserve:engine_host_phase_seconds_total", "counter", "Host time of engine steps by phase (they sum to lmserve:engine_host_seconds_total).");
  for (const auto& [phase, v] : {std::pair{"schedule", s.host_phases.schedule}, {"inputs", s.host_phases.inputs}, {"relock", s.host_phases.relock},
                                 {"sample", s.host_phases.sample}, {"outputs", s.host_phases.outputs}}) {
    out += "lmserve:engine_host_phase_seconds_total{" + m + ",phase=\"" + phase + "\"} " + num(v) + "\n";
  }
  counter("lmserve:engine_forward_staging_seconds_total",
          "Of the forward time, what the backend spent on the host staging and launching steps rather than waiting for the device.",
          s.forward_staging_seconds_total);
  counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
          static_cast<double>(s.prefix_queries));
  counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", static_cast<double>(s.prefix_hits));
  header(out, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    auto it = finished_.find(reason);
    out += "vllm:request_success_total{" + m + ",finished_reason=\"" + reason + "\"} " +
           std::to_string(it == finished_.end() ? 0 : it->second) + "\n";
  }
  auto hist = [&](const std::string& name, const char* help, const Histogram& h) {
    header(out, name, "histogram", help);
    h.render(out, name, m);
  };
  hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttft_);
  hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itl_);
  hist("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", e2e_);
  hist("vllm:request_queue_time_seconds", "Histogram of time spent waiting in the queue in seconds.", queue_);
  hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", prompt_tokens_);
  hist("vllm:request_generation_tokens", "Number of generation tokens processed.", generation_tokens_);
  header(out, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig.");
  out += "vllm:cache_config_info{" + m + ",block_size=\"" + std::to_string(block_size) + "\",cache_dtype=\"" + escape(kv_dtype) +
         "\",num_gpu_blocks=\"" + std::to_string(s.kv_blocks_total) + "\",num_cpu_blocks=\"" + std::to_string(s.host_kv_blocks_total) + "\"} 1\n";

  header(out, "lmserve:num_requests_waiting_lane", "gauge", "Requests waiting, per lane.");
  for (const auto& [lane, n] : s.waiting_per_lane) {
    out += "lmserve:num_requests_waiting_lane{" + m + ",lane=\"" + escape(lane) + "\"} " + std::to_string(n) + "\n";
  }
  header(out, "lmserve:lane_queue_capacity", "gauge", "How many requests each lane's queue holds before it refuses (429).");
  for (const auto& l : lanes_) {
    out += "lmserve:lane_queue_capacity{" + m + ",lane=\"" + escape(l.options.name) + "\"} " + std::to_string(l.options.max_queued) + "\n";
  }
  header(out, "lmserve:num_requests_running_lane", "gauge", "Requests running, per lane.");
  for (const auto& [lane, n] : s.running_per_lane) {
    out += "lmserve:num_requests_running_lane{" + m + ",lane=\"" + escape(lane) + "\"} " + std::to_string(n) + "\n";
  }
  auto lane_hist = [&](const std::string& name, const char* help, Histogram LaneHistograms::*h) {
    header(out, name, "histogram", help);
    for (const auto& l : lanes_) (l.*h).render(out, name, m + ",lane=\"" + escape(l.options.name) + "\"");
  };
  lane_hist("lmserve:lane_time_to_first_token_seconds", "Time to first token in seconds, per lane.", &LaneHistograms::ttft);
  lane_hist("lmserve:lane_time_per_output_token_seconds", "Time per output token after the first in seconds, per lane.",
            &LaneHistograms::tpot);
  lane_hist("lmserve:lane_request_queue_time_seconds", "Time spent waiting in the queue in seconds, per lane.", &LaneHistograms::queue);
  header(out, "lmserve:lane_latency_target_seconds", "gauge", "Each lane's latency targets (--lanes ttft=, tpot=); 0: none.");
  for (const auto& l : lanes_) {
    for (const auto& [kind, v] : {std::pair{"ttft", l.options.ttft_target_s}, {"tpot", l.options.tpot_target_s}}) {
      out += "lmserve:lane_latency_target_seconds{" + m + ",lane=\"" + escape(l.options.name) + "\",target=\"" + kind + "\"} " + num(v) + "\n";
    }
  }
  header(out, "lmserve:lane_tpot_target_unmet_steps_total", "counter",
         "Steps predicted over a lane's TPOT target by work the scheduler may not cut (its decodes, its own and earlier lanes' prefills).");
  for (const auto& [lane, n] : s.tpot_unmet_steps) {
    out += "lmserve:lane_tpot_target_unmet_steps_total{" + m + ",lane=\"" + escape(lane) + "\"} " + std::to_string(n) + "\n";
  }
  header(out, "lmserve:step_time_model_seconds", "gauge",
         "The scheduler's step-time model: seconds per step, per new token, per sequence, per KV token read and per prefill query-key pair.");
  for (std::size_t i = 0; i < s.step_time_model.size(); ++i) {
    static constexpr const char* kTerms[] = {"step", "token", "sequence", "kv_token", "attention"};
    out += "lmserve:step_time_model_seconds{" + m + ",term=\"" + kTerms[i] + "\"} " + num(s.step_time_model[i]) + "\n";
  }
  header(out, "lmserve:admission_rejections_total", "counter", "Requests refused at submission, by reason and lane.");
  for (const auto& [key, n] : rejected_) {
    out += "lmserve:admission_rejections_total{" + m + ",reason=\"" + escape(key.first) + "\",lane=\"" + escape(key.second) + "\"} " +
           std::to_string(n) + "\n";
  }
  header(out, "lmserve:admission_limit_episodes_total", "counter", "Episodes of admission stopped by a memory limit.");
  for (const auto& [reason, n] : s.admission_limits) {
    out += "lmserve:admission_limit_episodes_total{" + m + ",reason=\"" + reason + "\"} " + std::to_string(n) + "\n";
  }
  gauge("lmserve:kv_watermark", "Admission watermark on KV-cache usage.", watermark);
  gauge("lmserve:engine_alive", "1 while the engine loop runs.", s.alive ? 1.0 : 0.0);
  gauge("lmserve:process_resident_memory_bytes", "Resident memory of the server process.", static_cast<double>(process_resident_bytes()));
  header(out, "lmserve:memory_plan_bytes", "gauge", "The start-up memory plan: bytes for each part.");
  for (auto [part, bytes] : {std::pair<const char*, std::uint64_t>{"weights", plan.weight_bytes}, {"activations", plan.activation_bytes},
                             {"cuda_graphs", plan.graph_bytes}, {"kv_cache", plan.kv_cache_bytes}}) {
    out += "lmserve:memory_plan_bytes{" + m + ",part=\"" + part + "\"} " + num(static_cast<double>(bytes)) + "\n";
  }
  render_startup_seconds(out, model);
  if (!gpus.empty()) {
    header(out, "lmserve:gpu_memory_used_bytes", "gauge", "Memory in use on each GPU (all processes), sampled every 100 ms.");
    for (const auto& g : gpus) {
      out += "lmserve:gpu_memory_used_bytes{" + m + ",gpu=\"" + std::to_string(g.device) + "\",source=\"" + g.source + "\"} " +
             num(static_cast<double>(g.used_bytes)) + "\n";
    }
    header(out, "lmserve:gpu_memory_total_bytes", "gauge", "Memory of each GPU.");
    for (const auto& g : gpus) {
      out += "lmserve:gpu_memory_total_bytes{" + m + ",gpu=\"" + std::to_string(g.device) + "\"} " + num(static_cast<double>(g.total_bytes)) + "\n";
    }
  }
  header(out, "lmserve:http_requests_total", "counter", "HTTP requests by route and status.");
  for (const auto& [key, n] : http_) {
    out += "lmserve:http_requests_total{" + m + ",route=\"" + escape(key.first) + "\",status=\"" + std::to_string(key.second) +
           "\"} " + std::to_string(n) + "\n";
  }
  return out;
}

std::uint64_t process_resident_bytes() {
  std::ifstream in("/proc/self/statm");
  std::uint64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace lmserve::server
