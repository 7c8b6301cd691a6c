#include "structured/grammar.h"

#include <algorithm>
#include <functional>

#include "longctx/core/error.h"

namespace longctx::structured {

namespace {

int32_t add_capped(int32_t a, int32_t b) {
  return std::min<int64_t>(int64_t{a} + b, Grammar::kInfinite);
}

}  // namespace

std::string GrammarState::key() const {
  std::string k;
  for (const Stack& s : stacks) {
    const auto n = static_cast<int32_t>(s.size());
    k.append(reinterpret_cast<const char*>(&n), sizeof(n));
    k.append(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(int32_t));
  }
  return k;
}

int32_t Grammar::add_rule(std::string name) {
  LONGCTX_ASSERT(!finalized_, "grammar: rule added after finalize");
  rules_.push_back({std::move(name), {}});
  return static_cast<int32_t>(rules_.size() - 1);
}

void Grammar::add_alternative(int32_t rule, const Sequence& elements) {
  LONGCTX_ASSERT(!finalized_ && rule >= 0 && rule < static_cast<int32_t>(rules_.size()),
                 "grammar: bad rule {}", rule);
  LONGCTX_CHECK(elements_.size() + elements.size() < kMaxElements, ErrorCode::kUnsupported,
                "grammar: the schema needs more than {} grammar elements (too many or too large "
                "counted repetitions)",
                kMaxElements);
  rules_[rule].starts.push_back(static_cast<int32_t>(elements_.size()));
  for (const Element& e : elements) {
    LONGCTX_ASSERT(e.kind != Element::Kind::kEnd, "grammar: explicit end element");
    elements_.push_back(e);
  }
  elements_.push_back(Element{});
}

Sequence Grammar::literal(std::string_view text) {
  Sequence s;
  s.reserve(text.size());
  for (char c : text) s.push_back(Element::of(ByteSet::single(static_cast<uint8_t>(c))));
  return s;
}

void Grammar::finalize() {
  const auto n = static_cast<int32_t>(rules_.size());
  LONGCTX_CHECK(root_ >= 0 && root_ < n, ErrorCode::kInvalidArgument, "grammar: no root rule");
  for (const Rule& r : rules_) {
    LONGCTX_CHECK(!r.starts.empty(), ErrorCode::kInvalidArgument,
                  "grammar: rule '{}' has no alternative", r.name);
  }
  for (const Element& e : elements_) {
    LONGCTX_CHECK(e.kind != Element::Kind::kRule || (e.rule >= 0 && e.rule < n),
                  ErrorCode::kInvalidArgument, "grammar: reference to undefined rule {}", e.rule);
  }
  // Shortest derivations, by relaxation until nothing shortens (a rule's distance only falls).
  rule_distance_.assign(n, kInfinite);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r = 0; r < n; ++r) {
      for (int32_t p : rules_[r].starts) {
        int32_t d = 0;
        for (; elements_[p].kind != Element::Kind::kEnd; ++p) {
          const Element& e = elements_[p];
          d = add_capped(d, e.kind == Element::Kind::kBytes ? 1 : rule_distance_[e.rule]);
        }
        if (d < rule_distance_[r]) {
          rule_distance_[r] = d;
          changed = true;
        }
      }
    }
  }
  position_distance_.assign(elements_.size(), 0);
  for (auto p = static_cast<int64_t>(elements_.size()) - 1; p >= 0; --p) {
    const Element& e = elements_[p];
    if (e.kind == Element::Kind::kEnd) continue;
    const int32_t own = e.kind == Element::Kind::kBytes ? 1 : rule_distance_[e.rule];
    position_distance_[p] = add_capped(own, position_distance_[p + 1]);
  }
  // Left recursion: a rule reachable from itself without consuming a byte would expand forever.
  // Nullable rules are those of distance 0.
  std::vector<std::vector<int32_t>> left(n);
  for (int32_t r = 0; r < n; ++r) {
    for (int32_t p : rules_[r].starts) {
      for (; elements_[p].kind == Element::Kind::kRule; ++p) {
        left[r].push_back(elements_[p].rule);
        if (rule_distance_[elements_[p].rule] != 0) break;
      }
    }
  }
  std::vector<uint8_t> mark(n, 0);  // 0 new, 1 on the path, 2 done
  std::function<void(int32_t)> visit = [&](int32_t r) {
    mark[r] = 1;
    for (int32_t s : left[r]) {
      LONGCTX_CHECK(mark[s] != 1, ErrorCode::kInvalidArgument,
                    "grammar: rule '{}' is left-recursive (it can reach itself through '{}' "
                    "before any byte)",
                    rules_[s].name, rules_[r].name);
      if (mark[s] == 0) visit(s);
    }
    mark[r] = 2;
  };
  for (int32_t r = 0; r < n; ++r) {
    if (mark[r] == 0) visit(r);
  }
  LONGCTX_CHECK(rule_distance_[root_] < kInfinite, ErrorCode::kInvalidArgument,
                "grammar: '{}' has no finite document", rules_[root_].name);
  finalized_ = true;
}

