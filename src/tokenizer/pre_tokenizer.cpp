#include "tokenizer/pre_tokenizer.h"

#include <pcre2.h>

#include "tokenizer/json_util.h"

namespace longctx::tokenizer {
namespace {

using json_util::json;

// GPT-2's pre-tokenization pattern (ByteLevel with use_regex).
const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// One match-data block per thread, big enough for the whole-match offsets we read.
pcre2_match_data* thread_match_data() {
  struct Holder {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(md); }
  };
  thread_local Holder h;
  return h.md;
}

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Span {
  size_t start, end;
  bool is_match;
};

// Appends every match of `re` in `piece` and every gap between matches as its own piece (the
// "isolated" behavior, and the GPT-2 regex split of ByteLevel).
void split_isolated(const Regex& re, std::string_view piece, std::vector<std::string_view>& out) {
  size_t pos = 0, s, e;
  while (re.next_match(piece, pos, &s, &e)) {
    if (s > pos) out.push_back(piece.substr(pos, s - pos));
    out.push_back(piece.substr(s, e - s));
    pos = e;
  }
  if (pos < piece.size()) out.push_back(piece.substr(pos));
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> re, Behavior behavior, bool invert)
      : re_(std::move(re)), behavior_(behavior), invert_(invert) {}

  void split(std::vector<std::string_view>& pieces, PieceArena&) const override {
    thread_local std::vector<std::string_view> out;
    std::vector<Span>& spans = spans_storage();
    out.clear();
    for (std::string_view piece : pieces) {
      if (behavior_ == Behavior::kIsolated) {  // hot path: every match and gap is a piece
        split_isolated(*re_, piece, out);
        continue;
      }
      spans.clear();
      size_t pos = 0, s, e;
      while (re_->next_match(piece, pos, &s, &e)) {
        if (s > pos) spans.push_back({pos, s, invert_});
        spans.push_back({s, e, !invert_});
        pos = e;
      }
      if (pos < piece.size()) spans.push_back({pos, piece.size(), invert_});
      apply_behavior(piece, out);
    }
    pieces.swap(out);
  }

 private:
  // The same folds as Hugging Face's SplitDelimiterBehavior over (span, is_match) lists.
  void apply_behavior(std::string_view piece, std::vector<std::string_view>& out) const {
    thread_local std::vector<Span> spans_out;
    std::vector<Span>& spans = spans_storage();
    spans_out.clear();
    bool previous_match = false;
    switch (behavior_) {
      case Behavior::kRemoved:
        for (const Span& sp : spans)
          if (!sp.is_match) spans_out.push_back(sp);
        break;
      case Behavior::kIsolated:
        spans_out = spans;
        break;
      case Behavior::kMergedWithPrevious:
        for (const Span& sp : spans) {
          if (sp.is_match && !previous_match && !spans_out.empty()) {
            spans_out.back().end = sp.end;
          } else {
            spans_out.push_back(sp);
          }
          previous_match = sp.is_match;
        }
        break;
      case Behavior::kMergedWithNext:
        for (size_t k = spans.size(); k-- > 0;) {
          const Span& sp = spans[k];
          if (sp.is_match && !previous_match && !spans_out.empty()) {
            spans_out.back().start = sp.start;
          } else {
            spans_out.push_back(sp);
          }
          previous_match = sp.is_match;
        }
        std::reverse(spans_out.begin(), spans_out.end());
        break;
      case Behavior::kContiguous:
        for (const Span& sp : spans) {
          if (sp.is_match == previous_match && !spans_out.empty()) {
            spans_out.back().end = sp.end;
          } else {
            spans_out.push_back(sp);
          }
          previous_match = sp.is_match;
        }
        break;
    }
    for (const Span& sp : spans_out)
      if (sp.end > sp.start) out.push_back(piece.substr(sp.start, sp.end - sp.start));
  }
  static std::vector<Span>& spans_storage();

  std::unique_ptr<Regex> re_;
  Behavior behavior_;
  bool invert_;
};

