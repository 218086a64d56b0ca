// The grammar machine's inside (text/grammar.h), shared by grammar.cpp (the state's public
// calls) and grammar_feed.cpp (a byte fed through a thread's frames): the frames' phases by kind
// and the sink the continuing threads go to.
#pragma once

#include <cstring>

#include "text/grammar.h"

namespace lmserve::text::grammar_detail {

// Phases of the frames, by kind.
enum ObjectPhase : std::uint8_t { kObjOpen, kObjFirst, kObjKeyNext, kObjKey, kObjInKey, kObjColon, kObjBeforeValue, kObjInValue, kObjAfterValue };
enum ArrayPhase : std::uint8_t { kArrOpen, kArrFirst, kArrInItem, kArrAfter, kArrNext };
enum StringPhase : std::uint8_t { kStrOpen, kStrIn, kStrEscape, kStrHex };
enum NumberPhase : std::uint8_t { kNumStart, kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp };
enum RepeatPhase : std::uint8_t { kRepStart, kRepInItem, kRepAfter, kRepInSep, kRepNeedItem };

}  // namespace lmserve::text::grammar_detail

namespace lmserve::text {

struct GrammarState::Out {
  GrammarState& s;
  void add(const Frame* st, int n) {
    if (s.threads_ >= kMaxThreads || s.used_ + n > kMaxFrames) return;  // dropped: a narrower grammar, never a wrong one
    for (int t = 0; t < s.threads_; ++t) {
      const int b = t == 0 ? 0 : s.end_[static_cast<std::size_t>(t - 1)], e = s.end_[static_cast<std::size_t>(t)];
      if (e - b == n && std::memcmp(&s.frames_[static_cast<std::size_t>(b)], st, sizeof(Frame) * static_cast<std::size_t>(n)) == 0) return;
    }
    std::memcpy(&s.frames_[s.used_], st, sizeof(Frame) * static_cast<std::size_t>(n));
    s.used_ = static_cast<std::uint8_t>(s.used_ + n);
    s.end_[s.threads_++] = s.used_;
  }
};

}  // namespace lmserve::text
