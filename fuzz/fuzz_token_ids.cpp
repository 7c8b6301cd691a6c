// The --ids parser (tools/longctx/token_ids.cpp): the input is a comma-separated id list as
// given on the command line; every item either parses to an id in [0, INT32_MAX] or is an Error.
#include <string>

#include "fuzz_common.h"
#include "token_ids.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace longctx;
  std::string_view text = fuzz::as_text(data, size);
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item(text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    fuzz::expect_clean([&] {
      int32_t id = cli::parse_token_id(item, "--ids");
      if (id < 0) __builtin_trap();  // the contract: [0, INT32_MAX]
    });
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return 0;
}
