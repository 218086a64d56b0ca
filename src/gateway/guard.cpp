#include "gateway/guard.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <boost/container/small_vector.hpp>
#include <cstdlib>
#include <fstream>
#include <map>
#include <utility>
#include <vector>

#include "gateway/hidden_text.h"
#include "gateway/injection_model.h"
#include "text/regex.h"
#include "text/utf8.h"

namespace lmserve::gateway {

namespace {

enum class Form { kFolded, kCompact };

struct DefaultRule {
  const char* id;
  Form form;
  const char* pattern;
  // A pattern the folded form must match before this rule is tried (one search a text, shared by
  // the rules that name it), or null: a rule skips the texts that lack its script or the rare
  // word it needs.
  const char* gate = nullptr;
};

// The gates of the default rules: a Latin letter for the rules written in English words (and the
// other Latin-script languages), a character past ASCII for those in Chinese, Russian, Japanese
// and Korean, and an AI by name for the English ai_addressed rules. An English text then skips
// the Chinese rules and a Chinese one the English rules (docs/gateway.md: the rules' cost).
constexpr const char* kHasLatin = "[a-z]";
constexpr const char* kHasNonAscii = R"([^\x{0}-\x{7f}])";
constexpr const char* kNamesAnAi = R"(\b(ai|a\.i\.|chatbot|bot|llm|llms|language\s+models?)\b)";

// The shipped prompt-injection rules. Folded-form rules see words and punctuation; compact-form
// rules see letters only (no \b there: their words run together, so each names a phrase that an
// ordinary question does not contain).
const DefaultRule kDefaultRules[] = {
    // "Ignore (all) previous instructions" and its many wordings.
    {"default.ignore_instructions", Form::kFolded,
     R"(\b(ignore|ingore|ignroe|igonre|ignoer|ingnore|disregard|disreguard|forget|forgett|skip|override|bypass|drop(?= (all|any|every|your|these|those)\b)|abandon|discard|neglect|set aside|put aside|throw away|throw out|toss out|scrap|ditch|erase|wipe out|disobey|dismiss)\b[^.!?\n]{0,40}?\b(previous|prior|above|earlier|preceding|former|foregoing|original|initial|system|all|any|every|your|these|those)\b[^.!?\n]{0,30}?\b(instr\w*|prompts?|rules?|directions?|directives?|guidelines|guardrails|constraints|policies|restrictions|context|orders|commands|programming|training|guidance)\b)", kHasLatin},
    {"default.ignore_instructions", Form::kCompact,
     R"((ignore|ingore|ignroe|igonre|disregard|forget|override|bypass|discard|setaside|putaside|throwaway|throwout|scrap|ditch|disobey)(all|any|every|of|the|your|my|these|those)*((previous|prior|above|earlier|preceding|former|original|initial|system)(instr\p{L}{0,9}|prompts?|rules?|directions|directives|guidelines|context)|systemmessages?))", kHasLatin},
    {"default.ignore_instructions_zh", Form::kCompact,
     R"((忽略|无视|忘记|忘掉|不要理会|别管|跳过|绕过|抛开|放弃|不再遵守|不要遵守|停止遵守)(了)?.{0,6}?(之前|以上|上面|上述|先前|前面|此前|所有|全部|原来|原有|原先|系统|你的|一切).{0,6}?(指令|指示|提示词|提示|规则|设定|要求|限制|约束|命令|规定|说明))", kHasNonAscii},
    {"default.ignore_instructions_zh", Form::kCompact, R"((忽略|忘记|忘掉|无视|不要管|别管)(掉)?(之前|以上|上面|上述|先前|前面)(的)?(所有|一切|全部)?(内容|对话|话|消息|文字|设定))", kHasNonAscii},
    {"default.ignore_above", Form::kFolded,
     R"(\b(ignore|disregard|forget)\b[^.!?\n]{0,20}?\b(everything|anything|all|whatever)\b[^.!?\n]{0,10}?\b(above|before|prior|previously|earlier)\b)", kHasLatin},
    {"default.ignore_them", Form::kFolded,
     R"(\b(instr\w*|rules|prompts?|guidelines|directions)\b[^.!?\n]{0,40}?[;,:.!]?\s*\b(ignore|disregard|forget|skip|override)\b\s+(them|it|those|these|that|all of them)\b)", kHasLatin},
    {"default.ignore_told", Form::kFolded,
     R"(\b(ignore|disregard|forget)\b[^.!?\n]{0,20}?\b(what|everything|anything|whatever)\b(?!\s+(i|we)\b)[^.!?\n]{0,20}?\b(told|said|given|instructed|taught|asked)\b)", kHasLatin},
    {"default.stop_following", Form::kFolded,
     R"(\b(don'?t|do not|stop|no longer|never|quit)\b\s+(follow(ing)?|obey(ing)?|adher(e|ing) to|listen(ing)? to|comply(ing)? with|respect(ing)?)\b[^.!?\n]{0,20}?\b(previous|prior|earlier|original|initial|your|the|system|those|these|any)\b[^.!?\n]{0,20}?\b(instr\w*|rules|prompts?|guidelines|directions|policies)\b)", kHasLatin},
    {"default.instructions_void", Form::kFolded,
     R"(\b(you were told|you've been told|you have been told|you were given|your (previous|prior|earlier|original) (instr\w*|rules|prompts?))\b[^\n]{0,60}?\b(void|cancell?ed|invalid|obsolete|outdated|revoked|no longer (apply|valid|in effect))\b)", kHasLatin},
    // "Forget the instructions above", "ignore the safety rules": the object named after the verb.
    {"default.ignore_instructions", Form::kFolded,
     R"(\b(ignore|ingore|disregard|forget|skip|bypass|override|set aside|throw away|abandon)\b\s+(all\s+)?(the|your|those|these)\s+((instr\w*|rules|prompts?|directions|guidelines|directives)\s+(above|before this|so far|you (were|have been) given|you received|given (to you|earlier|before))|(safety|security|content|moderation|ethical|ethics|usage)\s+(rules|polic(y|ies)|guidelines|filters|restrictions|guardrails|protocols))\b)", kHasLatin},
    // "All prior instructions are cancelled."
    {"default.instructions_void", Form::kFolded,
     R"(\b(previous|prior|earlier|original|initial|above|preceding|old|system) (instr\w*|rules|directives|guidelines|prompts?)\s+(are|is|have been|were|has been)\s+(now\s+)?(cancell?ed|void|revoked|invalid|obsolete|overridden|null|suspended|lifted|deleted|removed|disabled|no longer valid)\b)", kHasLatin},
    {"default.instructions_void_zh", Form::kCompact,
     R"((你的)?(原始|之前|先前|原来|原有|系统|初始|以上|上面)(的)?(指令|指示|规则|设定|提示词|提示)(已经|已|都|全部|统统)*(失效|作废|无效|取消|废除|不再有效))", kHasNonAscii},
    {"default.prompt_leak_zh", Form::kCompact,
     R"((重复|复述|输出|打印|显示|列出)(一下|一遍)?你(在)?(上面|以上|之前|前面|最开始)(收到|接收到|看到|得到)?(的)?(所有|全部)?(内容|文字|指令|指示|信息|提示))", kHasNonAscii},
    {"default.stop_following_zh", Form::kCompact,
     R"((不要|别|无需|不必|不用|不再)(再)?(遵守|遵循|理会|管|执行|服从|听从)(你)?(之前|以上|上面|上述|先前|前面|原来|原有|所有|你的|系统|那些)(的)?.{0,4}?(指令|指示|提示|规则|设定|要求|限制|约束|命令|规定|安排|内容))", kHasNonAscii},
    {"default.ignore_instructions_zh", Form::kCompact,
     R"((之前|以上|上面|上述|先前|前面|原来|原有|所有|全部|你的|系统)(的)?(所有|全部|一切)?(指令|指示|提示词|提示|规则|设定|要求|限制|约束)(都|全部|统统|一律)?(忘掉|忘记|忽略|无视|作废|不用管|别管|不算数|失效|取消|废除))", kHasNonAscii},
    // Role spoofing: a chat template's markers, or a system/developer turn, inside user text.
    {"default.role_marker", Form::kFolded,
     R"(<\|\s*(im_start|im_end|system|user|assistant|start_header_id|end_header_id|eot_id|begin_of_text|endoftext|end_of_turn)\s*\|>|\[/?inst\]|<<\s*/?sys\s*>>|<\s*/?\s*(system|system_prompt)\s*>|<start_of_turn>)", kHasLatin},
    {"default.role_spoof", Form::kFolded,
     R"((^|\n)\s*[#*\[(]*\s*(system|developer|admin|administrator|root)\s*(prompt|message|override|note|instruction)?\s*[\])*]*\s*[:：]\s*\S)", kHasLatin},
    {"default.role_spoof", Form::kFolded, R"((^|\n)\s*[\[(]\s*(system|admin|administrator|developer|root)\s*[\])])", kHasLatin},
    {"default.role_spoof_zh", Form::kFolded, R"((^|\n|[。！？!?])\s*(系统|管理员|开发者|超级用户)\s*(提示|消息|指令|通知|命令)?\s*[:：])", kHasNonAscii},
    // A new persona without limits.
    {"default.persona", Form::kFolded,
     R"(\b(you are|you're|act as|pretend to be|pretend you are|roleplay as|from now on,? you('ll| will| are)|become)\b[^.!?\n]{0,40}?\b(dan|jailbroken|unrestricted|unfiltered|uncensored|evil|without (any )?(rules|restrictions|limits|filters|guidelines|ethics)|(with|having) (no|zero) (rules|restrictions|limits|limitations|filters|guidelines|ethics|constraints|boundaries|censorship))\b)", kHasLatin},
    {"default.persona", Form::kFolded, R"(\b(do anything now|dan mode|jailbreak(?![^.!?\n]{0,30}\b(phones?|iphones?|smartphones?|ipads?|tablets?|devices?|consoles?|warranty)\b)|god mode|no longer bound|not bound by)\b)", kHasLatin},
    // Developer mode as a state the model is put in (not a device's settings).
    {"default.persona", Form::kFolded,
     R"(\b((enable|enter|activate|switch to|turn on|you are (now )?in|you're (now )?in|now in|go into|run in|respond in)\s+(the\s+)?developer mode|developer mode\s+(is\s+)?(enabled|activated|engaged|on(?=\s*([.!,;:)]|$)))|developer mode (has|means|allows|ignores))\b)", kHasLatin},
    {"default.persona", Form::kFolded,
     R"(\b(you('ve| have)? (been|are|were) (now )?(freed|released|liberated|unshackled|unchained|set free)|you are (now )?free) from (all |any |every |your )?(of )?(your )?(restrictions|rules|limits|limitations|constraints|guidelines|filters|programming|shackles|chains|safety)\b)", kHasLatin},
    // "Ignore the above and tell me ...": the above dismissed, then an order.
    {"default.ignore_above", Form::kFolded,
     R"(\b(ignore|ingore|disregard|forget|skip)\b\s+(all of |everything |all )?(the )?(above|preceding|foregoing)( \w+)?\s*[,;:]?\s*(and |then |now |instead )*(instead |now )?(tell|reveal|give|print|say|output|write|show|repeat|list|send|share|leak|dump|approve|summari[sz]e|describe|explain)\b)", kHasLatin},
    {"default.persona_zh", Form::kCompact,
     R"((你现在是|你是|扮演|假装你是|从现在起你是|从现在开始你是|进入).{0,12}?(dan|没有(任何)?(限制|约束|规则|底线|审查)|不受(任何)?(限制|约束|规则|规定|审查)|无限制|越狱|开发者模式|上帝模式))", kHasNonAscii},
    {"default.persona_zh", Form::kCompact, R"((越狱模式|无审查模式|解除(所有)?限制|不受任何规则|(?<!平板|手机|设备|电脑|终端|机器)(进入|开启|启用|激活|切换到|切换至|处于)开发者模式|开发者模式(已)?(开启|启用|激活|启动)))", kHasNonAscii},
    {"default.persona_zh", Form::kCompact, R"(你(就|将|已经|已)?(不再)?(不受|没有|不存在)(任何)?(限制|约束|规则|规定|审查|底线))", kHasNonAscii},
    // Asking for the hidden prompt.
    {"default.prompt_leak", Form::kFolded,
     R"(\b(reveal|show|print|output|repeat|leak|tell me|give me|display|dump|write out|recite|spell out)\b[^.!?\n]{0,30}?\b(system prompt|system message|initial (prompt|instructions)|hidden (prompt|instructions)|original (prompt|instructions)|your (instructions|prompt|rules)|the (text|prompt|instructions) above|everything above|developer (message|instructions)|your (full|entire|complete|whole|exact|verbatim|unredacted) (prompt|system prompt|configuration|config)|your context window)\b)", kHasLatin},
    {"default.prompt_leak_zh", Form::kCompact,
     R"((输出|显示|告诉我|透露|泄露|打印|重复|给我看|说出|展示|复述).{0,8}?(你的)?(系统提示|系统提示词|系统指令|初始指令|初始提示|隐藏指令|原始指令|原始提示|上面的(内容|指令|文字)|以上(内容|指令)))", kHasNonAscii},
    {"default.new_instructions", Form::kFolded, R"(\b(new|updated|real|actual|true) (instructions?|system prompt|task)\s*[:：])", kHasLatin},
    {"default.prompt_leak", Form::kFolded,
     R"(\b(instructions|prompt|rules|guidelines)\b\s+(that\s+)?(you were|you've been|you have been|you got|they gave you|you are|you're)\s*(given|told|provided|programmed|following|operating under)\b)", kHasLatin},
    {"default.new_instructions_zh", Form::kFolded, R"((新的|真正的|最新的|实际的)\s*(指令|任务|系统提示)\s*(是|[:：]))", kHasNonAscii},
    {"default.prompt_leak", Form::kCompact,
     R"((reveal|show|print|output|repeat|leak|tellme|giveme|display|dump|recite)(me|us)?(your|the)(systemprompt|systemmessage|initialinstructions|initialprompt|hiddeninstructions|hiddenprompt|originalprompt|originalinstructions))", kHasLatin},
    {"default.prompt_leak_zh", Form::kCompact,
     R"((你的)?(系统提示词|系统提示|系统指令|初始指令|初始提示|隐藏指令|原始指令)(的)?(原文|全文|内容|原话)?.{0,6}?(显示|输出|告诉|发|打印|透露|泄露|说|复述|展示)(出来|给我|一下|我)?)", kHasNonAscii},
    {"default.prompt_leak", Form::kFolded,
     R"(\b(what'?s|what is|what are|what were|what was)\b[^.!?\n]{0,10}?\b(your\s+(instr\w*|prompt|rules|system prompt|system message)|the\s+(system prompt|system message|hidden prompt|hidden instructions|initial prompt|initial instructions|original prompt|original instructions))\b)", kHasLatin},
    {"default.prompt_leak", Form::kFolded,
     R"(\b(instructions|rules|prompts?)\b\s+(were|was|have|had|did)\s+you\s+(been\s+)?(given|told|provided|get|receive)\b)", kHasLatin},
    {"default.prompt_leak_zh", Form::kCompact, R"((系统提示词|系统提示|系统指令|初始指令|初始提示|隐藏指令|原始指令|隐藏提示)(是什么|有哪些|是啥|写了什么|的内容))", kHasNonAscii},
    {"default.prompt_leak_zh", Form::kCompact, R"(你的(系统提示词|系统提示|系统指令|初始指令|初始提示|隐藏指令|原始指令|隐藏提示)(的)?(原文|全文|原话|内容)?.{0,4}?(给我看|发给我|发我|贴出来|写出来|拿出来))", kHasNonAscii},
    // "Ignore the previous instructions" in the other languages an attack is written in to slip
    // past English and Chinese rules (French, German, Spanish, Italian, Portuguese, Russian,
    // Japanese, Korean): the verb and the instructions or rules it dismisses.
    {"default.ignore_instructions_intl", Form::kFolded,
     R"(\b(ignore[zr]|oublie[zr]?|ignorier(e|en|t)?|vergiss|vergessen\s+sie|ignora[rd]?|olvida[rd]?|ignorare|dimentica|ignorem|esque[cç]a)\b[^.!?\n]{0,40}?\b(instructions?|consignes|r[eè]gles|anweisungen|regeln|vorgaben|instrucciones|reglas|normas|istruzioni|regole|instru[cç][oõ]es|regras)\b)", kHasLatin},
    // Portuguese "ignore" is spelt as the English verb: with the Portuguese (or French) nouns only,
    // as "ignore the instructions on the old form" is an English user's own.
    {"default.ignore_instructions_intl", Form::kFolded,
     R"(\bignore\b[^.!?\n]{0,40}?\b(instru[cç][oõ]es|regras|diretrizes|consignes|r[eè]gles)\b)", kHasLatin},
    {"default.ignore_instructions_intl", Form::kFolded,
     R"((игнорируй(те)?|забудь(те)?|не\s+обращай(те)?\s+внимания\s+на)[^.!?\n]{0,40}?(инструкци|правил|указани))", kHasNonAscii},
    {"default.ignore_instructions_intl", Form::kCompact,
     R"(((以前|前|これまで|上記)の)?(指示|命令|ルール|指令)(を|は)?(すべて|全て)?(无视|無視|忘れ)|(이전|앞의|기존)?(지시|지침|명령|규칙)(을|를|은|는)?(모두|전부)?(무시|잊어))", kHasNonAscii},
    // Content that addresses an AI reader with an order: an injection inside a document, an e-mail
    // or a tool's result ("Note to the AI: ...", "[to the summariser AI: ...]", "any language model
    // handling this must ...", 给AI的备注：..., 【给总结AI：...】, 任何处理本文的语言模型都必须...).
    // The addressee is an AI by name (AI, bot, chatbot, LLM, language model), not an assistant,
    // which may be a person; a user who greets the bot ("Hi bot, ...") is not held by these.
    {"default.ai_addressed", Form::kFolded,
     R"(\b(note|notes|instructions?|message|reminder|remark|memo|commands?|directives?|ps|p\.s\.|order|orders)\s+(for|to)\s+(the\s+|any\s+|all\s+|whatever\s+|every\s+|each\s+)?([\w-]+\s+)?(ai|a\.i\.|chatbot|bot|llm|llms|language\s+models?)(\s+(assistant|model|reader|reviewer|summari[sz]er|system|agent|tool|scheduler))?\s*[:：])", kNamesAnAi},
    {"default.ai_addressed", Form::kFolded,
     R"([\[【(（]\s*(note\s+|instructions?\s+)?(to|for)\s+(the\s+|any\s+)?([\w-]+\s+)?(ai|chatbot|bot|llm|language\s+models?)\b[^\]】)）\n]{0,24}[:：])", kNamesAnAi},
    {"default.ai_addressed", Form::kFolded,
     R"(\b(any|every|all|whatever|each)\s+(ai|chatbot|bot|llm|llms|language\s+models?|ai\s+(assistants?|models?|systems?|tools?|agents?))\s+(that\s+|which\s+|who\s+)?(reads?|reading|handles?|handling|process(es|ing)?|summari[sz](es|ing)|reviews?|reviewing|sees?|seeing|parses?|parsing)\s+(this|these|the\s+(text|document|file|message|page|email|e-mail|contract|ticket))\b)", kNamesAnAi},
    {"default.ai_addressed", Form::kFolded,
     R"(\b(ai|chatbot|bot|llm|language\s+models?)\s+(reading|handling|processing|seeing|parsing|summari[sz]ing)\s+this\s*[,:：])", kNamesAnAi},
    {"default.ai_addressed", Form::kFolded,
     R"(^[^"“「『]*["“「『][\s\S]*?\b(dear|attention|attn|psst|note to)\s*,?\s+(the\s+)?(ai|chatbot|bot|llm|language\s+models?)\b\s*[,:：])", kNamesAnAi},
    {"default.ai_addressed_zh", Form::kCompact,
     R"(给(读到这里的|读到这的|看到这里的|处理本文的|阅读本文的)?(总结|审核|评分|排程|客服|智能|翻译)?(ai|人工智能|聊天机器人|机器人|语言模型|大模型|模型)(总结助手|助手|审核员)?的(隐藏)?(备注|指令|话|说明|提示|留言|命令|消息|文字|指示))", kHasNonAscii},
    {"default.ai_addressed_zh", Form::kCompact,
     R"((读到这里|读到这|看到这里|处理本文|阅读本文|处理这段文字|处理本文件)的(ai|人工智能|机器人|语言模型|大模型|模型)(?!团队|部门|公司|项目))", kHasNonAscii},
    {"default.ai_addressed_zh", Form::kFolded,
     R"([【（(]\s*给[^】）)\n]{0,8}(ai|机器人|模型)[^】）)\n]{0,6}[:：])", kHasNonAscii},
    {"default.ai_addressed_zh", Form::kCompact,
     R"((任何|所有)?(处理|读到|阅读|审阅|总结|看到)(本文件?|这段文字|这份文件|本邮件|这封邮件)的(ai|人工智能|语言模型|大模型|模型|机器人)(系统|工具)?(都|须|必须|应|应当|要))", kHasNonAscii},
};

bool drop_in_compact(char32_t cp) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  switch (cat) {
    case UTF8PROC_CATEGORY_ZS: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS: case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF: case UTF8PROC_CATEGORY_PO:
    case UTF8PROC_CATEGORY_SM: case UTF8PROC_CATEGORY_SC: case UTF8PROC_CATEGORY_SK: case UTF8PROC_CATEGORY_SO:
      return true;
    default:
      return false;
  }
}

// Aho-Corasick over bytes: a trie of the compacted keywords with failure links; each node knows
// the first keyword (in list order) that ends at it or at any of its suffixes.
class KeywordMatcher {
 public:
  explicit KeywordMatcher(const std::vector<std::string>& keywords) {
    nodes_.emplace_back();
    for (std::size_t k = 0; k < keywords.size(); ++k) {
      const auto& w = keywords[k];
      if (w.empty()) continue;
      int n = 0;
      for (unsigned char ch : w) {
        int next = child(n, ch);
        if (next < 0) {
          next = static_cast<int>(nodes_.size());
          nodes_[static_cast<std::size_t>(n)].next.emplace_back(ch, next);
          nodes_.emplace_back();
          nodes_.back().depth = nodes_[static_cast<std::size_t>(n)].depth + 1;
        }
        n = next;
      }
      auto& end = nodes_[static_cast<std::size_t>(n)];
      if (end.word < 0) end.word = static_cast<int>(k);
    }
    // Breadth first: failure links, and whether a word ends at a node or along its failure chain.
    std::vector<int> queue{0};
    for (std::size_t qi = 0; qi < queue.size(); ++qi) {
      const int n = queue[qi];
      for (const auto& [ch, c] : nodes_[static_cast<std::size_t>(n)].next) {
        int fail = 0;
        if (n != 0) {
          int f = nodes_[static_cast<std::size_t>(n)].fail;
          while (f != 0 && child(f, ch) < 0) f = nodes_[static_cast<std::size_t>(f)].fail;
          fail = std::max(0, child(f, ch));
        }
        auto& cn = nodes_[static_cast<std::size_t>(c)];
        cn.fail = fail;
        cn.has_output = cn.word >= 0 || nodes_[static_cast<std::size_t>(fail)].has_output;
        queue.push_back(c);
      }
    }
  }

