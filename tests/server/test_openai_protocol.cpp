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

// tool_choice "auto" and the reasoning parser: which requests parse output, and the 400s.
TEST(OpenAIProtocol, ToolChoiceAutoNeedsAParser) {
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}},
        {"type":"function","function":{"name":"g"}}])";
  auto chat = [&](const std::string& extra, OutputParsers parsers) {
    return parse_generation_request(
        Json::parse(R"({"messages":[{"role":"user","content":"hi"}],)" + tools + extra + "}"),
        Endpoint::kChat, parsers);
  };
  const OutputParsers hermes{ToolParserKind::kHermes, ReasoningParserKind::kNone};
  for (const std::string extra : {std::string(), std::string(R"(,"tool_choice":"auto")")}) {
    try {
      chat(extra, {});
      ADD_FAILURE() << "auto accepted without a parser";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.param(), "tool_choice");
      EXPECT_NE(std::string(e.what()).find("--tool-call-parser"), std::string::npos) << e.what();
    }
    const GenerationRequest r = chat(extra, hermes);
    EXPECT_FALSE(r.tool_call);
    EXPECT_FALSE(r.params.structured.enabled());  // generated freely, then parsed
    EXPECT_EQ(r.parsing.tool, ToolParserKind::kHermes);
    EXPECT_EQ(r.parsing.tool_names, (std::vector<std::string>{"f", "g"}));
    EXPECT_TRUE(r.parsing.parallel_tool_calls);
    EXPECT_TRUE(r.chat_template_kwargs.contains("tools"));
  }
  EXPECT_FALSE(chat(R"(,"parallel_tool_calls":false)", hermes).parsing.parallel_tool_calls);
  EXPECT_EQ(status_of(R"({"messages":[{"role":"user","content":"hi"}],"parallel_tool_calls":1})",
                      Endpoint::kChat),
            400);
  // none: no parsing, no tools in the prompt.
  const GenerationRequest none = chat(R"(,"tool_choice":"none")", hermes);
  EXPECT_EQ(none.parsing.tool, ToolParserKind::kNone);
  EXPECT_FALSE(none.chat_template_kwargs.contains("tools"));
  // Mistral's [TOOL_CALLS] is a special token: kept in the text.
  EXPECT_FALSE(
      chat("", {ToolParserKind::kMistral, ReasoningParserKind::kNone}).params.skip_special_tokens);
  // Reasoning: parsed unless the output is constrained.
  const OutputParsers qwen3{ToolParserKind::kNone, ReasoningParserKind::kQwen3};
  auto plain = [&](const std::string& extra) {
    return parse_generation_request(
        Json::parse(R"({"messages":[{"role":"user","content":"hi"}])" + extra + "}"),
        Endpoint::kChat, qwen3);
  };
  EXPECT_EQ(plain("").parsing.reasoning, ReasoningParserKind::kQwen3);
  EXPECT_EQ(plain(R"(,"response_format":{"type":"json_object"})").parsing.reasoning,
            ReasoningParserKind::kNone);
  EXPECT_EQ(chat(R"(,"tool_choice":"required")", qwen3).parsing.reasoning,
            ReasoningParserKind::kNone);
}

