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
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/devices.h"
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

TEST(Cli, PendingSubcommandsSayNotYetAvailableAndExitTwo) {
  for (const char* sub : {"bench serve --num-prompts 10", "plan",
                          "gateway --port 9000", "model verify x"}) {
    CommandRun r = run(sub);
    EXPECT_EQ(r.exit_code, 2) << sub;
    EXPECT_NE(r.output.find("not yet available"), std::string::npos) << sub << ": " << r.output;
  }
}

TEST(Cli, UsageErrorsExitTwo) {
  EXPECT_EQ(run("").exit_code, 2);
  EXPECT_EQ(run("no-such-command").exit_code, 2);
  CommandRun r = run("--log-level loud version");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("unknown log level 'loud'"), std::string::npos) << r.output;
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
  EXPECT_EQ(run("generate --model " + model_dir() + " --prompt hi --top-p 7").exit_code, 2);
  // --device cuda: a clear runtime failure where no GPU can be used, the completion where one can.
  EXPECT_EQ(run("generate --model " + model_dir() + " --prompt hi --device cuda").exit_code, lmserve::probe_devices().devices.empty() ? 1 : 0);
}

TEST(Cli, BenchLatencyAndThroughputReportTheirNumbers) {
  CommandRun lat = run("bench latency --model " + model_dir() + " --device cpu --batch-size 2 --input-len 16 --output-len 8 --threads 2");
  ASSERT_EQ(lat.exit_code, 0) << lat.output;
  EXPECT_TRUE(std::regex_search(lat.output, std::regex(R"(prefill [0-9.]+ ms)"))) << lat.output;
  EXPECT_TRUE(std::regex_search(lat.output, std::regex(R"(decode step: mean [0-9.]+ ms, p50 [0-9.]+ ms, p99 [0-9.]+ ms)"))) << lat.output;
  CommandRun thr = run("bench throughput --model " + model_dir() + " --device cpu --num-prompts 6 --input-len 16 --output-len 5 --threads 2");
  ASSERT_EQ(thr.exit_code, 0) << thr.output;
  // Exactly num_prompts x output_len tokens (ignore_eos), counted from the engine's usage.
  EXPECT_NE(thr.output.find("requests 6, prompt tokens 96, output tokens 30,"), std::string::npos) << thr.output;
  EXPECT_TRUE(std::regex_search(thr.output, std::regex(R"(throughput: [0-9.]+ requests/s, [0-9.]+ output tokens/s)"))) << thr.output;
  EXPECT_EQ(run("bench latency --model " + model_dir() + " --device cpu --output-len 1").exit_code, 2);
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

TEST(Cli, ServeDrainsOnSigtermAndExitsZero) {
  std::string log = write_temp("serve.log", "");
  pid_t pid = fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_TRUNC);
    dup2(fd, 2);
    dup2(fd, 1);
    execl(lmserve::testing::lmserve_binary().c_str(), "lmserve", "serve", "--model", model_dir().c_str(), "--port", "0",
          "--shutdown-timeout", "120", "--max-model-len", "1024", static_cast<char*>(nullptr));
    _exit(127);
  }
  int port = 0;
  for (int i = 0; i < 200 && port == 0; ++i) {
    std::ifstream in(log);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    auto at = text.find("on http://127.0.0.1:");
    if (at != std::string::npos) port = std::atoi(text.c_str() + at + 20);
    if (port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
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
