// common: the phases of a process's start-up (config, tokenizer, weights read, weights to
// device, KV allocation, GEMM tuning, graph capture, server listening), each timed and logged
// once with its duration, for the operator who waits on a replica and for
// `lmserve:startup_seconds{phase}`.
//
//   { StartupPhase p("weights_read"); ...; }   // logs "start-up: weights_read 3.12 s"
//   startup_complete();                         // the server is ready: logs and records "total"
//
// "total" is the time from the process's start (this library's static initialisation) to
// startup_complete(). Thread-safe.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace lmserve {

class StartupPhase {
 public:
  explicit StartupPhase(std::string name);
  ~StartupPhase();  // records and logs the phase
  StartupPhase(const StartupPhase&) = delete;
  StartupPhase& operator=(const StartupPhase&) = delete;

 private:
  std::string name_;
  std::chrono::steady_clock::time_point start_;
};

// The phase under way (the innermost begun and not ended), "" when none.
std::string startup_current_phase();
// Records "total" and logs the phases' table; phases after it are not recorded.
void startup_complete();
bool startup_is_complete();
// The phases recorded so far, in order, in seconds (a phase run twice is summed under one
// name); "total" last once complete.
std::vector<std::pair<std::string, double>> startup_phases();

}  // namespace lmserve
