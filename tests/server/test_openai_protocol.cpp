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

TEST(OpenAIProtocol, ResponseFormat) {
  auto parse = [](const std::string& rf, Endpoint e = Endpoint::kChat) {
    const std::string body =
        (e == Endpoint::kChat ? R"({"messages":[{"role":"user","content":"hi"}])"
                              : std::string(R"({"prompt":"hi")")) +
        std::string(R"(,"response_format":)") + rf + "}";
    return parse_generation_request(Json::parse(body), e);
  };
  EXPECT_FALSE(parse(R"({"type":"text"})").params.structured.enabled());
  EXPECT_EQ(parse(R"({"type":"json_object"})", Endpoint::kCompletions).params.structured.kind,
            StructuredOutput::Kind::kJsonObject);
  // The schema keeps the client's key order ("b" before "a": Json is an ordered_json).
  const GenerationRequest r = parse(
      R"({"type":"json_schema","json_schema":{"name":"x","strict":true,"schema":{"type":"object",
          "properties":{"b":{"type":"integer"},"a":{"type":"string"}}}}})");
  EXPECT_EQ(r.params.structured.kind, StructuredOutput::Kind::kJsonSchema);
  EXPECT_LT(r.params.structured.json_schema.find("\"b\""),
            r.params.structured.json_schema.find("\"a\""));
  // Errors: the status, and the param / keyword they name.
  const std::vector<std::tuple<std::string, int, std::string>> bad = {
      {R"("json")", 400, "response_format"},
      {R"({"type":"yaml"})", 400, "\"yaml\""},
      {R"({"type":"json_schema"})", 400, "json_schema"},
      {R"({"type":"json_schema","json_schema":{"name":"x"}})", 400, "schema"},
      {R"({"type":"json_schema","json_schema":{"schema":{},"strict":"yes"}})", 400, "strict"},
      {R"({"type":"json_schema","json_schema":{"schema":{"type":"string","format":"email"}}})", 400,
       "'format'"},
      {R"({"type":"json_schema","json_schema":{"schema":{"properties":{"x":{"not":{}}}}}})", 400,
       "'not' (at #/properties/x)"},
  };
  for (const auto& [rf, status, needle] : bad) {
    try {
      parse(rf);
      ADD_FAILURE() << rf << " accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), status) << rf << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << rf << ": " << e.what();
      EXPECT_EQ(e.param(), "response_format") << rf;
    }
  }
}

TEST(OpenAIProtocol, ToolChoiceConstrainsToADeclaredToolAndStreamsTheCall) {
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object",
        "properties":{"x":{"type":"integer"}},"required":["x"]}}},
        {"type":"function","function":{"name":"g"}}])";
  auto chat = [&](const std::string& extra) {
    return parse_generation_request(
        Json::parse(R"({"messages":[{"role":"user","content":"hi"}],)" + tools + extra + "}"),
        Endpoint::kChat);
  };
  const GenerationRequest req = chat(R"(,"tool_choice":"required")");
  EXPECT_TRUE(req.tool_call);
  EXPECT_EQ(req.params.structured.kind, StructuredOutput::Kind::kJsonSchema);
  EXPECT_NE(req.params.structured.json_schema.find("anyOf"), std::string::npos);
  EXPECT_TRUE(req.chat_template_kwargs.contains("tools"));  // the template renders them
  const GenerationRequest named =
      chat(R"(,"tool_choice":{"type":"function","function":{"name":"g"}})");
  EXPECT_EQ(named.params.structured.json_schema.find("anyOf"), std::string::npos);
  EXPECT_NE(named.params.structured.json_schema.find(R"("const":"g")"), std::string::npos);
  EXPECT_FALSE(chat(R"(,"tool_choice":"none")").tool_call);
  for (const auto& [extra, status] : std::vector<std::pair<std::string, int>>{
           {"", 400},  // auto by default
           {R"(,"tool_choice":"auto")", 400},
           {R"(,"tool_choice":{"type":"function","function":{"name":"h"}})", 400},
           {R"(,"tool_choice":7)", 400},
           {R"(,"tool_choice":"required","response_format":{"type":"json_object"})", 400}}) {
    try {
      chat(extra);
      ADD_FAILURE() << extra << " accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), status) << extra << ": " << e.what();
    }
  }
  EXPECT_EQ(status_of(R"({"prompt":"hi",)" + tools + "}", Endpoint::kCompletions), 400);

  // Streamed: nothing until the name is complete, then id + name, argument fragments with the
  // call's closing brace held back, and finish_reason tool_calls.
  ResponseBuilder b(Endpoint::kChat, "m", nullptr, false, true);
  auto delta = [](const std::string& sse) {
    if (sse.empty()) return Json();
    return Json::parse(sse.substr(6))["choices"][0];
  };
  EXPECT_EQ(b.delta_chunk(R"({"name":"f)", {}, ""), "");
  Json d = delta(b.delta_chunk(R"(","arguments":{"x)", {}, ""));
  const Json& first = d["delta"]["tool_calls"][0];
  EXPECT_EQ(first["function"]["name"], "f");
  EXPECT_EQ(first["type"], "function");
  EXPECT_TRUE(first.contains("id"));
  std::string args = first["function"]["arguments"];
  d = delta(b.delta_chunk(R"(":12})", {}, ""));
  EXPECT_FALSE(d["delta"]["tool_calls"][0].contains("id"));
  args += d["delta"]["tool_calls"][0]["function"]["arguments"].get<std::string>();
  d = delta(b.delta_chunk("}", {}, "stop"));
  if (d["delta"].contains("tool_calls"))
    args += d["delta"]["tool_calls"][0]["function"]["arguments"].get<std::string>();
  EXPECT_EQ(args, R"({"x":12})");
  EXPECT_EQ(d["finish_reason"], "tool_calls");
  // Not streamed.
  ResponseBuilder full(Endpoint::kChat, "m", nullptr, false, true);
  RequestOutput out;
  out.text = R"({"name":"f","arguments":{"x":3}})";
  out.finish_reason = FinishReason::kStop;
  const Json r = Json::parse(full.full_response(out))["choices"][0];
  EXPECT_EQ(r["finish_reason"], "tool_calls");
  EXPECT_TRUE(r["message"]["content"].is_null());
  EXPECT_EQ(r["message"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(r["message"]["tool_calls"][0]["function"]["arguments"], R"({"x":3})");
}

}  // namespace
}  // namespace longctx::server