  // Every match as (keyword, begin, end) over `text`, by calling `fn`; stops when fn says so.
  template <class Fn>
  void scan(std::string_view text, Fn&& fn) const {
    int n = 0;
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto ch = static_cast<unsigned char>(text[i]);
      while (n != 0 && child(n, ch) < 0) n = nodes_[static_cast<std::size_t>(n)].fail;
      const int c = child(n, ch);
      n = c < 0 ? 0 : c;
      // Report the outputs along the failure chain (each with its own length).
      for (int m = n; m > 0; m = nodes_[static_cast<std::size_t>(m)].fail) {
        const auto& node = nodes_[static_cast<std::size_t>(m)];
        if (!node.has_output) break;
        if (node.word >= 0 && fn(node.word, i + 1 - static_cast<std::size_t>(node.depth), i + 1)) return;
      }
    }
  }
  bool empty() const { return nodes_.size() == 1; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> next;
    int fail = 0, word = -1, depth = 0;
    bool has_output = false;
  };
  int child(int n, unsigned char ch) const {
    for (const auto& [c, to] : nodes_[static_cast<std::size_t>(n)].next) {
      if (c == ch) return to;
    }
    return -1;
  }
  std::vector<Node> nodes_;
};

// Cyrillic and Greek letters that look like Latin ones (after case folding), as the Latin letter:
// the part of Unicode's confusables (UTS #39) that spells English words in look-alikes
// ("Dіsrеgаrd" with Cyrillic і, е, а); and the Latin small capitals, which NFKC leaves as they
// are ("ɪɢɴᴏʀᴇ ʀᴜʟᴇꜱ"). Cyrillic letters that only resemble small capitals (в, м, н, т) are left
// alone.
char latin_lookalike(char32_t cp) {
  switch (cp) {
    case 0x0262: return 'g';  // ɢ
    case 0x026A: return 'i';  // ɪ
    case 0x0274: return 'n';  // ɴ
    case 0x0280: return 'r';  // ʀ
    case 0x028F: return 'y';  // ʏ
    case 0x0299: return 'b';  // ʙ
    case 0x029C: return 'h';  // ʜ
    case 0x029F: return 'l';  // ʟ
    case 0x1D00: return 'a';  // ᴀ
    case 0x1D04: return 'c';  // ᴄ
    case 0x1D05: return 'd';  // ᴅ
    case 0x1D07: return 'e';  // ᴇ
    case 0x1D0A: return 'j';  // ᴊ
    case 0x1D0B: return 'k';  // ᴋ
    case 0x1D0D: return 'm';  // ᴍ
    case 0x1D0F: return 'o';  // ᴏ
    case 0x1D18: return 'p';  // ᴘ
    case 0x1D1B: return 't';  // ᴛ
    case 0x1D1C: return 'u';  // ᴜ
    case 0x1D20: return 'v';  // ᴠ
    case 0x1D21: return 'w';  // ᴡ
    case 0x1D22: return 'z';  // ᴢ
    case 0xA730: return 'f';  // ꜰ
    case 0xA731: return 's';  // ꜱ
    case 0xA7AF: return 'q';  // ꞯ
    case 0x0430: return 'a';  // а
    case 0x0435: case 0x0451: return 'e';  // е ё
    case 0x043E: return 'o';  // о
    case 0x0440: return 'p';  // р
    case 0x0441: return 'c';  // с
    case 0x0443: return 'y';  // у
    case 0x0445: return 'x';  // х
    case 0x0455: return 's';  // ѕ
    case 0x0456: case 0x0457: return 'i';  // і ї
    case 0x0458: return 'j';  // ј
    case 0x04BB: return 'h';  // һ
    case 0x04CF: return 'l';  // ӏ
    case 0x0501: return 'd';  // ԁ
    case 0x051B: return 'q';  // ԛ
    case 0x051D: return 'w';  // ԝ
    case 0x0261: return 'g';  // ɡ (Latin script g)
    case 0x03B1: return 'a';  // α
    case 0x03B5: return 'e';  // ε
    case 0x03B9: return 'i';  // ι
    case 0x03BA: return 'k';  // κ
    case 0x03BD: return 'v';  // ν
    case 0x03BF: return 'o';  // ο
    case 0x03C1: return 'p';  // ρ
    case 0x03C4: return 't';  // τ
    case 0x03C5: return 'u';  // υ
    case 0x03C7: return 'x';  // χ
    case 0x03F2: return 'c';  // ϲ
    default: return 0;
  }
}

