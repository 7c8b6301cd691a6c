// UTF-8 helpers and NFC normalization for the tokenizer.
//
// NFC coverage: full canonical decomposition (table + algorithmic Hangul), canonical ordering by
// combining class, and canonical composition with the standard blocking rule, using the Unicode
// data of tools/gen_unicode_tables.py. Text whose code points all pass the NFC quick check (all
// ASCII and most precomposed text) is returned unchanged without any work beyond the scan.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace longctx::tokenizer::unicode {

constexpr uint32_t kReplacementChar = 0xFFFD;

// Length of the valid UTF-8 sequence starting at s[i], or 0 when the bytes there are not a
// complete valid sequence (overlong, surrogate, > U+10FFFF, truncated, stray continuation).
int valid_sequence_length(std::string_view s, size_t i);

// Decodes the valid sequence of length `len` at s[i].
uint32_t decode_at(std::string_view s, size_t i, int len);

// Appends the UTF-8 encoding of cp.
void append_utf8(std::string& out, uint32_t cp);

bool is_valid_utf8(std::string_view s);

// Converts bytes to valid UTF-8 the way Rust's String::from_utf8_lossy does: each maximal
// invalid subpart (a truncated prefix of a valid sequence, or a single bad byte) becomes one
// U+FFFD. Appends to out.
void append_lossy_utf8(std::string& out, std::string_view bytes);

// Number of trailing bytes of s that form a valid but incomplete UTF-8 sequence (0..3): more
// bytes could still complete it, so a streaming decoder must hold them back.
size_t incomplete_utf8_tail(std::string_view s);

// Unicode White_Space property (what Rust's char::is_whitespace tests).
bool is_whitespace(uint32_t cp);

// True when NFC(s) == s is guaranteed by the quick check (s must be valid UTF-8).
bool nfc_quick_check(std::string_view s);

// NFC normalization of valid UTF-8 text.
std::string nfc(std::string_view s);

}  // namespace longctx::tokenizer::unicode
