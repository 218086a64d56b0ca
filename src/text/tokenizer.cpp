#include "text/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/file.h"
#include "text/bpe.h"
#include "text/tokenizer_parts.h"
#include "text/utf8.h"

namespace lmserve::text {

using json = nlohmann::json;

namespace {

struct AddedToken {
  std::string content;
  std::int32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
  // What is matched: the content itself, or for `normalized` tokens the content passed through
  // the normalizer (Llama 2's "<s>" is matched as "▁<s>" in normalized text), as tokenizers does.
  std::string match;
  // decode(skip_special_tokens) drops it. tokenizers looks special tokens up by their matched
  // form, so a normalized token whose form changed is never recognised as special there.
  bool skippable = false;
};

// A run of input: either text still to tokenize, or a recognised added token.
struct Chunk {
  std::string text;
  std::int32_t token = -1;  // >= 0: an added token's id
  bool at_start = false;
  std::size_t begin = 0, end = 0;  // span in the original input (for segment rules)
};

bool is_word_char(char32_t c) {
  if (c == '_') return true;
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) || (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The code point that ends just before `pos`, and its start.
char32_t code_point_before(std::string_view s, std::size_t pos, std::size_t* start) {
  std::size_t p = pos - 1;
  while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
  char32_t cp = kReplacementChar;
  utf8_decode(s, p, &cp);
  *start = p;
  return cp;
}

}  // namespace

class TokenizerImpl {
 public:
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, std::size_t> added_by_content;
  std::unordered_map<std::int32_t, std::size_t> added_by_id;
  // Added tokens by first byte, longest first, for each of the two matching passes.
  std::array<std::vector<std::size_t>, 256> raw_index, normalized_index;
  std::size_t vocab_size = 0;

  // What decode() puts into the decoder chain for `id`, or nullptr where it drops the id
  // (an unknown id, or a skippable added token when special tokens are skipped). An added
  // token is its matched form: tokenizers decodes Llama 2's <s> as "▁<s>", which its decoder
  // turns into " <s>".
  const std::string* piece(std::int32_t id, bool skip_special_tokens) const {
    if (auto it = added_by_id.find(id); it != added_by_id.end()) {
      const AddedToken& t = added[it->second];
      return skip_special_tokens && t.skippable ? nullptr : &t.match;
    }
    return model->id_to_token(id);
  }

  void index_added_tokens() {
    for (std::size_t i = 0; i < added.size(); ++i) {
      auto& t = added[i];
      t.match = t.content;
      if (t.normalized && normalizer) normalizer->normalize(t.match);
      t.skippable = t.special && t.match == t.content;
      added_by_content[t.content] = i;
      added_by_id[t.id] = i;
      if (!t.match.empty()) {
        auto& bucket = (t.normalized ? normalized_index : raw_index)[static_cast<unsigned char>(t.match[0])];
        bucket.push_back(i);
      }
    }
    for (auto* index : {&raw_index, &normalized_index}) {
      for (auto& bucket : *index) {
        std::stable_sort(bucket.begin(), bucket.end(),
                         [&](std::size_t a, std::size_t b) { return added[a].match.size() > added[b].match.size(); });
      }
    }
  }