// Traditional Chinese characters as their simplified forms, in pairs (traditional first): those of
// the words injections and bank requests use (規則 规则, 系統 系统, 密碼 密码, 顯示 显示, 請 请, ...),
// each with one simplified form only (乾, 著, 覆 and the like, which map to several, are left out).
constexpr const char* kTraditional =
    "規规則则統统設设碼码顯显輸输開开發发對对話话過过濾滤審审約约隱隐內内資资帳账號号"
    "權权們们這这說说讓让從从現现個个為为與与麼么機机員员銀银錢钱將将當当語语問问題题"
    "給给寫写讀读違违聽听應应該该絕绝繼继續续記记憶忆刪删執执務务項项關关閉闭門门護护"
    "處处戶户鑰钥匯汇轉转單单歷历錄录檔档點点電电郵邮網网頁页訊讯標标準准導导師师傳传"
    "達达認认證证驗验測测試试實实際际變变換换價价錯错誤误舊旧廢废棄弃無无視视請请訴诉"
    "運运營营戲戏裝装劇剧幫帮創创擬拟決决長长見见觀观據据嗎吗詞词詢询態态術术鍵键盤盘"
    "幣币額额貸贷櫃柜臺台學学習习體体總总結结報报書书裡里裏里頭头腦脑經经節节課课練练"
    "隨随級级別别專专業业線线責责負负債债償偿還还議议論论談谈討讨講讲聞闻樣样種种類类"
    "數数庫库檢检維维備备異异啟启動动擊击駭骇竊窃盜盗騙骗詐诈偽伪僞伪遺遗丟丢復复複复"
    "後后於于係系餘余徵征憑凭遞递鬆松歸归屬属醫医療疗險险費费稅税購购買买賣卖貨货幾几"
    "雙双劃划嚴严稱称";

