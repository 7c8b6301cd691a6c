// tokenizer.json loading: the input is the file; a file that loads is then used to encode and
// decode a fixed text (with and without special tokens) and every id it names.
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "longctx/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace longctx;
  fuzz::expect_clean([&] {
    Tokenizer t = Tokenizer::from_json(fuzz::as_text(data, size), "fuzz.json");
    const std::string text = "Hello, wörld! <|im_start|>user\n  12345 \xF0\x9F\x98\x80 tabs\t\tend";
    std::vector<TokenId> ids = t.encode(text, true);
    t.decode(ids, false);
    t.decode(ids, true);
    std::vector<TokenId> all;
    for (TokenId id = 0; id < 300; ++id) all.push_back(id);
    t.decode(all, false);
  });
  return 0;
}
