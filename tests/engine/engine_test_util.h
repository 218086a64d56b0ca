// Shared by the engine's end-to-end tests (engine_test.cpp, engine_kv_pressure_test.cpp): the
// backend under test (CPU, or CUDA with LMSERVE_TEST_BACKEND=cuda), engines over it, and a
// request's events collected.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/devices.h"
#include "engine/engine.h"
#include "test_paths.h"

namespace lmserve::engine {

struct Loaded {
  std::shared_ptr<const model::ModelWeights> weights;
  std::shared_ptr<const text::Tokenizer> tokenizer;
};

// LMSERVE_TEST_BACKEND=cuda runs these engine tests on the CUDA backend (float32 weights, so
// the transformers fixtures still apply); the default is the CPU reference.
inline bool on_cuda() {
  const char* b = std::getenv("LMSERVE_TEST_BACKEND");
  return b && std::string(b) == "cuda";
}

// LMSERVE_TEST_BACKEND=cuda on a machine without a usable GPU: every test skips, with the reason.
class CudaWanted final : public ::testing::Environment {
 public:
  void SetUp() override {
    if (!on_cuda()) return;
    auto probe = probe_devices();
    if (probe.devices.empty()) GTEST_SKIP() << "LMSERVE_TEST_BACKEND=cuda but no GPU: " << probe.reason;
  }
};
[[maybe_unused]] inline ::testing::Environment* const cuda_wanted = ::testing::AddGlobalTestEnvironment(new CudaWanted);

inline const Loaded& demo() {
  static Loaded l = [] {
    std::filesystem::path dir = lmserve::testing::source_dir() / "models/demo";
    model::LoadOptions lo;
    if (on_cuda()) lo.dtype = "float32";
    return Loaded{*model::ModelWeights::load(dir, lo), *text::Tokenizer::load(dir)};
  }();
  return l;
}

// The backend under test (CPU, or CUDA with LMSERVE_TEST_BACKEND=cuda) for the scheduler's limits.
inline Result<std::unique_ptr<backend::Backend>> make_backend(const Loaded& m, std::int64_t blocks, const SchedulerOptions& so, int block_size,
                                                       backend::KvDtype kv) {
  if (on_cuda()) {
    backend::CudaBackendOptions co;
    co.kv_dtype = kv;
    co.block_size = block_size;
    co.num_blocks = blocks;
    co.max_num_seqs = so.max_num_seqs;
    co.max_num_batched_tokens = std::max(so.max_num_batched_tokens, so.max_num_seqs);
    co.max_model_len = so.max_model_len;
    co.device_sampling = true;  // rows sampled on the device: these tests check it end to end
    return backend::make_cuda_backend(m.weights, co);
  }
  return backend::make_cpu_backend(m.weights, {.kv = {kv, block_size, blocks}, .threads = 2});
}

inline std::unique_ptr<Engine> make_engine(const Loaded& m, std::int64_t blocks, EngineOptions o = {}, int block_size = 16,
                                    backend::KvDtype kv = backend::KvDtype::kFloat32) {
  if (o.scheduler.max_model_len == 2048) o.scheduler.max_model_len = 1024;
  auto b = make_backend(m, blocks, o.scheduler, block_size, kv);
  EXPECT_TRUE(b) << b.error().to_string();
  auto e = Engine::create(std::move(*b), m.tokenizer, o);
  EXPECT_TRUE(e) << e.error().to_string();
  return std::move(*e);
}

struct Result {
  std::vector<std::int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  int finish_events = 0;
  std::string stop_reason;
  std::int64_t completion_tokens = 0;  // as the last event counts them
  std::vector<float> logprobs;
};

inline void add_event(Result* r, const StreamEvent& e) {
  r->tokens.insert(r->tokens.end(), e.token_ids.begin(), e.token_ids.end());
  r->text += e.text;
  for (const auto& lp : e.logprobs) r->logprobs.push_back(lp.logprob);
  r->completion_tokens = e.completion_tokens;
  if (e.finish != FinishReason::kNone) {
    r->finish = e.finish;
    r->stop_reason = e.stop_reason;
    ++r->finish_events;
  }
}

inline Result collect(const std::shared_ptr<RequestStream>& s) {
  Result r;
  StreamEvent e;
  while (s->next(&e)) add_event(&r, e);
  return r;
}

inline SamplingParams greedy(std::int64_t max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// A backend around another one, which answers everything but what a test changes.
class Wrapping : public backend::Backend {
 public:
  explicit Wrapping(std::unique_ptr<backend::Backend> inner) : inner_(std::move(inner)) {}
  const model::ModelConfig& config() const override { return inner_->config(); }
  const backend::KvCacheConfig& kv_config() const override { return inner_->kv_config(); }
  std::uint64_t kv_block_bytes() const override { return inner_->kv_block_bytes(); }
  backend::MemoryInfo memory() const override { return inner_->memory(); }
  Status set_host_blocks(std::int64_t n) override { return inner_->set_host_blocks(n); }
  Status swap_blocks(std::span<const backend::BlockCopy> to_host, std::span<const backend::BlockCopy> to_device) override {
    return inner_->swap_blocks(to_host, to_device);
  }
  std::uint64_t host_swap_bytes() const override { return inner_->host_swap_bytes(); }

 protected:
  std::unique_ptr<backend::Backend> inner_;
};

}  // namespace lmserve::engine
