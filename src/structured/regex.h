// Regular expressions -> Grammar (structured/grammar.h). The accepted subset of ECMA-262 (what
// JSON Schema's `pattern` and vLLM's `regex` are written in), matched over code points (UTF-8):
//  - literals; escapes \d \D \w \W \s \S, \n \r \t \f \v \0, \xHH, \uHHHH, \/ and any escaped
//    punctuation; `.` (any code point but the line terminators \n \r U+2028 U+2029);
//  - classes [...] with ranges, escapes and negation [^...];
//  - groups ( ), (?: ), (?<name> ); alternation |;
//  - quantifiers * + ? {n} {n,} {n,m} with counts up to kMaxRegexRepeat;
//  - ^ at the start and $ at the end of a top-level alternative.
// Refused with Error(kUnsupported) naming the construct and its offset: backreferences,
// lookahead / lookbehind, lazy and possessive quantifiers, word boundaries \b \B, anchors
// elsewhere, \p{...}, \c, flags. A malformed pattern is Error(kInvalidArgument).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "structured/grammar.h"

namespace longctx::structured {

constexpr int64_t kMaxRegexRepeat = 1000;

struct RegexOptions {
  // JSON Schema `pattern` semantics: not anchored, so any text may come before the match unless
  // the pattern starts with ^ and after it unless it ends with $. False: the whole output
  // matches (vLLM's `regex`; ^ and $ at the ends change nothing).
  bool search = false;
  // Generate the characters as the content of a JSON string: " \ and control characters
  // written as escapes (\" \\ \n \t \r \b \f \u00XX), everything else as UTF-8.
  bool json_string = false;
  // Starts every error message ("JSON schema: 'pattern' (at #/properties/id)").
  std::string context = "regex";
};

// Adds to `g` the rules of the strings `pattern` matches and returns the top one.
int32_t add_regex_rule(Grammar& g, std::string_view pattern, const RegexOptions& options);

// A finalized grammar of the outputs that match `pattern` whole.
Grammar regex_grammar(std::string_view pattern);

// A finalized grammar of exactly the given strings (vLLM's `choice`); at least one.
Grammar choice_grammar(const std::vector<std::string>& choices);

}  // namespace longctx::structured
