// Request parsing edge cases found by fuzz/fuzz_openai_request: each must be a 4xx ApiError,
// never undefined behaviour (the fuzz build runs UBSan).
#include <gtest/gtest.h>

#include "server/openai_protocol.h"

namespace longctx::server {
namespace {

int status_of(const std::string& body, Endpoint endpoint) {
  try {
    parse_generation_request(Json::parse(body), endpoint);
  } catch (const ApiError& e) {
    return e.status();
  }
  return 200;
}

TEST(OpenAIProtocol, HugeIntegralFloatsAreTooLargeNotUndefined) {
  // 1.1e38 does not fit int64: converting it before the range check was undefined behaviour.
  EXPECT_EQ(status_of(R"({"prompt":"hi","max_tokens":111111111111111111111111111111111111118})",
                      Endpoint::kCompletions),
            400);
  EXPECT_EQ(status_of(R"({"prompt":"hi","max_tokens":-1e300})", Endpoint::kCompletions), 400);
  EXPECT_EQ(status_of(R"({"prompt":"hi","seed":9.3e18})", Endpoint::kCompletions), 400);
  EXPECT_EQ(status_of(R"({"prompt":[1e20]})", Endpoint::kCompletions), 400);
  EXPECT_EQ(status_of(R"({"prompt":"hi","max_tokens":4.5})", Endpoint::kCompletions), 422);
  EXPECT_EQ(status_of(R"({"prompt":"hi","max_tokens":4.0})", Endpoint::kCompletions), 200);
}

}  // namespace
}  // namespace longctx::server