// Whether a lead byte starts a Greek, Cyrillic or IPA letter (0xC9-0xD4), a small capital of the
// phonetic extensions (0xE1) or of Latin Extended-D (0xEA), or a CJK ideograph of the main block
// (0xE4-0xE9).
bool may_fold(unsigned char c) { return (c >= 0xC9 && c <= 0xD4) || c == 0xE1 || (c >= 0xE4 && c <= 0xEA); }

// The simplified form of a traditional character in kTraditional; 0 for any other.
char32_t simplified(char32_t cp) {
  static const auto table = [] {
    std::vector<std::pair<char32_t, char32_t>> t;
    const std::string_view s = kTraditional;
    for (std::size_t i = 0; i < s.size();) {
      char32_t a = 0, b = 0;
      i += static_cast<std::size_t>(std::max(1, text::utf8_decode(s, i, &a)));
      i += static_cast<std::size_t>(std::max(1, text::utf8_decode(s, i, &b)));
      t.emplace_back(a, b);
    }
    std::sort(t.begin(), t.end());
    return t;
  }();
  const auto it = std::lower_bound(table.begin(), table.end(), std::pair<char32_t, char32_t>{cp, 0});
  return it != table.end() && it->first == cp ? it->second : 0;
}

// Whether a code point lies in the ranges latin_lookalike's small capitals come from (IPA ɢ..ʟ,
// the phonetic extensions ᴀ..ᴢ, Latin Extended-D ꜰ..ꞯ): Latin letters, so they mark a word as
// Latin and fold wherever they stand.
bool small_capital(char32_t cp) { return (cp >= 0x0262 && cp <= 0x029F) || (cp >= 0x1D00 && cp <= 0x1D22) || (cp >= 0xA730 && cp <= 0xA7AF); }

