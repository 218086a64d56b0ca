#include "text/json_schema.h"

#include <map>
#include <set>
#include <string>

namespace lmserve::text {
namespace {

using ojson = nlohmann::ordered_json;
using Kind = GrammarNode::Kind;

// Keywords a draft defines that no grammar here follows: refused by name.
const std::set<std::string>& refused() {
  static const std::set<std::string> k{"not", "if", "then", "else", "patternProperties", "propertyNames", "dependentRequired",
                                       "dependentSchemas", "dependencies", "minProperties", "maxProperties", "contains",
                                       "minContains", "maxContains", "prefixItems", "additionalItems", "unevaluatedProperties",
                                       "unevaluatedItems", "multipleOf", "contentEncoding", "contentMediaType", "contentSchema",
                                       "$dynamicRef", "$recursiveRef", "$dynamicAnchor", "$recursiveAnchor"};
  return k;
}

// The keywords that constrain a value (anything else is an annotation or unknown).
const std::set<std::string>& constraining() {
  static const std::set<std::string> k{"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
                                       "enum", "const", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
                                       "exclusiveMinimum", "exclusiveMaximum", "uniqueItems"};
  return k;
}

// A format as a pattern over the string's characters: always a subset of what the format's
// definition (and ajv-formats) accepts, so that every text written validates.
const char* format_pattern(const std::string& f) {
  static const std::map<std::string, const char*> k{
      {"date", "^\\d{4}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1\\d|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)$"},
      {"time", "^(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d{1,6})?(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)$"},
      {"date-time",
       "^\\d{4}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1\\d|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)"
       "T(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d{1,6})?(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)$"},
      {"email", "^[A-Za-z0-9_+-]+(?:\\.[A-Za-z0-9_+-]+)*@(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\\.)+[A-Za-z]{2,}$"},
      {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
      {"ipv4", "^(?:(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)$"},
      {"hostname", "^[A-Za-z0-9](?:[A-Za-z0-9-]{0,20}[A-Za-z0-9])?(?:\\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,20}[A-Za-z0-9])?)*$"},
      {"uri", "^https?://[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?:/[A-Za-z0-9._~-]*)*$"},
  };
  auto it = k.find(f);
  return it == k.end() ? nullptr : it->second;
}

class Compiler {
 public:
  Compiler(Grammar& g, const ojson& doc) : g_(g), doc_(doc) {}

  Result<std::int32_t> add(const ojson& s, const std::string& at) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) return fail("a false schema matches nothing", at);
      return g_.add(GrammarNode{.kind = Kind::kAny});
    }
    if (!s.is_object()) return fail("a schema must be an object or a boolean", at);
    if (++depth_ > 64) return fail("the schema is nested too deeply", at);
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    for (const auto& [k, v] : s.items()) {
      if (refused().count(k)) return unsupported(k, at);
      if (k == "uniqueItems" && v == true) return unsupported(k, at);
      if (k == "items" && v.is_array()) return unsupported("items (as an array)", at);
      if (k == "allOf" && !(v.is_array() && v.size() == 1)) return unsupported("allOf (of more than one schema)", at);
    }
    const bool siblings = std::any_of(s.items().begin(), s.items().end(), [](const auto& kv) { return constraining().count(kv.key()) > 0; });
    if (s.contains("$ref")) {
      if (siblings) return unsupported("$ref beside other keywords", at);
      return ref(s["$ref"], at);
    }
    if (s.contains("allOf")) {
      if (siblings) return unsupported("allOf beside other keywords", at);
      return add(s["allOf"][0], at + "/allOf/0");
    }
    for (const char* k : {"anyOf", "oneOf"}) {
      if (!s.contains(k)) continue;
      const ojson& list = s[k];
      if (!list.is_array() || list.empty()) return fail(std::string(k) + " must be a non-empty array", at);
      if (siblings) return unsupported(std::string(k) + " beside other keywords", at);
      GrammarNode alt{.kind = Kind::kAlt};
      for (std::size_t i = 0; i < list.size(); ++i) {
        auto c = add(list[i], at + "/" + k + "/" + std::to_string(i));
        if (!c.has_value()) return c;
        alt.children.push_back(*c);
      }
      return g_.add(std::move(alt));
    }
    if (s.contains("enum") || s.contains("const")) {
      GrammarNode lits{.kind = Kind::kLiterals};
      if (s.contains("const")) lits.literals.push_back(s["const"].dump());
      if (s.contains("enum")) {
        if (!s["enum"].is_array() || s["enum"].empty()) return fail("enum must be a non-empty array", at);
        for (const auto& v : s["enum"]) lits.literals.push_back(v.dump());
      }
      if (s.contains("const") && s.contains("enum")) return unsupported("const beside enum", at);
      return g_.add(std::move(lits));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const ojson& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const auto& x : t) {
          if (!x.is_string()) return fail("type must be a string or an array of strings", at);
          types.push_back(x.get<std::string>());
        }
      } else {
        return fail("type must be a string or an array of strings", at);
      }
    } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") || s.contains("format")) {
      types.push_back("string");
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum")) {
      types.push_back("number");
    } else {
      return g_.add(GrammarNode{.kind = Kind::kAny});
    }
    GrammarNode alt{.kind = Kind::kAlt};
    for (const auto& t : types) {
      auto c = typed(s, t, at);
      if (!c.has_value()) return c;
      alt.children.push_back(*c);
    }
    if (alt.children.size() == 1) return alt.children[0];
    return g_.add(std::move(alt));
  }

 private:
  Unexpected<Status> fail(const std::string& what, const std::string& at) const {
    return error(StatusCode::kInvalidArgument, "json_schema: " + what + " (at " + (at.empty() ? "/" : at) + ")");
  }
  Unexpected<Status> unsupported(const std::string& keyword, const std::string& at) const {
    return error(StatusCode::kInvalidArgument, "json_schema: '" + keyword + "' (at " + (at.empty() ? "/" : at) + ") is not supported");
  }

  Result<std::int32_t> ref(const ojson& r, const std::string& at) {
    if (!r.is_string()) return fail("$ref must be a string", at);
    const auto target = r.get<std::string>();
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    if (target.empty() || target[0] != '#') return unsupported("$ref to another document (" + target + ")", at);
    const ojson* node = nullptr;
    try {
      node = &doc_.at(ojson::json_pointer(target.substr(1)));
    } catch (const std::exception&) {
      return fail("$ref " + target + " points at nothing", at);
    }
    // A placeholder first, so that a schema that refers to itself finds it.
    const std::int32_t id = g_.add(GrammarNode{.kind = Kind::kAlt});
    refs_.emplace(target, id);
    auto body = add(*node, target.substr(1));
    if (!body.has_value()) return body;
    g_.nodes[static_cast<std::size_t>(id)].children.push_back(*body);
    return id;
  }

  Result<std::int32_t> typed(const ojson& s, const std::string& t, const std::string& at) {
    if (t == "null") return g_.add(GrammarNode{.kind = Kind::kLiterals, .literals = {"null"}});
    if (t == "boolean") return g_.add(GrammarNode{.kind = Kind::kLiterals, .literals = {"false", "true"}});
    if (t == "integer" || t == "number") return number(s, t == "integer", at);
    if (t == "string") return string(s, at);
    if (t == "array") return array(s, at);
    if (t == "object") return object(s, at);
    return fail("unknown type '" + t + "'", at);
  }

  Result<std::uint32_t> count(const ojson& s, const char* k, std::uint32_t dflt, const std::string& at) {
    if (!s.contains(k)) return dflt;
    const ojson& v = s[k];
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0) return fail(std::string(k) + " must be a non-negative integer", at);
    return static_cast<std::uint32_t>(std::min<std::int64_t>(v.get<std::int64_t>(), UINT32_MAX - 1));
  }

  Result<std::int32_t> number(const ojson& s, bool integer, const std::string& at) {
    GrammarNode n{.kind = Kind::kNumber, .integer = integer};
    auto bound = [&](const char* k, bool* has, double* v) -> Status {
      if (!s.contains(k)) return Status::ok();
      if (!s[k].is_number()) return fail(std::string(k) + " must be a number", at);
      *has = true;
      *v = s[k].get<double>();
      return Status::ok();
    };
    LMSERVE_RETURN_IF_ERROR(bound("minimum", &n.has_lo, &n.lo));
    LMSERVE_RETURN_IF_ERROR(bound("maximum", &n.has_hi, &n.hi));
    for (const char* k : {"exclusiveMinimum", "exclusiveMaximum"}) {
      if (!s.contains(k)) continue;
      const bool lo = k[9] == 'M' && k[10] == 'i';
      const ojson& v = s[k];
      if (v.is_boolean()) {  // draft 4: a flag on minimum / maximum
        if (v.get<bool>()) (lo ? n.lo_exclusive : n.hi_exclusive) = true;
        continue;
      }
      if (!v.is_number()) return fail(std::string(k) + " must be a number", at);
      const double x = v.get<double>();
      double& cur = lo ? n.lo : n.hi;
      bool& has = lo ? n.has_lo : n.has_hi;
      if (!has || (lo ? x >= cur : x <= cur)) {
        cur = x;
        has = true;
        (lo ? n.lo_exclusive : n.hi_exclusive) = true;
      }
    }
    if (n.has_lo && n.has_hi && (n.lo > n.hi || (n.lo == n.hi && (n.lo_exclusive || n.hi_exclusive)))) {
      return fail("the bounds leave no number", at);
    }
    if (integer && n.has_lo && n.has_hi) {
      const double lo = n.lo_exclusive ? std::floor(n.lo) + 1 : std::ceil(n.lo), hi = n.hi_exclusive ? std::ceil(n.hi) - 1 : std::floor(n.hi);
      if (lo > hi) return fail("the bounds leave no integer", at);
    }
    for (double v : {n.lo, n.hi}) {
      if (std::abs(v) >= 1e15) return unsupported("a bound of 1e15 or more", at);
    }
    return g_.add(std::move(n));
  }

  Result<std::int32_t> string(const ojson& s, const std::string& at) {
    GrammarNode n{.kind = Kind::kString};
    auto mn = count(s, "minLength", 0, at);
    if (!mn.has_value()) return error(mn.error());
    auto mx = count(s, "maxLength", UINT32_MAX, at);
    if (!mx.has_value()) return error(mx.error());
    n.min = *mn;
    n.max = *mx;
    if (n.min > n.max) return fail("minLength is above maxLength", at);
    std::string pattern;
    bool anchored = false;
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return fail("pattern must be a string", at);
      pattern = s["pattern"].get<std::string>();
    }
    if (s.contains("format")) {
      if (!s["format"].is_string()) return fail("format must be a string", at);
      const auto f = s["format"].get<std::string>();
      const char* p = format_pattern(f);
      if (!p) return unsupported("format " + f, at);
      if (!pattern.empty()) return unsupported("pattern beside format", at);
      pattern = p;
      anchored = true;
    }
    if (!pattern.empty()) {
      auto dfa = ByteDfa::compile(pattern, ByteDfa::Options{.anchored = anchored, .dot_all = false});
      if (!dfa.has_value()) return fail(dfa.error().message(), at);
      g_.dfas.push_back(std::move(*dfa));
      n.dfa = static_cast<std::int32_t>(g_.dfas.size()) - 1;
    }
    return g_.add(std::move(n));
  }

  Result<std::int32_t> array(const ojson& s, const std::string& at) {
    GrammarNode n{.kind = Kind::kArray};
    auto mn = count(s, "minItems", 0, at);
    if (!mn.has_value()) return error(mn.error());
    auto mx = count(s, "maxItems", UINT32_MAX, at);
    if (!mx.has_value()) return error(mx.error());
    n.min = *mn;
    n.max = *mx;
    if (n.min > n.max) return fail("minItems is above maxItems", at);
    if (s.contains("items")) {
      auto item = add(s["items"], at + "/items");
      if (!item.has_value()) return item;
      n.item = *item;
    }
    return g_.add(std::move(n));
  }

  Result<std::int32_t> object(const ojson& s, const std::string& at) {
    GrammarNode n{.kind = Kind::kObject};
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return fail("required must be an array of strings", at);
      for (const auto& r : s["required"]) {
        if (!r.is_string()) return fail("required must be an array of strings", at);
        required.insert(r.get<std::string>());
      }
    }
    std::set<std::string> named;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) return fail("properties must be an object", at);
      for (const auto& [name, sub] : s["properties"].items()) {
        auto v = add(sub, at + "/properties/" + name);
        if (!v.has_value()) return v;
        n.properties.push_back({ojson(name).dump(), *v, required.count(name) > 0});
        named.insert(name);
      }
    }
    for (const auto& r : required) {  // required but not described: any value
      if (named.count(r)) continue;
      n.properties.push_back({ojson(r).dump(), g_.add(GrammarNode{.kind = Kind::kAny}), true});
    }
    if (n.properties.empty() && s.contains("additionalProperties")) {
      const ojson& extra = s["additionalProperties"];
      if (extra == false) return g_.add(GrammarNode{.kind = Kind::kLiterals, .literals = {"{}"}});
      auto v = add(extra, at + "/additionalProperties");
      if (!v.has_value()) return v;
      n.extra = *v;
    }
    return g_.add(std::move(n));
  }

  Grammar& g_;
  const ojson& doc_;
  std::map<std::string, std::int32_t> refs_;
  int depth_ = 0;
};

}  // namespace

Result<std::int32_t> add_json_schema(Grammar& grammar, const ojson& schema, const ojson& document) {
  return Compiler(grammar, document).add(schema, "");
}

Result<std::shared_ptr<const Grammar>> compile_json_schema(const ojson& schema) {
  auto g = std::make_shared<Grammar>();
  auto root = add_json_schema(*g, schema, schema);
  if (!root.has_value()) return error(root.error());
  g->root = *root;
  if (Status st = g->finish(); !st.is_ok()) return error(StatusCode::kInvalidArgument, "json_schema: " + st.message());
  return std::shared_ptr<const Grammar>(std::move(g));
}

}  // namespace lmserve::text