  // Splits `c` (a text chunk) at the added tokens of `index`, leftmost-longest, honouring
  // single_word / lstrip / rstrip. `allowed(begin, end)` (offsets within c.text) says where a
  // token may be recognised.
  template <typename Allowed>
  void split_added(const Chunk& c, const std::array<std::vector<std::size_t>, 256>& index, Allowed&& allowed,
                   std::vector<Chunk>& out) const {
    const std::string& s = c.text;
    std::size_t text_start = 0;  // start of the not-yet-emitted text
    auto emit_text = [&](std::size_t b, std::size_t e) {
      if (e > b) {
        bool mapped = c.end - c.begin == s.size();  // offsets map 1:1 only if not normalized
        out.push_back(Chunk{s.substr(b, e - b), -1, c.at_start && b == 0, mapped ? c.begin + b : c.begin,
                            mapped ? c.begin + e : c.end});
      }
    };
    for (std::size_t i = 0; i < s.size();) {
      const auto& bucket = index[static_cast<unsigned char>(s[i])];
      const AddedToken* hit = nullptr;
      for (std::size_t k : bucket) {
        const auto& t = added[k];
        if (s.compare(i, t.match.size(), t.match) == 0 && allowed(i, i + t.match.size())) {
          hit = &t;
          break;
        }
      }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      std::size_t b = i, e = i + hit->match.size();
      if (hit->single_word) {
        std::size_t prev_start;
        bool word_before = b > 0 && is_word_char(code_point_before(s, b, &prev_start));
        char32_t next = 0;
        bool word_after = e < s.size() && utf8_decode(s, e, &next) > 0 && is_word_char(next);
        if (word_before || word_after) {
          i = e;  // the match is discarded; its text stays ordinary text
          continue;
        }
      }
      if (hit->lstrip) {
        while (b > text_start) {
          std::size_t p;
          if (!is_space(code_point_before(s, b, &p))) break;
          b = p;
        }
      }
      if (hit->rstrip) {
        while (e < s.size()) {
          char32_t cp;
          int n = utf8_decode(s, e, &cp);
          if (n == 0 || !is_space(cp)) break;
          e += n;
        }
      }
      emit_text(text_start, b);
      bool mapped = c.end - c.begin == s.size();
      out.push_back(Chunk{std::string(), hit->id, false, mapped ? c.begin + b : c.begin, mapped ? c.begin + e : c.end});
      text_start = i = e;
    }
    emit_text(text_start, s.size());
  }

  template <typename Allowed>
  std::vector<std::int32_t> encode_text(std::string_view raw, bool add_special_tokens, Allowed&& allowed) const {
    std::string input = utf8_is_valid(raw) ? std::string(raw) : utf8_lossy(raw);
    std::vector<Chunk> first;
    Chunk whole{input, -1, true, 0, input.size()};
    split_added(whole, raw_index, [&](std::size_t b, std::size_t e) { return allowed(b, e); }, first);

    std::vector<std::int32_t> ids;
    std::vector<Chunk> second;
    std::vector<Piece> pieces;
    for (auto& c : first) {
      if (c.token >= 0) {
        ids.push_back(c.token);
        continue;
      }
      const bool chunk_allowed = allowed(c.begin, c.end);
      std::size_t orig_size = c.text.size();
      if (normalizer) normalizer->normalize(c.text);
      if (c.text.size() != orig_size) c.end = c.begin + orig_size;  // offsets no longer map 1:1
      second.clear();
      split_added(c, normalized_index, [&](std::size_t, std::size_t) { return chunk_allowed; }, second);
      for (auto& sc : second) {
        if (sc.token >= 0) {
          ids.push_back(sc.token);
          continue;
        }
        pieces.clear();
        pieces.push_back(Piece{std::move(sc.text), sc.at_start});
        if (pre_tokenizer) pre_tokenizer->pre_tokenize(pieces);
        for (const auto& p : pieces) model->tokenize(p.text, &ids);
      }
    }
    if (add_special_tokens && post_processor) post_processor->process(ids);
    return ids;
  }
};

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::shared_ptr<const Tokenizer>> Tokenizer::from_json(std::string_view text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return error(StatusCode::kInvalidArgument, std::string("tokenizer.json is not valid JSON: ") + e.what());
  }
  auto impl = std::make_unique<TokenizerImpl>();
  try {
    const json& m = j.at("model");
    std::string type = m.value("type", std::string("BPE"));
    if (type != "BPE") {
      return error(StatusCode::kInvalidArgument, "tokenizer.json: unsupported model '" + type + "' (only BPE)");
    }
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0) {
      return error(StatusCode::kInvalidArgument, "tokenizer.json: BPE dropout is not supported");
    }
    std::unordered_map<std::string, std::int32_t> vocab;
    vocab.reserve(m.at("vocab").size());
    for (auto& [tok, id] : m.at("vocab").items()) vocab.emplace(tok, id.get<std::int32_t>());
    std::vector<std::pair<std::string, std::string>> merges;
    merges.reserve(m.at("merges").size());
    for (const auto& mg : m.at("merges")) {
      if (mg.is_array() && mg.size() == 2) {
        merges.emplace_back(mg[0].get<std::string>(), mg[1].get<std::string>());
      } else if (mg.is_string()) {
        const std::string& s = mg.get_ref<const std::string&>();
        auto sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          return error(StatusCode::kInvalidArgument, "tokenizer.json: malformed merge '" + s + "'");
        }
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else {
        return error(StatusCode::kInvalidArgument, "tokenizer.json: malformed merge " + mg.dump());
      }
    }
    BpeOptions opt;
    if (m.contains("unk_token") && m["unk_token"].is_string()) opt.unk_token = m["unk_token"].get<std::string>();
    opt.fuse_unk = m.value("fuse_unk", false);
    opt.byte_fallback = m.value("byte_fallback", false);
    opt.ignore_merges = m.value("ignore_merges", false);
    if (m.contains("continuing_subword_prefix") && m["continuing_subword_prefix"].is_string()) {
      opt.continuing_subword_prefix = m["continuing_subword_prefix"].get<std::string>();
    }
    if (m.contains("end_of_word_suffix") && m["end_of_word_suffix"].is_string()) {
      opt.end_of_word_suffix = m["end_of_word_suffix"].get<std::string>();
    }
    auto model = BpeModel::create(std::move(vocab), merges, std::move(opt));
    if (!model) return error(model.error().with_context("tokenizer.json model"));
    impl->model = std::move(*model);