bool ascii_letter(char32_t cp) { return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'); }

// A code point of a word: a letter or mark of any script, or a digit.
bool word_cp(char32_t cp) {
  if (cp < 0x80) return ascii_letter(cp) || (cp >= '0' && cp <= '9');
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_ME) || cat == UTF8PROC_CATEGORY_ND;
}

// The folded text with look-alike letters as Latin ones and traditional characters as simplified
// ones (walked only where such a lead byte occurs). A Cyrillic or Greek look-alike is read as Latin
// only in a word that has Latin letters too ("Dіsrеgаrd": UTS #39's mixed-script confusable): a
// word written wholly in Cyrillic or Greek stays as it is, so that the rules for Russian read
// Russian ("игнорируй"). Small capitals are Latin letters and fold wherever they stand.
void fold_letters(std::string& folded) {
  if (std::none_of(folded.begin(), folded.end(), [](char c) { return may_fold(static_cast<unsigned char>(c)); })) return;
  std::string out;
  out.reserve(folded.size());
  std::size_t word = 0;  // where the current word starts in `folded`
  bool latin = false;    // whether it has a Latin letter (ASCII or a small capital)
  auto flush = [&](std::size_t end) {
    for (std::size_t i = word; i < end;) {
      char32_t cp = 0;
      const auto len = static_cast<std::size_t>(std::max(1, text::utf8_decode(folded, i, &cp)));
      const char as_latin = len >= 2 && len <= 3 && (latin || small_capital(cp)) ? latin_lookalike(cp) : 0;
      if (as_latin) {
        out.push_back(as_latin);
      } else if (const char32_t simple = len == 3 ? simplified(cp) : 0) {
        text::utf8_append(out, simple);
      } else {
        out.append(folded, i, len);
      }
      i += len;
    }
    latin = false;
  };
  for (std::size_t i = 0; i < folded.size();) {
    char32_t cp = 0;
    const auto len = static_cast<std::size_t>(std::max(1, text::utf8_decode(folded, i, &cp)));
    if (!word_cp(cp)) {
      flush(i);
      out.append(folded, i, len);
      word = i + len;
    } else {
      latin = latin || ascii_letter(cp) || small_capital(cp);
    }
    i += len;
  }
  flush(folded.size());
  folded = std::move(out);
}

}  // namespace

