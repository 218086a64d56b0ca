// lmserve_fake_upstream_server [--port N] [--threads N] [--chunks N] [--body-bytes N]: the fake
// replica as a process, for the gateway's overhead benchmark (scripts/gateway-overhead.sh).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "fake_upstream.h"

int main(int argc, char** argv) {
  int port = 0, threads = 1, chunks = 16, body = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--port")) port = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--chunks")) chunks = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--body-bytes")) body = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  lmserve::testing::FakeUpstream f("fake", threads, port);
  f.behaviour.chunks = chunks;
  f.behaviour.body_bytes = body;
  // Blocked before the threads start, so that every thread inherits it and sigwait gets them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  f.start();
  std::printf("listening on %d\n", f.port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  f.stop();
  return 0;
}