void Grammar::expand(Stack stack, std::vector<Stack>& out) const {
  for (;;) {
    if (stack.empty()) {
      out.push_back(std::move(stack));
      return;
    }
    const int32_t p = stack.back();
    const Element& e = elements_[p];
    if (e.kind == Element::Kind::kEnd) {
      stack.pop_back();
      continue;
    }
    if (e.kind == Element::Kind::kBytes) {
      out.push_back(std::move(stack));
      return;
    }
    // A reference in tail position returns nowhere: drop the caller's frame.
    if (elements_[p + 1].kind == Element::Kind::kEnd) {
      stack.pop_back();
    } else {
      stack.back() = p + 1;
    }
    const std::vector<int32_t>& starts = rules_[e.rule].starts;
    for (size_t i = 0; i + 1 < starts.size(); ++i) {
      Stack copy = stack;
      copy.push_back(starts[i]);
      expand(std::move(copy), out);
    }
    stack.push_back(starts.back());
  }
}

void Grammar::normalize(std::vector<Stack>& stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
}

GrammarState Grammar::initial() const {
  LONGCTX_ASSERT(finalized_, "grammar: used before finalize");
  GrammarState s;
  for (int32_t start : rules_[root_].starts) expand(Stack{start}, s.stacks);
  normalize(s.stacks);
  return s;
}

GrammarState Grammar::advance(const GrammarState& state, uint8_t b) const {
  GrammarState next;
  for (const Stack& s : state.stacks) {
    if (s.empty()) continue;
    const int32_t p = s.back();
    if (!elements_[p].bytes.has(b)) continue;
    Stack moved = s;
    moved.back() = p + 1;
    expand(std::move(moved), next.stacks);
    LONGCTX_CHECK(next.stacks.size() <= 4 * kMaxStacks, ErrorCode::kUnsupported,
                  "grammar: more than {} ways to read the output at once (nested ambiguous "
                  "anyOf / oneOf?)",
                  kMaxStacks);
  }
  normalize(next.stacks);
  LONGCTX_CHECK(next.stacks.size() <= kMaxStacks, ErrorCode::kUnsupported,
                "grammar: more than {} ways to read the output at once (nested ambiguous anyOf / "
                "oneOf?)",
                kMaxStacks);
  return next;
}

GrammarState Grammar::advance(const GrammarState& state, std::string_view bytes) const {
  GrammarState s = state;
  for (char c : bytes) {
    s = advance(s, static_cast<uint8_t>(c));
    if (s.dead()) break;
  }
  return s;
}

bool Grammar::accepting(const GrammarState& state) const {
  // Sorted: the empty stack, when present, comes first.
  return !state.stacks.empty() && state.stacks.front().empty();
}

bool Grammar::terminated(const GrammarState& state) const {
  return state.stacks.size() == 1 && state.stacks.front().empty();
}

int32_t Grammar::distance(const GrammarState& state) const {
  int32_t best = kInfinite;
  for (const Stack& s : state.stacks) {
    int32_t d = 0;
    for (int32_t p : s) d = add_capped(d, position_distance_[p]);
    best = std::min(best, d);
  }
  return best;
}

bool Grammar::matches(std::string_view bytes) const { return accepting(advance(initial(), bytes)); }

}  // namespace longctx::structured