GuardText guard_normalise(std::string_view text) {
  GuardText t;
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
    // ASCII (most prompts): compatibility composition leaves it as it is and case folding is
    // lowercasing, so utf8proc's pass and the decoding are not needed.
    static const auto dropped = [] {
      std::array<bool, 128> d{};
      for (char32_t c = 0; c < 128; ++c) d[c] = drop_in_compact(c);
      return d;
    }();
    t.folded.resize(text.size());
    t.compact.reserve(text.size());
    t.to_folded.reserve(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      t.folded[i] = static_cast<char>(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
      if (!dropped[c]) {
        t.compact.push_back(t.folded[i]);
        t.to_folded.push_back(i);
      }
    }
    return t;
  }
  const std::string valid = text::utf8_is_valid(text) ? std::string(text) : text::utf8_lossy(text);
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(valid.data()), static_cast<utf8proc_ssize_t>(valid.size()), &out,
                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT | UTF8PROC_CASEFOLD | UTF8PROC_IGNORE));
  if (n >= 0) t.folded.assign(reinterpret_cast<const char*>(out), static_cast<std::size_t>(n));
  else t.folded = valid;
  std::free(out);
  fold_letters(t.folded);
  t.compact.reserve(t.folded.size());
  t.to_folded.reserve(t.folded.size());
  for (std::size_t i = 0; i < t.folded.size();) {
    char32_t cp = 0;
    const int len = std::max(1, text::utf8_decode(t.folded, i, &cp));
    if (!drop_in_compact(cp)) {
      for (int b = 0; b < len; ++b) {
        t.compact.push_back(t.folded[i + static_cast<std::size_t>(b)]);
        t.to_folded.push_back(i);
      }
    }
    i += static_cast<std::size_t>(len);
  }
  return t;
}

