// Shared by the engine's end-to-end tests (engine_test.cpp, engine_kv_pressure_test.cpp): the
// backend under test (CPU, or CUDA with LMSERVE_TEST_BACKEND=cuda), engines over it, and a
// request's events collected.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/device/devices.h"
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

// The backend under test made asynchronous (Backend::asynchronous): each step runs on a thread
// of its own between launch() and wait(), and its greedy rows that the backend left to the host
// get the argmax of their logits (ties: the lowest id), as a device backend samples them. A
// random row left to the host fails the step: these tests use greedy rows only. Swaps wait for
// the step in flight, as a device stream orders them. The engine then plans each step while the
// one before runs.
class Asynchronous final : public Wrapping {
 public:
  using Wrapping::Wrapping;
  ~Asynchronous() override { join(); }
  std::string_view name() const override { return inner_->name(); }
  bool asynchronous() const override { return true; }
  Status forward(const backend::Batch& batch, std::span<float> logits) override {
    join();
    return run(batch, logits);
  }
  Status prepare(const backend::Batch& batch, std::span<float> logits) override {
    batch_ = batch;
    logits_ = logits;
    return Status::ok();
  }
  Status launch(std::span<const backend::TokenPatch> patches) override {
    join();
    for (const auto& p : patches) {
      if (p.index < 0 || static_cast<std::size_t>(p.index) >= batch_.tokens.size() || batch_.tokens[static_cast<std::size_t>(p.index)] != p.token) {
        return Status(StatusCode::kInternal, "async test backend: a patch the caller's tokens do not hold");
      }
    }
    ++launches_;
    // The worker has its own copy: the next batch may be prepared while it runs.
    worker_ = std::thread([this, b = batch_, l = logits_] { status_ = run(b, l); });
    return Status::ok();
  }
  Status wait() override {
    join();
    return std::exchange(status_, Status::ok());
  }
  Status swap_blocks(std::span<const backend::BlockCopy> to_host, std::span<const backend::BlockCopy> to_device) override {
    join();
    return inner_->swap_blocks(to_host, to_device);
  }
  int launches() const { return launches_; }

  // Masked rows (constrained decoding): the step is waited for here, then each masked greedy
  // row gets the argmax of its logits among the tokens of its mask.
  bool supports_masks() const override { return true; }
  Status supply_masks(std::span<const std::uint64_t> masks) override {
    join();
    const std::size_t vocab = static_cast<std::size_t>(config().vocab_size), words = backend::mask_words(config().vocab_size);
    std::size_t k = 0;
    for (std::size_t r = 0; r < batch_.sample_rows.size(); ++r) {
      const auto& rs = batch_.sample_rows[r];
      if (!rs.masked || rs.mode == backend::RowSampling::Mode::kHost) continue;
      if ((k + 1) * words > masks.size()) return Status(StatusCode::kInvalidArgument, "async test backend: too few masks");
      const float* row = logits_.data() + r * vocab;
      const std::uint64_t* m = masks.data() + k * words;
      std::int32_t best = -1;
      for (std::size_t t = 0; t < vocab; ++t) {
        if (((m[t >> 6] >> (t & 63)) & 1) && (best < 0 || row[t] > row[static_cast<std::size_t>(best)])) best = static_cast<std::int32_t>(t);
      }
      batch_.sampled_tokens[r] = best;
      ++k;
    }
    if (k * words != masks.size()) return Status(StatusCode::kInvalidArgument, "async test backend: masks for rows that are not masked");
    ++masked_steps_;
    return Status::ok();
  }
  int masked_steps() const { return masked_steps_; }

 private:
  void join() {
    if (worker_.joinable()) worker_.join();
  }
  Status run(const backend::Batch& b, std::span<float> logits) {
    // Masked rows are decided in supply_masks, from their logits: the inner backend leaves
    // them to the host (and so returns the logits, a device backend too).
    std::vector<backend::RowSampling> rows(b.sample_rows.begin(), b.sample_rows.end());
    for (auto& r : rows) {
      if (r.masked) r = backend::RowSampling{};
    }
    backend::Batch plain = b;
    plain.sample_rows = rows;
    LMSERVE_RETURN_IF_ERROR(inner_->forward(plain, logits));
    const std::size_t vocab = static_cast<std::size_t>(config().vocab_size);
    for (std::size_t k = 0; k < b.sample_rows.size() && k < b.sampled_tokens.size(); ++k) {
      if (b.sample_rows[k].mode == backend::RowSampling::Mode::kHost || b.sample_rows[k].masked || b.sampled_tokens[k] >= 0) continue;
      if (b.sample_rows[k].mode == backend::RowSampling::Mode::kRandom) {
        return Status(StatusCode::kInternal, "async test backend: random rows are not sampled here");
      }
      const float* row = logits.data() + k * vocab;
      b.sampled_tokens[k] = static_cast<std::int32_t>(std::max_element(row, row + vocab) - row);
    }
    return Status::ok();
  }
  backend::Batch batch_;
  std::span<float> logits_;
  std::thread worker_;
  Status status_;
  int launches_ = 0, masked_steps_ = 0;
};

// make_engine over the backend under test made Asynchronous (`out`: the wrapper, for counts).
inline std::unique_ptr<Engine> make_async_engine(const Loaded& m, std::int64_t blocks, EngineOptions o = {}, int block_size = 16,
                                                 const Asynchronous** out = nullptr) {
  if (o.scheduler.max_model_len == 2048) o.scheduler.max_model_len = 1024;
  auto b = make_backend(m, blocks, o.scheduler, block_size, backend::KvDtype::kFloat32);
  EXPECT_TRUE(b) << b.error().to_string();
  auto wrapper = std::make_unique<Asynchronous>(std::move(*b));
  if (out) *out = wrapper.get();
  auto e = Engine::create(std::move(wrapper), m.tokenizer, o);
  EXPECT_TRUE(e) << e.error().to_string();
  return std::move(*e);
}

}  // namespace lmserve::engine
