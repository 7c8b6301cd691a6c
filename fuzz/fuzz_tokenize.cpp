// Encode/decode with a real byte-level BPE tokenizer (the needle model's, LONGCTX_FUZZ_TOKENIZER):
// the input is the text to encode, and its bytes reread as ids are decoded.
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "longctx/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace longctx;
  static const Tokenizer tok = Tokenizer::from_file(LONGCTX_FUZZ_TOKENIZER);
  fuzz::expect_clean([&] {
    std::string_view text = fuzz::as_text(data, size);
    std::vector<TokenId> ids = tok.encode(text, size % 2 == 0);
    tok.decode(ids, size % 3 == 0);
    std::vector<TokenId> raw(size / sizeof(TokenId));
    if (!raw.empty()) std::memcpy(raw.data(), data, raw.size() * sizeof(TokenId));
    tok.decode(raw, false);  // out-of-range ids are an Error, not a read past a table
  });
  return 0;
}
