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
  EXPECT_EQ(status_of(R"({"prompt":"hi","max_tokens":4.5})", Endpoint::kCompletions), 400);
  EXPECT_EQ(status_of(R"({"prompt":"hi","max_tokens":4.0})", Endpoint::kCompletions), 200);
}

TEST(OpenAIProtocol, ContentPartsOfTheWrongTypeAre400) {
  // A part whose "type" was not a string escaped as json::type_error (a crash in the server).
  for (const char* part : {R"({"type":["text"],"text":"hi"})", R"({"type":7,"text":"hi"})",
                           R"({"type":"text","text":["hi"]})", R"({"type":"text"})",
                           R"({"type":"image_url","text":"hi"})", R"("hi")", "null"}) {
    const std::string body =
        std::string(R"({"messages":[{"role":"user","content":[)") + part + "]}]}";
    EXPECT_EQ(status_of(body, Endpoint::kChat), 400) << part;
  }
  const GenerationRequest r = parse_generation_request(
      Json::parse(R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},)"
                  R"({"type":"text","text":"b"}]}]})"),
      Endpoint::kChat);
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0]["content"], "a\nb");
}

}  // namespace
}  // namespace longctx::server
