#include "text/bpe.h"

#include <cstdio>
#include <mutex>
#include <queue>

namespace lmserve::text {

Result<std::unique_ptr<BpeModel>> BpeModel::create(std::unordered_map<std::string, std::int32_t> vocab,
                                                   const std::vector<std::pair<std::string, std::string>>& merges,
                                                   BpeOptions options) {
  auto m = std::unique_ptr<BpeModel>(new BpeModel());
  m->options_ = std::move(options);
  m->vocab_ = std::move(vocab);
  std::int32_t max_id = -1;
  for (const auto& [tok, id] : m->vocab_) {
    if (id < 0) return error(StatusCode::kInvalidArgument, "BPE vocabulary has a negative id for '" + tok + "'");
    max_id = std::max(max_id, id);
  }
  m->id_to_token_.assign(static_cast<std::size_t>(max_id + 1), nullptr);
  for (const auto& [tok, id] : m->vocab_) m->id_to_token_[id] = &tok;

  m->merges_.reserve(merges.size() * 2);
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = m->vocab_.find(a), ib = m->vocab_.find(b), ic = m->vocab_.find(a + b);
    if (ia == m->vocab_.end() || ib == m->vocab_.end() || ic == m->vocab_.end()) {
      return error(StatusCode::kInvalidArgument, "BPE merge " + std::to_string(rank) + " ('" + a + "' '" + b +
                                                     "') uses a token that is not in the vocabulary");
    }
    // The first (lowest-rank) merge of a pair wins, as in tokenizers.
    m->merges_.emplace(pair_key(ia->second, ib->second), MergeInfo{static_cast<std::int32_t>(rank), ic->second});
  }
  if (m->options_.unk_token) {
    auto it = m->vocab_.find(*m->options_.unk_token);
    if (it == m->vocab_.end()) {
      return error(StatusCode::kInvalidArgument, "BPE unk_token '" + *m->options_.unk_token + "' is not in the vocabulary");
    }
    m->unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto it = m->vocab_.find(name);
    m->byte_ids_[b] = it == m->vocab_.end() ? -1 : it->second;
  }
  return m;
}

std::optional<std::int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(std::int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= id_to_token_.size()) return nullptr;
  return id_to_token_[id];
}

void BpeModel::split_into_symbols(std::string_view word, std::vector<Symbol>* symbols) const {
  auto add = [&](std::int32_t id, std::size_t len) {
    auto n = static_cast<std::int32_t>(symbols->size());
    symbols->push_back(Symbol{id, n - 1, n + 1, static_cast<std::uint32_t>(len)});
  };
  // A run of unknown characters waiting to be emitted (fused when fuse_unk).
  bool pending_unk = false;
  std::size_t pending_unk_len = 0;
  std::string key;
  for (std::size_t i = 0; i < word.size();) {
    std::size_t end = i + 1;
    while (end < word.size() && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80) ++end;
    std::string_view ch = word.substr(i, end - i);
    key.clear();
    if (i > 0) key += options_.continuing_subword_prefix;
    key += ch;
    if (end == word.size()) key += options_.end_of_word_suffix;
    if (auto it = vocab_.find(key); it != vocab_.end()) {
      if (pending_unk) {
        add(*unk_id_, pending_unk_len);
        pending_unk = false;
      }
      add(it->second, ch.size());
    } else {
      bool bytes_known = options_.byte_fallback;
      for (unsigned char b : key) bytes_known = bytes_known && byte_ids_[b] >= 0;
      if (bytes_known) {
        // Note: like tokenizers, a pending unknown run is not flushed before byte tokens.
        for (unsigned char b : key) add(byte_ids_[b], 1);
      } else if (unk_id_) {
        if (pending_unk && options_.fuse_unk) {
          pending_unk_len += ch.size();
        } else {
          if (pending_unk) add(*unk_id_, pending_unk_len);
          pending_unk = true;
          pending_unk_len = ch.size();
        }
      }
      // Without an unk token an unknown character is dropped, as in tokenizers.
    }
    i = end;
  }
  if (pending_unk) add(*unk_id_, pending_unk_len);
  if (!symbols->empty()) symbols->back().next = -1;
}

void BpeModel::merge_all(std::vector<Symbol>* symbols_ptr) const {
  auto& sym = *symbols_ptr;
  struct Candidate {
    std::int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](std::int32_t left) {
    std::int32_t right = sym[left].next;
    if (right < 0) return;
    auto it = merges_.find(pair_key(sym[left].id, sym[right].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.new_id});
  };
  for (std::int32_t i = 0; i + 1 < static_cast<std::int32_t>(sym.size()); ++i) consider(i);

  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& left = sym[top.pos];
    if (left.len == 0 || left.next < 0) continue;
    Symbol& right = sym[left.next];
    // The pair may have changed since this candidate was queued.
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    left.id = top.new_id;
    left.len += right.len;
    left.next = right.next;
    right.len = 0;
    if (left.next >= 0) sym[left.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
}

void BpeModel::tokenize(std::string_view word, std::vector<std::int32_t>* ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (auto it = vocab_.find(std::string(word)); it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  std::string key;
  if (cacheable) {
    key.assign(word);
    std::shared_lock lock(cache_mutex_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  split_into_symbols(word, &symbols);
  merge_all(&symbols);
  std::vector<std::int32_t> out;
  for (std::int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
  ids->insert(ids->end(), out.begin(), out.end());
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::move(key), std::move(out));
  }
}

}  // namespace lmserve::text