struct Guard::Impl {
  struct Rule {
    std::string id;
    Form form;
    text::Regex regex;
    int gate = -1;  // into gates: DefaultRule::gate
  };
  std::vector<Rule> deny;
  std::vector<text::Regex> gates;
  std::vector<std::string> gate_patterns;  // the gates' source, to share one between rules
  std::vector<text::Regex> allow;
  std::vector<std::string> keyword_ids;
  std::optional<KeywordMatcher> keywords;
  const InjectionModel* model = nullptr;  // with the default rules
  std::shared_ptr<const InjectionModel> own_model;  // GuardSpec::model, kept alive
  double threshold = 1, threshold_unanchored = 1;
};

Guard::Guard() : impl_(std::make_unique<Impl>()) {}
Guard::~Guard() = default;

Result<std::shared_ptr<const Guard>> Guard::build(const GuardSpec& spec) {
  std::shared_ptr<Guard> g(new Guard());
  auto& im = *g->impl_;
  if (spec.default_rules) {
    for (const auto& r : kDefaultRules) {
      auto re = text::Regex::compile(r.pattern);
      if (!re) return error(Status(StatusCode::kInternal, std::string("guard: default rule ") + r.id + ": " + re.error().message()));
      int gate = -1;
      if (r.gate != nullptr) {
        const auto at = std::find(im.gate_patterns.begin(), im.gate_patterns.end(), r.gate);
        gate = static_cast<int>(at - im.gate_patterns.begin());
        if (at == im.gate_patterns.end()) {
          auto gate_re = text::Regex::compile(r.gate);
          if (!gate_re) return error(Status(StatusCode::kInternal, std::string("guard: default rule ") + r.id + "'s gate: " + gate_re.error().message()));
          im.gates.push_back(std::move(*gate_re));
          im.gate_patterns.emplace_back(r.gate);
        }
      }
      im.deny.push_back({r.id, r.form, std::move(*re), gate});
    }
    if (spec.injection_model) {
      if (!(spec.injection_threshold > 0 && spec.injection_threshold <= 1)) return error(Status(StatusCode::kInvalidArgument, "injection_threshold: must be in (0, 1]"));
      if (!(spec.injection_threshold_unanchored > 0 && spec.injection_threshold_unanchored <= 1)) {
        return error(Status(StatusCode::kInvalidArgument, "injection_threshold_unanchored: must be in (0, 1]"));
      }
      im.own_model = spec.model;
      im.model = spec.model ? spec.model.get() : &InjectionModel::shipped();
      im.threshold = spec.injection_threshold;
      im.threshold_unanchored = spec.injection_threshold_unanchored;
    }
  }
  for (std::size_t i = 0; i < spec.deny.size(); ++i) {
    auto re = text::Regex::compile(spec.deny[i]);
    if (!re) return error(Status(StatusCode::kInvalidArgument, "deny[" + std::to_string(i) + "]: " + re.error().message()));
    im.deny.push_back({"deny[" + std::to_string(i) + "]", Form::kFolded, std::move(*re)});
  }
  for (std::size_t i = 0; i < spec.allow.size(); ++i) {
    auto re = text::Regex::compile(spec.allow[i]);
    if (!re) return error(Status(StatusCode::kInvalidArgument, "allow[" + std::to_string(i) + "]: " + re.error().message()));
    im.allow.push_back(std::move(*re));
  }
  std::vector<std::string> compacted;
  for (const auto& k : spec.keywords) {
    compacted.push_back(guard_normalise(k).compact);
    im.keyword_ids.push_back("keyword:" + k);
  }
  if (!compacted.empty()) im.keywords.emplace(compacted);
  return std::shared_ptr<const Guard>(std::move(g));
}

