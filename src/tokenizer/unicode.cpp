#include "tokenizer/unicode.h"

#include <algorithm>
#include <vector>

#include "tokenizer/unicode_tables.h"

namespace longctx::tokenizer::unicode {
namespace {

// For a lead byte: the sequence length and the allowed range of the second byte (Unicode
// Table 3-7, which excludes overlongs, surrogates and code points past U+10FFFF). len 0: the
// byte cannot start a sequence.
struct LeadInfo {
  int len;
  uint8_t lo, hi;
};

inline LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Number of bytes at s[i] that form a (possibly complete) valid prefix of a sequence; at least
// 1 for a bad byte, so a lossy decoder always advances.
int valid_prefix_length(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  LeadInfo li = lead_info(p[i]);
  if (li.len <= 1) return 1;
  int k = 1;
  if (i + 1 >= s.size() || p[i + 1] < li.lo || p[i + 1] > li.hi) return 1;
  k = 2;
  while (k < li.len && i + k < s.size() && (p[i + k] & 0xC0) == 0x80) ++k;
  return k;
}

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint8_t ccc(uint32_t cp) {
  if (cp < 0x300) return 0;
  const CccRange* end = kCccRanges + kNumCccRanges;
  const CccRange* it = std::upper_bound(kCccRanges, end, cp,
                                        [](uint32_t v, const CccRange& r) { return v < r.first; });
  if (it == kCccRanges) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

void decompose_into(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0) {
    const Decomposition* end = kDecompositions + kNumDecompositions;
    const Decomposition* it = std::lower_bound(
        kDecompositions, end, cp, [](const Decomposition& d, uint32_t v) { return d.cp < v; });
    if (it != end && it->cp == cp) {
      decompose_into(it->first, out);
      if (it->second != 0) decompose_into(it->second, out);
      return;
    }
  }
  out.push_back(cp);
}

// The primary composite of (a, b), or 0.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const Composition* end = kCompositions + kNumCompositions;
  const Composition* it =
      std::lower_bound(kCompositions, end, std::pair<uint32_t, uint32_t>(a, b),
                       [](const Composition& c, const std::pair<uint32_t, uint32_t>& v) {
                         return c.first < v.first || (c.first == v.first && c.second < v.second);
                       });
  if (it != end && it->first == a && it->second == b) return it->composite;
  return 0;
}

bool nfc_qc_not_yes(uint32_t cp) {
  const CpRange* end = kNfcQcNotYes + kNumNfcQcNotYes;
  const CpRange* it = std::upper_bound(kNfcQcNotYes, end, cp,
                                       [](uint32_t v, const CpRange& r) { return v < r.first; });
  if (it == kNfcQcNotYes) return false;
  --it;
  return cp <= it->last;
}

}  // namespace

int valid_sequence_length(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  LeadInfo li = lead_info(p[i]);
  if (li.len == 1) return 1;
  if (li.len == 0 || i + li.len > s.size()) return 0;
  if (p[i + 1] < li.lo || p[i + 1] > li.hi) return 0;
  for (int k = 2; k < li.len; ++k)
    if ((p[i + k] & 0xC0) != 0x80) return 0;
  return li.len;
}

uint32_t decode_at(std::string_view s, size_t i, int len) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + i;
  switch (len) {
    case 1:
      return p[0];
    case 2:
      return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    case 3:
      return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    default:
      return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) |
             (p[3] & 0x3Fu);
  }
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    int len = valid_sequence_length(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

void append_lossy_utf8(std::string& out, std::string_view bytes) {
  size_t i = 0, run = 0;  // [run, i) is valid and not yet copied
  while (i < bytes.size()) {
    if (static_cast<uint8_t>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    int len = valid_sequence_length(bytes, i);
    if (len > 0) {
      i += len;
      continue;
    }
    out.append(bytes.data() + run, i - run);
    append_utf8(out, kReplacementChar);
    i += valid_prefix_length(bytes, i);
    run = i;
  }
  out.append(bytes.data() + run, i - run);
}

size_t incomplete_utf8_tail(std::string_view s) {
  size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    size_t p = n - back;
    auto b = static_cast<uint8_t>(s[p]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: the lead is further back
    LeadInfo li = lead_info(b);
    if (li.len <= static_cast<int>(back)) return 0;  // complete, ASCII or a bad lead
    return valid_prefix_length(s, p) == static_cast<int>(back) ? back : 0;
  }
  return 0;
}

bool is_whitespace(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool nfc_quick_check(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    auto b = static_cast<uint8_t>(s[i]);
    if (b < 0xCC) {  // every code point below U+0300 is NFC-stable with combining class 0
      i += b < 0x80 ? 1 : 2;
      continue;
    }
    int len = valid_sequence_length(s, i);
    if (len == 0) return false;
    uint32_t cp = decode_at(s, i, len);
    if (ccc(cp) != 0 || nfc_qc_not_yes(cp)) return false;
    i += len;
  }
  return true;
}

std::string nfc(std::string_view s) {
  if (nfc_quick_check(s)) return std::string(s);
  // 1. Full canonical decomposition.
  std::vector<uint32_t> cps;
  cps.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    int len = valid_sequence_length(s, i);
    if (len == 0) {  // callers pass valid UTF-8; be safe anyway
      cps.push_back(kReplacementChar);
      ++i;
      continue;
    }
    decompose_into(decode_at(s, i, len), cps);
    i += len;
  }
  // 2. Canonical ordering: stable sort of each run of non-starters by combining class.
  std::vector<uint8_t> cls(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) cls[i] = ccc(cps[i]);
  for (size_t i = 0; i < cps.size();) {
    if (cls[i] == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && cls[j] != 0) ++j;
    if (j - i > 1) {  // insertion sort keeps it stable and runs are short
      for (size_t a = i + 1; a < j; ++a)
        for (size_t b = a; b > i && cls[b - 1] > cls[b]; --b) {
          std::swap(cls[b - 1], cls[b]);
          std::swap(cps[b - 1], cps[b]);
        }
    }
    i = j;
  }
  // 3. Canonical composition (UAX #15): a character combines with the last starter unless a
  // character between them has a combining class >= its own (blocked).
  if (!cps.empty()) {
    size_t starter = 0, out = 1;
    int last_class = cls[0] == 0 ? 0 : 256;
    for (size_t i = 1; i < cps.size(); ++i) {
      uint32_t c = cps[i];
      int c_class = cls[i];
      uint32_t comp = compose(cps[starter], c);
      if (comp != 0 && (last_class < c_class || last_class == 0)) {
        cps[starter] = comp;
        continue;
      }
      if (c_class == 0) starter = out;
      last_class = c_class;
      cps[out++] = c;
    }
    cps.resize(out);
  }
  std::string result;
  result.reserve(s.size() + 8);
  for (uint32_t cp : cps) append_utf8(result, cp);
  return result;
}

}  // namespace longctx::tokenizer::unicode
