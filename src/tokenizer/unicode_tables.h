// Unicode data for NFC (generated into unicode_tables.cpp by tools/gen_unicode_tables.py).
#pragma once

#include <cstddef>
#include <cstdint>

namespace longctx::tokenizer::unicode {

struct CccRange {
  uint32_t first, last;
  uint8_t ccc;  // canonical combining class (non-zero)
};
struct Decomposition {
  uint32_t cp, first, second;  // second == 0: singleton decomposition
};
struct Composition {
  uint32_t first, second, composite;  // sorted by (first, second)
};
struct CpRange {
  uint32_t first, last;
};

extern const char* const kUnicodeVersion;
extern const CccRange kCccRanges[];
extern const size_t kNumCccRanges;
extern const Decomposition kDecompositions[];  // sorted by cp
extern const size_t kNumDecompositions;
extern const Composition kCompositions[];
extern const size_t kNumCompositions;
extern const CpRange kNfcQcNotYes[];  // code points whose NFC quick check is No or Maybe
extern const size_t kNumNfcQcNotYes;

}  // namespace longctx::tokenizer::unicode