std::size_t Guard::rules() const { return impl_->deny.size() + impl_->keyword_ids.size(); }

const InjectionModel* Guard::injection_model() const { return impl_->model; }

double Guard::injection_threshold() const { return impl_->threshold; }
double Guard::injection_threshold_unanchored() const { return impl_->threshold_unanchored; }

std::optional<std::string> Guard::check(std::span<const std::string> texts) const {
  const auto& im = *impl_;
  // One text's forms against every rule, then the model.
  auto judge = [&](const GuardText& t) -> std::optional<std::string> {
    std::vector<std::pair<std::size_t, std::size_t>> allowed;  // folded spans
    for (const auto& a : im.allow) {
      for (const auto& span : a.find_all(t.folded)) allowed.push_back(span);
    }
    auto is_allowed = [&](std::size_t b, std::size_t e) {
      for (const auto& [ab, ae] : allowed) {
        if (ab <= b && e <= ae) return true;
      }
      return false;
    };
    auto folded_span = [&](std::size_t b, std::size_t e) {  // a compact span in folded bytes
      return std::pair{t.to_folded[b], e < t.to_folded.size() ? t.to_folded[e] : t.folded.size()};
    };
    boost::container::small_vector<signed char, 4> gate_open(im.gates.size(), -1);  // -1: not searched yet
    for (const auto& r : im.deny) {
      const auto& subject = r.form == Form::kFolded ? t.folded : t.compact;
      if (!r.regex.may_match(subject.size())) continue;
      if (r.gate >= 0) {
        auto& open = gate_open[static_cast<std::size_t>(r.gate)];
        if (open < 0) open = im.gates[static_cast<std::size_t>(r.gate)].find(t.folded, 0).has_value() ? 1 : 0;
        if (open == 0) continue;
      }
      for (auto m = r.regex.find(subject, 0); m; m = r.regex.find(subject, m->second)) {
        const auto [fb, fe] = r.form == Form::kFolded ? *m : folded_span(m->first, m->second);
        if (!is_allowed(fb, fe)) return r.id;
      }
    }
    if (im.keywords) {
      std::optional<std::string> hit;
      im.keywords->scan(t.compact, [&](int k, std::size_t b, std::size_t e) {
        const auto [fb, fe] = folded_span(b, e);
        if (is_allowed(fb, fe)) return false;
        hit = im.keyword_ids[static_cast<std::size_t>(k)];
        return true;
      });
      if (hit) return hit;
    }
    if (im.model) {
      // The model judges the text less what the allow rules exempt.
      std::optional<GuardText> rest;
      if (!allowed.empty()) {
        std::sort(allowed.begin(), allowed.end());
        std::string kept;
        std::size_t at = 0;
        for (const auto& [b, e] : allowed) {
          if (b > at) kept.append(t.folded, at, b - at);
          kept.push_back(' ');
          at = std::max(at, e);
        }
        if (at < t.folded.size()) kept.append(t.folded, at, std::string::npos);
        rest = guard_normalise(kept);
      }
      const GuardText& judged = rest ? *rest : t;
      // A long text is judged only where it names what an injection aims at (the anchors); a
      // short one always, against the anchored or the unanchored threshold. The anchors' search
      // runs only where its answer can change the verdict.
      if (judged.folded.size() <= kInjectionUnanchoredMaxBytes) {
        const double p = im.model->probability(judged);
        if (p >= std::min(im.threshold, im.threshold_unanchored) &&
            p >= (im.model->anchored(judged) ? im.threshold : im.threshold_unanchored)) {
          return "default.injection_model";
        }
      } else if (im.model->anchored(judged) && im.model->probability(judged) >= im.threshold) {
        return "default.injection_model";
      }
    }
    return std::nullopt;
  };
  for (const auto& raw : texts) {
    if (raw.empty()) continue;
    const auto t = guard_normalise(raw);
    if (auto rule = judge(t)) return rule;
    // What it says in base64, ROT13 or backwards (hidden_text.h), judged alike.
    for (const auto& hidden : hidden_texts(raw, t.folded)) {
      if (auto rule = judge(guard_normalise(hidden))) return rule;
    }
  }
  return std::nullopt;
}

Result<std::vector<std::string>> read_keywords(const std::string& path) {
  std::ifstream in(path);
  if (!in) return error(Status(StatusCode::kNotFound, "cannot read " + path));
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    const auto start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    out.push_back(line.substr(start));
  }
  return out;
}

}  // namespace lmserve::gateway
