// Runs the lmserve binary as a user would and checks exit codes and output.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

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
  for (const char* sub : {"serve --model models/demo --port 8000", "bench serve --num-prompts 10", "plan",
                          "tokenize hello", "model verify x"}) {
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

}  // namespace
