// Internals: NFC, lossy UTF-8, and the two BPE merge loops agreeing.
#include <gtest/gtest.h>

#include <random>

#include "tokenizer/bpe.h"
#include "tokenizer/unicode.h"

namespace longctx::tokenizer {
namespace {

TEST(Unicode, Nfc) {
  EXPECT_EQ(unicode::nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(unicode::nfc("e\xCC\x81"), "\xC3\xA9");     // e + U+0301 -> é
  EXPECT_EQ(unicode::nfc("\xE2\x84\xAB"), "\xC3\x85");  // U+212B ANGSTROM SIGN -> Å
  EXPECT_EQ(unicode::nfc("\xE1\x84\x80\xE1\x85\xA1"), "\xEA\xB0\x80");  // Hangul L+V -> 가
  EXPECT_EQ(unicode::nfc("\xEA\xB0\x80\xE1\x86\xA8"), "\xEA\xB0\x81");  // LV + T -> 각
  // U+1E0B U+0323 -> U+1E0D U+0307 (reordering by combining class, then composition).
  EXPECT_EQ(unicode::nfc("\xE1\xB8\x8B\xCC\xA3"), "\xE1\xB8\x8D\xCC\x87");
  // Compatibility characters stay (NFC, not NFKC).
  EXPECT_EQ(unicode::nfc("\xEF\xAC\x81"), "\xEF\xAC\x81");  // ﬁ
  EXPECT_TRUE(unicode::nfc_quick_check("caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87"));
  EXPECT_FALSE(unicode::nfc_quick_check("cafe\xCC\x81"));
}

TEST(Unicode, LossyAndIncompleteTail) {
  std::string out;
  unicode::append_lossy_utf8(out,
                             "a\xE2\x82"
                             "b\xFF\xF0\x9F\x98");
  EXPECT_EQ(out,
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(unicode::incomplete_utf8_tail("ab\xF0\x9F\x98"), 3u);
  EXPECT_EQ(unicode::incomplete_utf8_tail("ab\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(unicode::incomplete_utf8_tail("ab\xE0\x80"), 0u);  // E0 80 can never be valid
  EXPECT_EQ(unicode::incomplete_utf8_tail("\x80\x80"), 0u);
  EXPECT_FALSE(unicode::is_valid_utf8("\xED\xA0\x80"));  // a surrogate
  EXPECT_FALSE(unicode::is_valid_utf8("\xC0\xAF"));      // overlong
  EXPECT_TRUE(unicode::is_valid_utf8("\xF4\x8F\xBF\xBF"));
}

TEST(Bpe, ScanAndHeapMergeLoopsAgree) {
  // Bytes a, b, c and merges with overlapping ranks, then random words of every length.
  StringIdMap vocab;
  int next = 0;
  for (const char* s :
       {"a", "b", "c", "ab", "bc", "ca", "abc", "aa", "aaa", "aaaa", "bca", "cab", "abab", "cc"})
    vocab[s] = next++;
  std::vector<std::pair<std::string, std::string>> merges = {
      {"a", "a"},  {"b", "c"},  {"a", "b"},  {"c", "a"},   {"aa", "a"}, {"aa", "aa"},
      {"ab", "c"}, {"bc", "a"}, {"ca", "b"}, {"ab", "ab"}, {"c", "c"}};
  BpeModel model(vocab, merges, BpeOptions{});
  std::mt19937 rng(7);
  for (int n = 1; n <= 64; ++n) {
    for (int rep = 0; rep < 50; ++rep) {
      std::string w;
      for (int i = 0; i < n; ++i) w.push_back("abc"[rng() % 3]);
      std::vector<int32_t> scan, heap;
      model.merge_word(w, scan);
      model.merge_word_heap(w, heap);
      ASSERT_EQ(scan, heap) << w;
    }
  }
}

}  // namespace
}  // namespace longctx::tokenizer