// split() fills this thread's span list and apply_behavior() reads it.
std::vector<Span>& SplitPreTokenizer::spans_storage() {
  thread_local std::vector<Span> spans;
  return spans;
}

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) re_ = std::make_unique<Regex>(kGpt2Pattern, false, "ByteLevel (GPT-2 regex)");
  }
  void split(std::vector<std::string_view>& pieces, PieceArena& arena) const override {
    if (add_prefix_space_) {
      for (auto& p : pieces) {
        if (!p.empty() && p[0] == ' ') continue;
        arena.push_back(" " + std::string(p));
        p = arena.back();
      }
    }
    if (!re_) return;
    thread_local std::vector<std::string_view> out;
    out.clear();
    for (std::string_view piece : pieces) split_isolated(*re_, piece, out);
    pieces.swap(out);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void split(std::vector<std::string_view>& pieces, PieceArena& arena) const override {
    for (const auto& s : steps_) s->split(pieces, arena);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

Behavior parse_behavior(const std::string& b, const std::string& where) {
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  LONGCTX_THROW(ErrorCode::kUnsupported, "tokenizer.json: {}.behavior \"{}\" is not supported",
                where, b);
}

std::unique_ptr<PreTokenizer> make(const json& j, const std::string& where, bool* has_byte_level,
                                   int depth) {
  json_util::check_nesting(depth, where);
  std::string type = json_util::type_of(j, where);
  if (type == "Sequence") {
    const json& list = json_util::require(j, "pretokenizers", where);
    LONGCTX_CHECK(list.is_array(), ErrorCode::kInvalidArgument,
                  "tokenizer.json: {}.pretokenizers must be an array", where);
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      steps.push_back(make(list[i], where + ".pretokenizers[" + std::to_string(i) + "]",
                           has_byte_level, depth + 1));
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (type == "Split") {
    const json& pattern = json_util::require(j, "pattern", where);
    std::unique_ptr<Regex> re;
    if (pattern.is_object() && pattern.contains("Regex")) {
      re = std::make_unique<Regex>(json_util::require_string(pattern, "Regex", where + ".pattern"),
                                   false, where);
    } else if (pattern.is_object() && pattern.contains("String")) {
      re = std::make_unique<Regex>(json_util::require_string(pattern, "String", where + ".pattern"),
                                   true, where);
    } else {
      LONGCTX_THROW(ErrorCode::kInvalidArgument,
                    "tokenizer.json: {}.pattern must be {{\"Regex\": ...}} or {{\"String\": ...}}",
                    where);
    }
    Behavior behavior = parse_behavior(json_util::require_string(j, "behavior", where), where);
    bool invert = json_util::optional_bool(j, "invert", false, where);
    return std::make_unique<SplitPreTokenizer>(std::move(re), behavior, invert);
  }
  if (type == "ByteLevel") {
    *has_byte_level = true;
    return std::make_unique<ByteLevelPreTokenizer>(
        json_util::optional_bool(j, "add_prefix_space", true, where),
        json_util::optional_bool(j, "use_regex", true, where));
  }
  LONGCTX_THROW(ErrorCode::kUnsupported, "tokenizer.json: {} type \"{}\" is not supported", where,
                type);
}

}  // namespace

Regex::Regex(const std::string& pattern, bool literal, const std::string& what) : what_(what) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  // PCRE2 refuses UCP together with LITERAL; a literal needs no character classes anyway.
  uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &err, &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    LONGCTX_THROW(ErrorCode::kInvalidArgument,
                  "tokenizer.json: {}: cannot compile regex at offset {}: {}", what, err_off,
                  reinterpret_cast<const char*>(msg));
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool Regex::next_match(std::string_view subject, size_t offset, size_t* start, size_t* end) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = thread_match_data();
  auto* subj = reinterpret_cast<PCRE2_SPTR>(subject.data());
  while (offset < subject.size()) {
    int rc = jit_
                 ? pcre2_jit_match(code, subj, subject.size(), offset, 0, md, nullptr)
                 : pcre2_match(code, subj, subject.size(), offset, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      // Match and depth limits (and the JIT stack) are hit by patterns that backtrack
      // catastrophically on this text: an input problem, named as such.
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      const bool limit = rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
                         rc == PCRE2_ERROR_HEAPLIMIT || rc == PCRE2_ERROR_JIT_STACKLIMIT;
      LONGCTX_THROW(limit ? ErrorCode::kInvalidArgument : ErrorCode::kInternal,
                    "tokenizer.json: {}: the regex {} on a {}-byte piece of text ({}){}", what_,
                    limit ? "gave up" : "failed", subject.size(),
                    reinterpret_cast<const char*>(msg),
                    limit ? ": the pattern backtracks too much for this input" : "");
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[1] > ov[0]) {
      *start = ov[0];
      *end = ov[1];
      return true;
    }
    // Empty match: step over one UTF-8 character and search again.
    offset = ov[0] + 1;
    while (offset < subject.size() && (static_cast<uint8_t>(subject[offset]) & 0xC0) == 0x80)
      ++offset;
  }
  return false;
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, bool* has_byte_level) {
  *has_byte_level = false;
  return make(j, "pre_tokenizer", has_byte_level, 0);
}

}  // namespace longctx::tokenizer
