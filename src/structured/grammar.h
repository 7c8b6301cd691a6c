// A context-free grammar over bytes and its recognizer: a pushdown automaton whose state is the
// set of stacks still alive (every way the bytes so far can continue), as llama.cpp's grammars.
// Rules are alternatives of sequences of elements; an element is a set of bytes or a reference to
// a rule. A stack holds positions in the flat element array: the top is the next byte set to
// match, the entries below are where to return when the rule above ends. Expansion replaces a
// rule reference on top by each of its alternatives (a reference in tail position pops its caller
// first, so right recursion, the grammar's loops, keeps the stack flat); a stack that empties is
// a complete document. Left recursion is refused when the grammar is finalized.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace longctx::structured {

struct ByteSet {
  std::array<uint64_t, 4> bits{};
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
  }
  static ByteSet single(uint8_t b) {
    ByteSet s;
    s.add(b);
    return s;
  }
  static ByteSet range(uint8_t lo, uint8_t hi) {
    ByteSet s;
    s.add_range(lo, hi);
    return s;
  }
};

struct Element {
  enum class Kind : uint8_t { kBytes, kRule, kEnd };
  Kind kind = Kind::kEnd;
  int32_t rule = -1;  // kRule
  ByteSet bytes;      // kBytes
  static Element of(const ByteSet& s) { return {Kind::kBytes, -1, s}; }
  static Element ref(int32_t rule) { return {Kind::kRule, rule, {}}; }
};

using Sequence = std::vector<Element>;

// Positions in Grammar's element array; the top of the stack is the back.
using Stack = std::vector<int32_t>;

// The recognizer's state: the live stacks, sorted and distinct (empty: no way on, a dead state).
struct GrammarState {
  std::vector<Stack> stacks;
  bool operator==(const GrammarState&) const = default;
  bool dead() const { return stacks.empty(); }
  // A byte string naming the state (the mask cache's key).
  std::string key() const;
};

class Grammar {
 public:
  // Effectively unbounded: the distance of a rule with no finite derivation.
  static constexpr int32_t kInfinite = 1 << 30;
  // Bounds against hostile schemas: elements of the whole grammar (a schema of many large
  // maxLength / maxItems unrolls), and live stacks at once (nested ambiguous anyOf can multiply
  // the ways to read the same bytes). Past either, Error(kUnsupported).
  static constexpr size_t kMaxElements = size_t{1} << 21;
  static constexpr size_t kMaxStacks = 1024;

  int32_t add_rule(std::string name);
  void add_alternative(int32_t rule, const Sequence& elements);
  // The elements of `text`, one byte each.
  static Sequence literal(std::string_view text);
  void set_root(int32_t rule) { root_ = rule; }

  // Checks the grammar and computes the distances. Throws Error(kInvalidArgument) for a rule
  // without alternatives, a left-recursive rule (naming it) or a root with no finite document.
  void finalize();

  GrammarState initial() const;
  // The state after byte `b` (dead when no stack takes it).
  GrammarState advance(const GrammarState& state, uint8_t b) const;
  GrammarState advance(const GrammarState& state, std::string_view bytes) const;
  // A document may end here (some stack is empty).
  bool accepting(const GrammarState& state) const;
  // A document must end here: the only stack left is the empty one.
  bool terminated(const GrammarState& state) const;
  // The fewest bytes that complete a document from `state` (0 when accepting).
  int32_t distance(const GrammarState& state) const;
  // True when `bytes` is a complete document.
  bool matches(std::string_view bytes) const;

  size_t num_rules() const { return rules_.size(); }
  size_t num_elements() const { return elements_.size(); }

 private:
  void expand(Stack stack, std::vector<Stack>& out) const;
  static void normalize(std::vector<Stack>& stacks);

  struct Rule {
    std::string name;
    std::vector<int32_t> starts;  // first position of each alternative
  };
  std::vector<Rule> rules_;
  std::vector<Element> elements_;  // every alternative, each closed by a kEnd element
  std::vector<int32_t> rule_distance_;
  std::vector<int32_t> position_distance_;  // bytes from a position to its alternative's end
  int32_t root_ = -1;
  bool finalized_ = false;
};

}  // namespace longctx::structured