// A reply with reasoning, text and two Hermes calls, streamed in 3-byte pieces: reasoning
// deltas, then content deltas, then each call as OpenAI streams it (index, id, type, name; then
// the arguments); the stream assembles into the non-streamed message.
TEST(OpenAIProtocol, ParsedToolCallsAndReasoningStreamAsOpenAI) {
  const std::string text =
      "<think>\nThe user wants weather.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"f\", "
      "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", "
      "\"arguments\": {}}\n</tool_call>";
  OutputParsing parsing;
  parsing.tool = ToolParserKind::kHermes;
  parsing.tool_names = {"f", "g"};
  parsing.reasoning = ReasoningParserKind::kQwen3;

  RequestOutput out;
  out.text = text;
  out.finish_reason = FinishReason::kStop;
  ResponseBuilder full(Endpoint::kChat, "m", nullptr, false, false, parsing);
  const Json r = Json::parse(full.full_response(out))["choices"][0];
  EXPECT_EQ(r["finish_reason"], "tool_calls");
  const Json& msg = r["message"];
  EXPECT_EQ(msg["content"], "Checking.\n");
  EXPECT_EQ(msg["reasoning_content"], "\nThe user wants weather.\n");
  ASSERT_EQ(msg["tool_calls"].size(), 2u);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(msg["tool_calls"][1]["function"]["arguments"], "{}");
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  const std::string id0 = msg["tool_calls"][0]["id"], id1 = msg["tool_calls"][1]["id"];
  EXPECT_TRUE(id0.starts_with("call_") && id1.starts_with("call_") && id0 != id1);

  ResponseBuilder b(Endpoint::kChat, "m", nullptr, false, false, parsing);
  std::string events;
  for (size_t i = 0; i < text.size(); i += 3) events += b.delta_chunk(text.substr(i, 3), {}, "");
  events += b.delta_chunk("", {}, "stop");
  std::string reasoning, content, finish;
  Json calls = Json::array();
  bool content_seen = false;
  for (size_t at = 0; (at = events.find("data: ", at)) != std::string::npos;) {
    const size_t end = events.find("\n\n", at);
    const Json c = Json::parse(events.substr(at + 6, end - at - 6))["choices"][0];
    at = end;
    const Json& d = c["delta"];
    if (d.contains("reasoning_content")) {
      EXPECT_FALSE(content_seen) << "reasoning after content";
      reasoning += d["reasoning_content"].get<std::string>();
    }
    if (d.contains("content")) {
      content_seen = true;
      EXPECT_EQ(calls.size(), 0u) << "content after a call";
      content += d["content"].get<std::string>();
    }
    if (d.contains("tool_calls")) {
      const Json& tc = d["tool_calls"][0];
      const size_t index = tc["index"];
      if (index == calls.size()) {  // a call's first delta
        EXPECT_TRUE(tc.contains("id") && tc["type"] == "function");
        EXPECT_EQ(tc["function"]["arguments"], "");
        calls.push_back({{"id", tc["id"]}, {"name", tc["function"]["name"]}, {"arguments", ""}});
      } else {
        ASSERT_EQ(index + 1, calls.size());
        EXPECT_FALSE(tc.contains("id"));
        calls[index]["arguments"] = calls[index]["arguments"].get<std::string>() +
                                    tc["function"]["arguments"].get<std::string>();
      }
    }
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(reasoning, msg["reasoning_content"]);
  EXPECT_EQ(content, msg["content"]);
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_EQ(calls.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(calls[i]["name"], msg["tool_calls"][i]["function"]["name"]);
    EXPECT_EQ(calls[i]["arguments"], msg["tool_calls"][i]["function"]["arguments"]);
    EXPECT_TRUE(calls[i]["id"].get<std::string>().starts_with("call_"));
  }

  // parallel_tool_calls false: the first call only.
  parsing.parallel_tool_calls = false;
  ResponseBuilder one(Endpoint::kChat, "m", nullptr, false, false, parsing);
  EXPECT_EQ(Json::parse(one.full_response(out))["choices"][0]["message"]["tool_calls"].size(), 1u);
  // No call: plain content, finish_reason stop, no tool_calls.
  out.text = "It is sunny.";
  ResponseBuilder plain(Endpoint::kChat, "m", nullptr, false, false, parsing);
  const Json p = Json::parse(plain.full_response(out))["choices"][0];
  EXPECT_EQ(p["finish_reason"], "stop");
  EXPECT_EQ(p["message"]["content"], "It is sunny.");
  EXPECT_TRUE(p["message"]["reasoning_content"].is_null());
  EXPECT_FALSE(p["message"].contains("tool_calls"));
}

}  // namespace
}  // namespace longctx::server
