// The server's request bodies: parsed with the server's depth limit, then type-checked as a
// completions and as a chat request, the sampling ranges validated and the error body built.
// An Error or an ApiError (the 4xx answer the client gets) is the expected outcome.
#include "fuzz_common.h"
#include "longctx/core/json_limits.h"
#include "server/openai_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace longctx;
  using namespace longctx::server;
  Json body;
  try {
    body = parse_ordered_json(fuzz::as_text(data, size), "the request body", 64);
  } catch (const Error& e) {
    (void)error_body(400, e.what());
    return 0;
  }
  for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChat}) {
    try {
      GenerationRequest g = parse_generation_request(body, endpoint);
      fuzz::expect_clean([&] { g.params.validate(); });
    } catch (const ApiError& e) {
      (void)error_body(e);
    } catch (const Error& e) {
      (void)error_body(to_api_error(e));
    }
  }
  return 0;
}