    for (const auto& a : j.value("added_tokens", json::array())) {
      impl->added.push_back(AddedToken{a.at("content").get<std::string>(), a.at("id").get<std::int32_t>(),
                                       a.value("special", false), a.value("lstrip", false), a.value("rstrip", false),
                                       a.value("single_word", false), a.value("normalized", false)});
    }
  } catch (const json::exception& e) {
    return error(StatusCode::kInvalidArgument, std::string("tokenizer.json: malformed model or added_tokens: ") + e.what());
  }
  auto normalizer = make_normalizer(j.value("normalizer", json()));
  if (!normalizer) return error(normalizer.error());
  auto pre = make_pre_tokenizer(j.value("pre_tokenizer", json()));
  if (!pre) return error(pre.error());
  auto post = make_post_processor(j.value("post_processor", json()));
  if (!post) return error(post.error());
  auto dec = make_decoder(j.value("decoder", json()));
  if (!dec) return error(dec.error());
  impl->normalizer = std::move(*normalizer);
  impl->pre_tokenizer = std::move(*pre);
  impl->post_processor = std::move(*post);
  impl->decoder = std::move(*dec);
  impl->index_added_tokens();

  std::size_t size = impl->model->size();
  for (std::int32_t id = static_cast<std::int32_t>(size); impl->model->id_to_token(id) != nullptr; ++id) size = id + 1;
  for (const auto& t : impl->added) size = std::max(size, static_cast<std::size_t>(t.id) + 1);
  impl->vocab_size = size;
  return std::shared_ptr<const Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::shared_ptr<const Tokenizer>> Tokenizer::load(const std::filesystem::path& dir) {
  if (std::filesystem::exists(dir / "tokenizer.json")) {
    auto text = read_file(dir / "tokenizer.json");
    if (!text) return error(text.error());
    auto t = from_json(*text);
    if (!t) return error(t.error().with_context((dir / "tokenizer.json").string()));
    return t;
  }
  if (!std::filesystem::exists(dir / "vocab.json") || !std::filesystem::exists(dir / "merges.txt")) {
    return error(StatusCode::kNotFound, dir.string() + " has neither tokenizer.json nor vocab.json + merges.txt");
  }
  // The byte-level tokenizer that transformers builds from Qwen2-style slow files.
  auto vocab_text = read_file(dir / "vocab.json");
  if (!vocab_text) return error(vocab_text.error());
  auto merges_text = read_file(dir / "merges.txt");
  if (!merges_text) return error(merges_text.error());
  json config = json::object();
  if (std::filesystem::exists(dir / "tokenizer_config.json")) {
    auto c = read_file(dir / "tokenizer_config.json");
    if (!c) return error(c.error());
    config = json::parse(*c, nullptr, false);
    if (config.is_discarded()) return error(StatusCode::kInvalidArgument, "tokenizer_config.json is not valid JSON");
  }
  json vocab = json::parse(*vocab_text, nullptr, false);
  if (vocab.is_discarded() || !vocab.is_object()) {
    return error(StatusCode::kInvalidArgument, "vocab.json is not a JSON object");
  }
  json merges = json::array();
  std::istringstream lines(*merges_text);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.starts_with("#version")) continue;
    merges.push_back(line);
  }
  json added = json::array();
  if (config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object()) {
    for (auto& [id, t] : config["added_tokens_decoder"].items()) {
      json a = t;
      a["id"] = std::stoi(id);
      added.push_back(a);
    }
  }
  json tj = {
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"},
                       {"pattern",
                        {{"Regex",
                          R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
                       {"behavior", "Isolated"},
                       {"invert", false}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", config.value("add_prefix_space", false)}, {"use_regex", false}}})}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"unk_token", nullptr}}},
  };
  auto t = from_json(tj.dump());
  if (!t) return error(t.error().with_context(dir.string() + " (vocab.json + merges.txt)"));
  return t;
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  bool parse = options.parse_special;
  return impl_->encode_text(text, options.add_special_tokens, [parse](std::size_t, std::size_t) { return parse; });
}

std::vector<std::int32_t> Tokenizer::encode_segments(std::span<const TextSegment> segments, bool add_special_tokens) const {
  std::string joined;
  std::vector<std::pair<std::size_t, std::size_t>> denied;  // byte ranges where tokens are not allowed
  for (const auto& s : segments) {
    if (!s.allow_special && !s.text.empty()) denied.emplace_back(joined.size(), joined.size() + s.text.size());
    joined += s.text;
  }
  // Invalid UTF-8 is replaced before matching, which can shift offsets; then deny everything.
  if (!utf8_is_valid(joined) && !denied.empty()) denied.assign(1, {0, std::string::npos});
  return impl_->encode_text(joined, add_special_tokens, [&denied](std::size_t b, std::size_t e) {
    for (auto [db, de] : denied) {
      if (b < de && e > db) return false;
    }
    return true;
  });
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (std::int32_t id : ids) {
    if (const std::string* piece = impl_->piece(id, skip_special_tokens)) tokens.push_back(*piece);
  }
  if (!impl_->decoder) {
    std::string out;
    for (std::size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  impl_->decoder->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

std::size_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<std::int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(std::string(token)); it != impl_->added_by_content.end()) {
    return impl_->added[it->second].id;
  }
  return impl_->model->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(std::int32_t id) const {
  if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) return impl_->added[it->second].content;
  if (const std::string* t = impl_->model->id_to_token(id)) return *t;
  return std::nullopt;
}

bool Tokenizer::is_byte_fallback_token(std::int32_t id) const {
  if (!impl_->decoder || !impl_->decoder->groups_byte_tokens()) return false;
  if (impl_->added_by_id.contains(id)) return false;
  const std::string* t = impl_->model->id_to_token(id);
  return t != nullptr && t->size() == 6 && t->starts_with("<0x") && t->back() == '>';
}

bool Tokenizer::decodes_to_nothing(std::int32_t id, bool skip_special_tokens) const {
  return impl_->piece(id, skip_special_tokens) == nullptr;
}

std::optional<std::string> Tokenizer::token_bytes(std::int32_t id) const {
  if (is_special(id)) return std::nullopt;
  const std::string* piece = impl_->piece(id, false);
  if (!piece) return std::nullopt;
  std::string t = *piece;
  if (impl_->decoder) impl_->decoder->to_bytes(t);
  return t;
}

bool Tokenizer::is_special(std::int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

}  // namespace lmserve::text
