// Runs the lmserve binary as a user would and checks exit codes and output.
#include <gtest/gtest.h>

#include <regex>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <future>
#include <thread>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/device/devices.h"
#include "test_paths.h"

namespace {

struct CommandRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

CommandRun run(const std::string& args) {
  std::string cmd = lmserve::testing::lmserve_binary() + " " + args + " 2>&1";
  CommandRun r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  while (std::size_t n = fread(buf.data(), 1, buf.size(), pipe)) r.output.append(buf.data(), n);
  int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(Cli, HelpListsEverySubcommand) {
  CommandRun r = run("--help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* sub : {"serve", "gateway", "bench", "plan", "generate", "tokenize", "detokenize",
                          "chat-template", "model", "version"}) {
    EXPECT_NE(r.output.find(std::string("  ") + sub), std::string::npos) << sub << "\n" << r.output;
  }
}

TEST(Cli, VersionPrintsBuildAndDevices) {
  CommandRun r = run("version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("lmserve 0.1.0 (commit "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cuda: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("devices: "), std::string::npos) << r.output;
  EXPECT_EQ(run("--version").output, "0.1.0\n");
}

// A binary configured with LMSERVE_JEMALLOC runs on jemalloc (the link could silently keep libc's
// malloc, say with --as-needed); one without runs on the C library's.
TEST(Cli, VersionNamesTheAllocatorItRunsOn) {
  CommandRun r = run("version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (LMSERVE_TEST_JEMALLOC) {
    EXPECT_NE(r.output.find("\nallocator: jemalloc 5."), std::string::npos) << r.output;
  } else {
    EXPECT_NE(r.output.find("\nallocator: libc malloc\n"), std::string::npos) << r.output;
  }
}

// The commit a binary reports is the one it was built from, also after commits built
// incrementally (the hash used to be taken when CMake configured the tree, and went stale).
TEST(Cli, VersionNamesTheCommitItWasBuiltFrom) {
  const auto src = lmserve::testing::source_dir();
  FILE* git = popen(("git -C '" + src.string() + "' rev-parse --short=12 HEAD 2>/dev/null").c_str(), "r");
  ASSERT_NE(git, nullptr);
  std::array<char, 64> buf{};
  const std::size_t n = fread(buf.data(), 1, buf.size(), git);
  const bool ok = pclose(git) == 0 && n >= 12;
  if (!ok) GTEST_SKIP() << "no git checkout at " << src;
  const std::string head(buf.data(), 12);
  CommandRun r = run("version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(r.output.find("(commit " + head + ",") != std::string::npos || r.output.find("(commit " + head + "-dirty,") != std::string::npos)
      << "HEAD is " << head << "\n" << r.output;
}

// Model integrity end to end: manifest, verify, activate, and serve --verify-model refusing a
// folder with one flipped byte (naming the file) before it loads anything.
TEST(Cli, ModelManifestVerifyActivateAndServeRefusesAFlippedByte) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("lmserve_cli_test_models_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path dir = root / "demo" / "v1";
  fs::create_directories(dir);
  fs::copy(lmserve::testing::source_dir() / "models/demo", dir, fs::copy_options::recursive);
  CommandRun r = run("model manifest " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("demo v1, "), std::string::npos) << r.output;  // name and version from the layout
  r = run("model verify " + dir.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("demo v1 verified"), std::string::npos) << r.output;
  r = run("model activate demo v1 --root " + root.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("current -> v1 (was none)"), std::string::npos) << r.output;
  {
    std::fstream f(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096);
    f.put('\x7f');
  }
  r = run("model verify " + dir.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("model.safetensors: SHA-256 differs"), std::string::npos) << r.output;
  r = run("serve --verify-model --port 0 --model " + (root / "demo" / "current").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("model.safetensors: SHA-256 differs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not starting"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("memory plan"), std::string::npos) << "nothing was to be loaded\n" << r.output;
  r = run("model verify " + root.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("no manifest"), std::string::npos) << r.output;
  fs::remove_all(root);
}

TEST(Cli, UsageErrorsExitTwo) {
  EXPECT_EQ(run("").exit_code, 2);
  EXPECT_EQ(run("no-such-command").exit_code, 2);
  CommandRun r = run("--log-level loud version");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("unknown log level 'loud'"), std::string::npos) << r.output;
  r = run("serve --port 0 --tool-call-parser pythonic --model " + (lmserve::testing::source_dir() / "models/demo").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--tool-call-parser must be hermes, llama3_json or mistral"), std::string::npos) << r.output;
  r = run("serve --port 0 --enable-auto-tool-choice --model " + (lmserve::testing::source_dir() / "models/demo").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--enable-auto-tool-choice needs --tool-call-parser"), std::string::npos) << r.output;
  r = run("serve --port 0 --device cpu --tensor-parallel-size 3 --model " + (lmserve::testing::source_dir() / "models/demo").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--tensor-parallel-size 3: does not divide the model's 4 attention heads"), std::string::npos) << r.output;
  r = run("generate --device cpu --tensor-parallel-all-reduce ring --prompt x --model " + (lmserve::testing::source_dir() / "models/demo").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--tensor-parallel-all-reduce: ring not in {peer,nccl}"), std::string::npos) << r.output;
}

std::string model_dir() { return (lmserve::testing::source_dir() / "models/demo").string(); }

std::string write_temp(const std::string& name, const std::string& content) {
  auto p = std::filesystem::temp_directory_path() / ("lmserve_cli_test_" + name);
  std::ofstream(p, std::ios::binary) << content;
  return p.string();
}

nlohmann::json read_fixture(const std::string& rel) {
  std::ifstream in(lmserve::testing::source_dir() / "tests/fixtures/text" / rel);
  return nlohmann::json::parse(in);
}

TEST(Cli, TokenizeMatchesHuggingFaceByteForByte) {
  auto corpus = read_fixture("corpus.json");
  auto fixture = read_fixture("tokenizers/demo.json");
  for (std::size_t i = 0; i < corpus.size(); i += 15) {  // a spread of the corpus, through stdin
    std::string file = write_temp("tok.txt", corpus[i].get<std::string>());
    CommandRun r = run("tokenize --model " + model_dir() + " - < " + file);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(nlohmann::json::parse(r.output), fixture["cases"][i]["ids"]) << corpus[i];
    r = run("tokenize --no-special --model " + model_dir() + " - < " + file);
    EXPECT_EQ(nlohmann::json::parse(r.output), fixture["cases"][i]["ids_no_special"]) << corpus[i];
  }
}

TEST(Cli, DetokenizePrintsTheExactText) {
  auto fixture = read_fixture("tokenizers/demo.json");
  const auto& c = fixture["cases"][3];
  std::string args;
  for (const auto& id : c["ids"]) {
    args += ' ';
    args += std::to_string(id.get<int>());
  }
  CommandRun r = run("detokenize --model " + model_dir() + args);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output, c["decoded"].get<std::string>());
  EXPECT_EQ(run("detokenize --model " + model_dir() + " 12 x").exit_code, 2);
}

TEST(Cli, ChatTemplatePrintsTheExactPrompt) {
  auto fixture = read_fixture("chat_templates/demo.json");
  for (const auto& c : fixture["cases"]) {
    std::string messages = write_temp("messages.json", c["messages"].dump());
    std::string cmd = "chat-template --model " + model_dir() + " --messages " + messages;
    if (c["add_generation_prompt"].get<bool>()) cmd += " --add-generation-prompt";
    if (c.contains("tools")) cmd += " --tools " + write_temp("tools.json", c["tools"].dump());
    CommandRun r = run(cmd);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output, c["rendered"].get<std::string>()) << c["name"];
  }
}

TEST(Cli, GeneratePrintsTheGreedyCompletion) {
  std::ifstream in(lmserve::testing::source_dir() / "tests/fixtures/reference/demo.json");
  auto ref = nlohmann::json::parse(in);
  const auto& c = ref["cases"][0];  // "The hacker"
  CommandRun r = run("generate --model " + model_dir() + " --prompt '" + c["text"].get<std::string>() +
                     "' --temperature 0 --max-tokens 32 --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string expected = c["greedy_text"];  // decoded with special tokens; generate leaves them out
  for (const std::string special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    for (auto p = expected.find(special); p != std::string::npos; p = expected.find(special)) expected.erase(p, special.size());
  }
  EXPECT_EQ(r.output, expected);
  EXPECT_GT(r.output.size(), 10u);
  // Two ranks on the CPU (issue #36): the same text; a size that does not divide the heads: 2.
  r = run("generate --model " + model_dir() + " --device cpu --tensor-parallel-size 2 --prompt '" + c["text"].get<std::string>() +
          "' --temperature 0 --max-tokens 32 --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, expected);
  r = run("generate --model " + model_dir() + " --device cpu --tensor-parallel-size 3 --prompt hi");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--tensor-parallel-size 3: does not divide the model's 4 attention heads"), std::string::npos) << r.output;
  EXPECT_EQ(run("generate --model " + model_dir() + " --prompt hi --top-p 7").exit_code, 2);
  // --device cuda: a clear runtime failure where no GPU can be used, the completion where one can.
  EXPECT_EQ(run("generate --model " + model_dir() + " --prompt hi --device cuda").exit_code, lmserve::probe_devices().devices.empty() ? 1 : 0);
}

// Progress (common/progress.h): with stderr not a terminal, a run shorter than the log interval
// logs only its last line; --no-progress (before or after the subcommand) none.
TEST(Cli, BenchesLogTheirProgressUnlessTurnedOff) {
  CommandRun thr = run("bench throughput --model " + model_dir() + " --device cpu --num-prompts 6 --input-len 16 --output-len 5 --threads 2");
  ASSERT_EQ(thr.exit_code, 0) << thr.output;
  EXPECT_TRUE(std::regex_search(thr.output, std::regex(R"(info  bench throughput  done: 6 requests in [0-9.]+ s \([0-9.]+/s\)  output [0-9]+ tok/s\n)")))
      << thr.output;
  CommandRun lat = run("bench latency --model " + model_dir() + " --device cpu --batch-size 1 --input-len 4 --output-len 5 --threads 2");
  ASSERT_EQ(lat.exit_code, 0) << lat.output;
  EXPECT_TRUE(std::regex_search(lat.output, std::regex(R"(info  bench latency  done: 4 steps in [0-9.]+ s)"))) << lat.output;
  for (const char* cmd : {"--no-progress bench throughput", "bench throughput --no-progress"}) {
    CommandRun quiet = run(std::string(cmd) + " --model " + model_dir() + " --device cpu --num-prompts 2 --input-len 8 --output-len 2 --threads 2");
    ASSERT_EQ(quiet.exit_code, 0) << quiet.output;
    EXPECT_EQ(quiet.output.find("bench throughput  done"), std::string::npos) << quiet.output;
    EXPECT_NE(quiet.output.find("requests 2, prompt tokens 16, output tokens 4,"), std::string::npos) << quiet.output;
  }
}

TEST(Cli, BenchLatencyAndThroughputReportTheirNumbers) {
  CommandRun lat = run("bench latency --model " + model_dir() + " --device cpu --batch-size 2 --input-len 16 --output-len 8 --threads 2");
  ASSERT_EQ(lat.exit_code, 0) << lat.output;
  EXPECT_TRUE(std::regex_search(lat.output, std::regex(R"(prefill [0-9.]+ ms)"))) << lat.output;
  EXPECT_TRUE(std::regex_search(lat.output, std::regex(R"(decode step: mean [0-9.]+ ms, p50 [0-9.]+ ms, p99 [0-9.]+ ms)"))) << lat.output;
  // The CPU backend is not asynchronous: no step is staged during the one before, either way.
  for (const char* flag : {" --async-scheduling", " --no-async-scheduling"}) {
    CommandRun l = run("bench latency --model " + model_dir() + " --device cpu --batch-size 1 --input-len 4 --output-len 3 --threads 2" + flag);
    ASSERT_EQ(l.exit_code, 0) << l.output;
    EXPECT_TRUE(std::regex_search(l.output, std::regex(R"(output tokens/s\n)"))) << l.output;
  }
  CommandRun thr = run("bench throughput --model " + model_dir() + " --device cpu --num-prompts 6 --input-len 16 --output-len 5 --threads 2");
  ASSERT_EQ(thr.exit_code, 0) << thr.output;
  // Exactly num_prompts x output_len tokens (ignore_eos), counted from the engine's usage.
  EXPECT_NE(thr.output.find("requests 6, prompt tokens 96, output tokens 30,"), std::string::npos) << thr.output;
  EXPECT_TRUE(std::regex_search(thr.output, std::regex(R"(throughput: [0-9.]+ requests/s, [0-9.]+ output tokens/s)"))) << thr.output;
  // The model FLOPs line (bench::model_flops, tested by hand in tests/bench), no matrix rate on the CPU.
  EXPECT_TRUE(std::regex_search(thr.output, std::regex(R"(model FLOPs: [0-9.e+-]+ TFLOP \(matmul [0-9.e+-]+, attention [0-9.e+-]+\) in [0-9.]+ s = [0-9.e+-]+ TFLOP/s\n)")))
      << thr.output;
  EXPECT_EQ(run("bench latency --model " + model_dir() + " --device cpu --output-len 1").exit_code, 2);
  // Unset batch limits are the device's defaults (vLLM's rule); set ones are used as given.
  EXPECT_NE(thr.output.find("batch limits: 256 sequences, 8192 tokens per step (defaults for this device)"), std::string::npos) << thr.output;
  CommandRun set = run("bench throughput --model " + model_dir() +
                       " --device cpu --num-prompts 2 --input-len 8 --output-len 2 --threads 2 --max-num-seqs 3 --max-num-batched-tokens 40");
  ASSERT_EQ(set.exit_code, 0) << set.output;
  EXPECT_NE(set.output.find("batch limits: 3 sequences, 40 tokens per step\n"), std::string::npos) << set.output;
  EXPECT_EQ(run("bench throughput --model " + model_dir() + " --device cpu --num-prompts 2 --max-num-seqs -1").exit_code, 2);
  // Asynchronous scheduling's switch parses either way; the CPU backend is not asynchronous, so
  // no step is planned ahead, and the per-step line says so.
  for (const char* flag : {"", " --async-scheduling", " --no-async-scheduling"}) {
    CommandRun a = run("bench throughput --model " + model_dir() + " --device cpu --num-prompts 2 --input-len 8 --output-len 2 --threads 2" + flag);
    ASSERT_EQ(a.exit_code, 0) << a.output;
    EXPECT_TRUE(std::regex_search(a.output, std::regex(R"(planned ahead 0 of [1-9][0-9]* steps\n)"))) << a.output;
  }
  // Four requests of 2 blocks at the end in a pool of 6: by the prompt alone they all start and
  // one is preempted; with the remaining output reserved (--kv-growth-reserve 1) none is.
  const std::string small = "bench throughput --model " + model_dir() +
                            " --device cpu --threads 2 --num-prompts 4 --input-len 16 --output-len 16 --num-kv-blocks 6 --kv-growth-reserve ";
  for (const char* reserve : {"0", "1"}) {
    CommandRun g = run(small + reserve);
    ASSERT_EQ(g.exit_code, 0) << g.output;
    EXPECT_NE(g.output.find("output tokens 64,"), std::string::npos) << g.output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(g.output, m, std::regex(R"(preemptions ([0-9]+))"))) << g.output;
    EXPECT_EQ(m[1].str() == "0", std::string(reserve) == "1") << g.output;
  }
  EXPECT_EQ(run(small + "1.5").exit_code, 2);
}

// vLLM's defaults by device: large non-A100 GPUs get the big batch, the rest and the CPU less.
TEST(BatchDefaults, FollowVllmsRuleByDevice) {
  using lmserve::BatchLimits;
  using lmserve::BatchUsage;
  using lmserve::DeviceInfo;
  auto limits = [](const DeviceInfo* d, BatchUsage u) {
    BatchLimits b = lmserve::default_batch_limits(d, u);
    return std::pair(b.max_num_seqs, b.max_num_batched_tokens);
  };
  using Limits = std::pair<std::int64_t, std::int64_t>;
  constexpr std::uint64_t GiB = 1024ull * 1024 * 1024;
  const DeviceInfo h200{.name = "NVIDIA H200", .total_bytes = 140 * GiB}, h100{.name = "NVIDIA H100 80GB HBM3", .total_bytes = 80 * GiB - GiB / 2};
  const DeviceInfo a100{.name = "NVIDIA A100-SXM4-80GB", .total_bytes = 80 * GiB - GiB / 2}, l40s{.name = "NVIDIA L40S", .total_bytes = 45 * GiB};
  const DeviceInfo edge{.name = "Some GPU", .total_bytes = 70 * GiB}, below{.name = "Some GPU", .total_bytes = 70 * GiB - 1};
  EXPECT_EQ(limits(&h200, BatchUsage::kOffline), Limits(1024, 16384));
  EXPECT_EQ(limits(&h200, BatchUsage::kServer), Limits(1024, 8192));
  EXPECT_EQ(limits(&h100, BatchUsage::kOffline), Limits(1024, 16384));
  EXPECT_EQ(limits(&edge, BatchUsage::kServer), Limits(1024, 8192));
  EXPECT_EQ(limits(&below, BatchUsage::kServer), Limits(256, 2048));
  EXPECT_EQ(limits(&a100, BatchUsage::kOffline), Limits(256, 8192));
  EXPECT_EQ(limits(&a100, BatchUsage::kServer), Limits(256, 2048));
  EXPECT_EQ(limits(&l40s, BatchUsage::kOffline), Limits(256, 8192));
  EXPECT_EQ(limits(nullptr, BatchUsage::kOffline), Limits(256, 8192));
  EXPECT_EQ(limits(nullptr, BatchUsage::kServer), Limits(64, 2048));
}

// The seed's lesson in the engine benchmark: a log-normal length mix next to the uniform run of
// the same mean lengths, and the ratio printed; the mix's token counts are the dataset's.
TEST(Cli, BenchThroughputComparesAMixedRunWithTheUniformOne) {
  CommandRun r = run("bench throughput --model " + model_dir() +
                     " --device cpu --threads 2 --num-prompts 8 --dataset-name mixed --mixed-input-median 24 --mixed-output-median 6"
                     " --mixed-max-input-len 96 --mixed-max-output-len 16 --compare-uniform --seed 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(==== mixed[^\n]*\nrequests 8, prompt tokens ([0-9]+), output tokens ([0-9]+),)"))) << r.output;
  const int prompt = std::stoi(m[1]), output = std::stoi(m[2]);
  EXPECT_GE(prompt, 8 * 4);  // lengths are clipped to [4, max]
  EXPECT_LE(prompt, 8 * 96);
  EXPECT_LE(output, 8 * 16);
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(==== uniform: ([0-9]+) in / ([0-9]+) out[^\n]*\nrequests 8, prompt tokens ([0-9]+), output tokens ([0-9]+),)")))
      << r.output;
  EXPECT_EQ(std::stoi(m[3]), 8 * std::stoi(m[1]));
  EXPECT_EQ(std::stoi(m[4]), 8 * std::stoi(m[2]));
  EXPECT_NEAR(std::stod(m[1]), prompt / 8.0, 0.5) << "the uniform run has the mix's mean lengths";
  EXPECT_NEAR(std::stod(m[2]), output / 8.0, 0.5);
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(mixed lengths reach [0-9.]+% of the uniform run's output tokens/s)"))) << r.output;
  EXPECT_EQ(run("bench throughput --model " + model_dir() + " --device cpu --compare-uniform").exit_code, 2);
  EXPECT_EQ(run("bench throughput --model " + model_dir() + " --device cpu --dataset-name zipf").exit_code, 2);
}

TEST(Cli, PerplexityPrintsItLast) {
  std::string file = write_temp("ppl.txt", "The quick brown fox jumps over the lazy dog. 床前明月光，疑是地上霜。");
  CommandRun r = run("perplexity --model " + model_dir() + " --file " + file + " --context 16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto pos = r.output.rfind("perplexity ");
  ASSERT_NE(pos, std::string::npos) << r.output;
  double ppl = std::stod(r.output.substr(pos + 11));
  EXPECT_GT(ppl, 1.0);
  EXPECT_LT(ppl, 6000.0);
  EXPECT_NE(run("perplexity --model " + model_dir() + " --file /nonexistent").exit_code, 0);
  // --documents: blank-line separated documents, each scored alone and closed by <|endoftext|>
  // (one window each; a blank-only tail is no document).
  std::string docs = write_temp("docs.txt", "The quick brown fox.\n\n床前明月光，疑是地上霜。\n\n  \n");
  CommandRun d = run("perplexity --model " + model_dir() + " --file " + docs + " --documents");
  ASSERT_EQ(d.exit_code, 0) << d.output;
  EXPECT_NE(d.output.find("windows 2,"), std::string::npos) << d.output;
}

// A raw HTTP exchange with Connection: close; returns the whole response ("" if refused).
std::string http_exchange(int port, const std::string& request) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return "";
  }
  (void)!write(fd, request.data(), request.size());
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  close(fd);
  return out;
}

std::string post_request(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

// `lmserve serve --model <demo> --port 0 --max-model-len 1024 <args>` in a child process, its
// output in `log`; *port: the port it listens on once it says so (0 if it never does).
pid_t spawn_serve(const std::string& log, const std::vector<std::string>& args, int* port) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_TRUNC);
    dup2(fd, 2);
    dup2(fd, 1);
    std::vector<std::string> all = {"lmserve", "serve", "--model", model_dir(), "--port", "0", "--max-model-len", "1024"};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(lmserve::testing::lmserve_binary().c_str(), argv.data());
    _exit(127);
  }
  *port = 0;
  for (int i = 0; i < 200 && *port == 0; ++i) {
    std::ifstream in(log);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    auto at = text.find("on http://127.0.0.1:");
    if (at != std::string::npos) *port = std::atoi(text.c_str() + at + 20);
    if (*port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pid;
}

TEST(Cli, ServeDrainsOnSigtermAndExitsZero) {
  std::string log = write_temp("serve.log", "");
  int port = 0;
  const pid_t pid = spawn_serve(log, {"--shutdown-timeout", "120"}, &port);
  ASSERT_GT(port, 0) << "the server did not start";
  EXPECT_NE(http_exchange(port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").find(" 200 "), std::string::npos);
  auto stream = std::async(std::launch::async, [port] {
    return http_exchange(port, post_request("/v1/completions", R"({"prompt":"The hacker","max_tokens":100,"ignore_eos":true,"stream":true})"));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  kill(pid, SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::string late = http_exchange(port, post_request("/v1/completions", R"({"prompt":"x","max_tokens":1})"));
  if (!late.empty()) {
    EXPECT_NE(late.find(" 503 "), std::string::npos) << late;
  }
  std::string body = stream.get();
  EXPECT_NE(body.find("data: [DONE]"), std::string::npos) << body.substr(0, 300);
  EXPECT_NE(body.find("\"finish_reason\":\"length\""), std::string::npos);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// A failed step (injected: --fault-injection fail=3) fails the engine: the stream in flight
// gets an error event and [DONE], /health answers 503, a new request 503, and the process exits
// with status 3 after --failure-exit-s for its supervisor to restart it.
TEST(Cli, ServeExitsWithStatusThreeAfterTheEngineFails) {
  std::string log = write_temp("serve_fault.log", "");
  int port = 0;
  const pid_t pid = spawn_serve(log, {"--fault-injection", "fail=3", "--failure-exit-s", "2"}, &port);
  ASSERT_GT(port, 0) << "the server did not start";
  const std::string body = http_exchange(port, post_request("/v1/completions", R"({"prompt":"The hacker","max_tokens":50,"ignore_eos":true,"stream":true})"));
  EXPECT_NE(body.find("\"error\""), std::string::npos) << body.substr(0, 400);
  EXPECT_NE(body.find("data: [DONE]"), std::string::npos) << body.substr(0, 400);
  EXPECT_NE(http_exchange(port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").find(" 503 "), std::string::npos);
  EXPECT_NE(http_exchange(port, post_request("/v1/completions", R"({"prompt":"x","max_tokens":1})")).find(" 503 "), std::string::npos);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("fault injection: step 3 failed"), std::string::npos);
  EXPECT_NE(text.find("exiting with status 3"), std::string::npos);
}

TEST(Cli, ServeReadsAYamlConfigAndTheCommandLineWins) {
  std::string config = write_temp("serve.yaml", "port: 0\nserved_model_name: yamlmodel\nmax-num-seqs: 4\nmax_model_len: 2048\n");
  std::string log = write_temp("serve_yaml.log", "");
  pid_t pid = fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_TRUNC);
    dup2(fd, 2);
    dup2(fd, 1);
    execl(lmserve::testing::lmserve_binary().c_str(), "lmserve", "serve", "--model", model_dir().c_str(), "--config",
          config.c_str(), "--max-model-len", "512", static_cast<char*>(nullptr));
    _exit(127);
  }
  int port = 0;
  std::string text;
  for (int i = 0; i < 200 && port == 0; ++i) {
    std::ifstream in(log);
    text.assign((std::istreambuf_iterator<char>(in)), {});
    auto at = text.find("yamlmodel on http://127.0.0.1:");
    if (at != std::string::npos) port = std::atoi(text.c_str() + at + 30);
    if (port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GT(port, 0) << text;
  EXPECT_NE(text.find("max_model_len 512"), std::string::npos) << "the command line must win over the file";
  std::string models = http_exchange(port, "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_NE(models.find("\"id\":\"yamlmodel\""), std::string::npos) << models;
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  CommandRun bad = run("serve --config " + write_temp("bad.yaml", "max-num-seqs: lots\n"));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("'max-num-seqs'"), std::string::npos) << bad.output;
  bad = run("serve --config " + write_temp("bad2.yaml", "no_such_flag: 1\n"));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("unknown key 'no-such-flag'"), std::string::npos) << bad.output;
}

// A request the KV cache could never hold is refused at once (it used to wait forever), and a
// server whose KV cache cannot hold one request of max_model_len does not start (as vLLM).
TEST(Cli, KvCachesTooSmallForTheRequestOrMaxModelLenFailClearly) {
  CommandRun r = run("generate --model " + model_dir() + " --num-kv-blocks 2 --max-tokens 60 --ignore-eos --prompt 'hello there'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("completion tokens, more than the KV cache can hold for one request (32 tokens)"), std::string::npos) << r.output;
  r = run("serve --model " + model_dir() + " --port 0 --num-kv-blocks 8 --max-model-len 1024");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("max_model_len 1024 is more than the KV cache holds for one request of lane 'high' (128 tokens)"), std::string::npos)
      << r.output;
}

TEST(Cli, TextCommandsFailClearlyOnBadInput) {
  CommandRun r = run("tokenize --model /nonexistent hello");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("neither tokenizer.json"), std::string::npos) << r.output;
  r = run("chat-template --model " + model_dir() + " --messages " + write_temp("bad.json", "{not json"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("not valid JSON"), std::string::npos) << r.output;
  r = run("chat-template --model " + model_dir() + " --messages " + write_temp("m.json", "[]") + " --template " +
          write_temp("t.jinja", "{% for m in messages %}"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("line 1"), std::string::npos) << r.output;
}

}  // namespace

namespace {

// `lmserve serve` on the demo model in a child process; the port it bound.
struct ServeProcess {
  pid_t pid = -1;
  int port = 0;
  explicit ServeProcess(const std::vector<std::string>& extra) {
    std::string log = write_temp("bench_serve_" + std::to_string(::getpid()) + ".log", "");
    pid = fork();
    if (pid == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_TRUNC);
      dup2(fd, 2);
      dup2(fd, 1);
      std::vector<std::string> args = {"lmserve", "serve", "--model", model_dir(), "--port", "0", "--max-model-len", "1024"};
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(lmserve::testing::lmserve_binary().c_str(), argv.data());
      _exit(127);
    }
    // Up to a minute: on a loaded 2-core machine (CI beside a build) the start-up took over 10 s.
    for (int i = 0; i < 1200 && port == 0; ++i) {
      std::ifstream in(log);
      std::string text((std::istreambuf_iterator<char>(in)), {});
      auto at = text.find("://127.0.0.1:");
      if (at != std::string::npos) port = std::atoi(text.c_str() + at + 13);
      if (port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~ServeProcess() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      int status = 0;
      waitpid(pid, &status, 0);
    }
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

// bench serve against a real server, once per dataset: every request succeeds, the report
// has its fields, TTFT <= E2E for every request, and the server never saw more requests at
// once than --max-concurrency.
TEST(BenchServe, AgainstLmserveWithEveryDataset) {
  ServeProcess server({"--max-num-seqs", "8"});
  ASSERT_GT(server.port, 0) << "the server did not start";
  const std::string jsonl = write_temp("trace.jsonl", "{\"prompt\": \"The hacker\", \"output_len\": 6, \"timestamp\": 0.0}\n"
                                                      "{\"input_len\": 20, \"output_len\": 4, \"timestamp\": 0.05}\n"
                                                      "{\"prompt\": \"A ledger of accounts\", \"output_len\": 5, \"timestamp\": 0.1}\n");
  const std::string sharegpt = write_temp("sharegpt.json",
                                          R"([{"conversations": [{"from": "human", "value": "Tell me about the jargon file."}, {"from": "gpt", "value": "It is a glossary of hacker slang."}]},
                                              {"conversations": [{"from": "human", "value": "你好"}, {"from": "gpt", "value": "你好！很高兴认识你。"}]}])");
  struct Case {
    std::string name, args;
    std::size_t requests;
  };
  const std::vector<Case> cases = {
      // --ignore-eos spelled out, as scripts written for vLLM's bench serve pass it (the default here).
      {"random", "--dataset-name random --random-input-len 24 --random-output-len 6 --num-prompts 12 --ignore-eos", 12},
      {"mixed", "--dataset-name mixed --mixed-input-median 30 --mixed-output-median 8 --mixed-max-input-len 200 --mixed-max-output-len 20 --num-prompts 12 --request-rate 50", 12},
      {"jsonl", "--dataset-name jsonl --dataset-path " + jsonl, 3},
      {"sharegpt", "--dataset-name sharegpt --dataset-path " + sharegpt + " --endpoint /v1/chat/completions", 2},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string report = write_temp("bench_" + c.name + ".json", "");
    CommandRun r = run("bench serve --base-url " + server.url() + " --max-concurrency 3 --seed 7 --goodput ttft:60000 " + c.args +
                       " --result-json " + report);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("successful requests"), std::string::npos) << r.output;
    auto j = nlohmann::json::parse(std::ifstream(report));
    for (const char* key : {"completed", "failed", "duration_s", "request_throughput", "output_throughput", "total_token_throughput",
                            "goodput", "ttft", "tpot", "itl", "e2el", "max_in_flight", "requests"}) {
      EXPECT_TRUE(j.contains(key)) << key;
    }
    EXPECT_EQ(j["completed"].get<std::size_t>(), c.requests);
    EXPECT_EQ(j["failed"], 0);
    EXPECT_LE(j["max_in_flight"].get<int>(), 3);
    for (const auto& q : j["requests"]) {
      EXPECT_TRUE(q["ok"].get<bool>()) << q.dump();
      EXPECT_LE(q["ttft_s"].get<double>(), q["e2el_s"].get<double>()) << q.dump();
      EXPECT_GT(q["output_tokens"].get<int>(), 0);
    }
    for (const char* s : {"mean_ms", "median_ms", "p90_ms", "p95_ms", "p99_ms", "max_ms"}) EXPECT_TRUE(j["ttft"].contains(s)) << s;
    if (c.name == "random") {
      // Output counts come from the server's usage: exactly 6 tokens each (ignore_eos).
      for (const auto& q : j["requests"]) EXPECT_EQ(q["output_tokens"], 6);
    }
  }
  // The server's own count of requests at once never went above the client's limit.
  std::string metrics = http_exchange(server.port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string series = "\nlmserve:generation_requests_in_flight_peak ";
  auto at = metrics.find(series);
  ASSERT_NE(at, std::string::npos);
  const int peak = std::atoi(metrics.c_str() + at + series.size());
  EXPECT_GE(peak, 2) << "requests were meant to overlap";
  EXPECT_LE(peak, 3);
}

// Two lanes' load in one run (--group), against a server whose high lane has latency targets:
// each group is reported apart, and the server's per-lane histograms, targets and step-time
// model are in /metrics.
TEST(BenchServe, GroupsLoadTwoLanesAtOnce) {
  ServeProcess server({"--lanes", "high:0.2:ttft=2s:tpot=500ms,low"});
  ASSERT_GT(server.port, 0);
  const std::string report = write_temp("groups.json", "");
  CommandRun r = run("bench serve --base-url " + server.url() +
                     " --header x-lmserve-lane:low --dataset-name random --random-input-len 40 --random-output-len 8 --num-prompts 12"
                     " --max-concurrency 4 --group name=compliance,lane=high,num-prompts=5,max-concurrency=1,input-len=12,output-len=4"
                     " --result-json " + report);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("==== group main (lane low)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("==== group compliance (lane high)"), std::string::npos) << r.output;
  auto j = nlohmann::json::parse(std::ifstream(report));
  ASSERT_EQ(j["groups"].size(), 2u);
  EXPECT_EQ(j["groups"][0]["lane"], "low");
  EXPECT_EQ(j["groups"][0]["completed"], 12);
  EXPECT_EQ(j["groups"][1]["group"], "compliance");
  EXPECT_EQ(j["groups"][1]["completed"], 5);
  EXPECT_LE(j["groups"][1]["max_in_flight"].get<int>(), 1);
  for (const auto& q : j["groups"][1]["requests"]) EXPECT_EQ(q["output_tokens"], 4);
  std::string metrics = http_exchange(server.port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  for (const char* series : {"lmserve:lane_time_to_first_token_seconds_count{model_name=\"demo\",lane=\"high\"} 5",
                             "lmserve:lane_time_to_first_token_seconds_count{model_name=\"demo\",lane=\"low\"} 12",
                             "lmserve:lane_time_per_output_token_seconds_count{model_name=\"demo\",lane=\"high\"} 5",
                             "lmserve:lane_request_queue_time_seconds_count{model_name=\"demo\",lane=\"low\"} 12",
                             "lmserve:lane_latency_target_seconds{model_name=\"demo\",lane=\"high\",target=\"tpot\"} 0.5",
                             "lmserve:lane_latency_target_seconds{model_name=\"demo\",lane=\"high\",target=\"ttft\"} 2",
                             "lmserve:lane_latency_target_seconds{model_name=\"demo\",lane=\"low\",target=\"tpot\"} 0",
                             "lmserve:lane_tpot_target_unmet_steps_total{model_name=\"demo\",lane=\"high\"} "}) {
    EXPECT_NE(metrics.find(series), std::string::npos) << series;
  }
  // The model was calibrated at start-up: its per-token cost is above zero.
  const std::string token = "lmserve:step_time_model_seconds{model_name=\"demo\",term=\"token\"} ";
  auto at = metrics.find(token);
  ASSERT_NE(at, std::string::npos);
  EXPECT_GT(std::atof(metrics.c_str() + at + token.size()), 0.0);
  // A malformed group or lane spec is a usage error.
  EXPECT_EQ(run("bench serve --base-url " + server.url() + " --group lane").exit_code, 2);
  EXPECT_EQ(run("bench serve --base-url " + server.url() + " --group lane=high --sweep rate:1,2").exit_code, 2);
  EXPECT_EQ(run("serve --model " + model_dir() + " --lanes high:tpot=50").exit_code, 2);
}

TEST(BenchServe, SweepReportsAndPlanMeasured) {
  ServeProcess server({});
  ASSERT_GT(server.port, 0);
  const std::string report = write_temp("sweep.json", ""), csv = write_temp("sweep.csv", ""), svg = write_temp("sweep.svg", "");
  CommandRun r = run("bench serve --base-url " + server.url() +
                     " --dataset-name random --random-input-len 16 --random-output-len 4 --num-prompts 6 --sweep concurrency:1,3" +
                     " --result-json " + report + " --result-csv " + csv + " --plot " + svg);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("concurrency=1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("concurrency=3"), std::string::npos);
  auto j = nlohmann::json::parse(std::ifstream(report));
  ASSERT_EQ(j["points"].size(), 2u);
  std::ifstream c(csv);
  std::string header;
  std::getline(c, header);
  EXPECT_EQ(header, "index,ok,status,start_s,ttft_s,tpot_s,e2el_s,prompt_tokens,output_tokens,error");
  std::ifstream s(svg);
  std::string plot((std::istreambuf_iterator<char>(s)), {});
  EXPECT_NE(plot.find("<svg"), std::string::npos);
  EXPECT_NE(plot.find("TTFT distribution"), std::string::npos);
  // The measured run feeds the planner.
  CommandRun p = run("plan --model llama-3.1-8b --gpu H200 --qps 2 --measured " + report + " --json");
  ASSERT_EQ(p.exit_code, 0) << p.output;
  auto pj = nlohmann::json::parse(p.output);
  EXPECT_TRUE(pj["latency_measured"].get<bool>());
  EXPECT_EQ(pj["kv_bytes_per_token"], 131072);
  for (const char* k : {"weights_bytes", "kv_bytes_per_token", "kv_pool_tokens", "max_concurrent_seqs", "gpus_needed"}) EXPECT_TRUE(pj.contains(k)) << k;
  // Bad input is a usage error, and a failing endpoint is a runtime failure.
  EXPECT_EQ(run("bench serve --base-url ftp://x").exit_code, 2);
  EXPECT_EQ(run("bench serve --base-url " + server.url() + " --request-rate -1").exit_code, 2);
  EXPECT_EQ(run("bench serve --base-url http://127.0.0.1:1 --model m --num-prompts 1 --tokenizer " + model_dir()).exit_code, 1);
  EXPECT_EQ(run("plan --model nosuchmodel --concurrency 1").exit_code, 2);
}

// A model folder without tokenizer files is served with --tokenizer DIR (vLLM's flag): the
// tokenizer and the chat template come from there. Without it the same folder does not start.
TEST(Cli, ServeTakesTheTokenizerFromItsOwnFolder) {
  const auto dir = std::filesystem::temp_directory_path() / ("lmserve_config_only_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "generation_config.json"}) {
    std::filesystem::create_symlink(std::filesystem::path(model_dir()) / f, dir / f);
  }
  EXPECT_NE(run("serve " + dir.string() + " --port 0 --max-model-len 1024").exit_code, 0);
  ServeProcess server({dir.string(), "--tokenizer", model_dir()});
  ASSERT_GT(server.port, 0) << "the server did not start";
  std::string tok = http_exchange(server.port, post_request("/tokenize", R"({"prompt":"The hacker"})"));
  EXPECT_NE(tok.find(" 200 "), std::string::npos) << tok;
  EXPECT_NE(tok.find("\"tokens\":["), std::string::npos) << tok;
  std::string chat = http_exchange(
      server.port, post_request("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3})"));
  EXPECT_NE(chat.find(" 200 "), std::string::npos) << chat;
  EXPECT_NE(chat.find("chat.completion"), std::string::npos) << chat;
  std::filesystem::remove_all(dir);
}

// HTTPS endpoints: bench serve speaks TLS (--insecure for a self-signed certificate).
TEST(BenchServe, OverTls) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("lmserve_bench_tls_" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  const std::string cert = dir + "/cert.pem", key = dir + "/key.pem";
  const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost -keyout " + key + " -out " + cert + " >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "openssl could not make a test certificate";
  ServeProcess server({"--ssl-certfile", cert, "--ssl-keyfile", key});
  ASSERT_GT(server.port, 0) << "the TLS server did not start";
  const std::string url = "https://127.0.0.1:" + std::to_string(server.port);
  const std::string args = " --dataset-name random --random-input-len 8 --random-output-len 3 --num-prompts 3 --tokenizer " + model_dir();
  CommandRun ok = run("bench serve --insecure --base-url " + url + args);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("successful requests                   3"), std::string::npos) << ok.output;
  // Verification is on by default: a self-signed certificate is refused.
  EXPECT_EQ(run("bench serve --model demo --base-url " + url + args).exit_code, 1);
  std::filesystem::remove_all(dir);
}

}  // namespace
