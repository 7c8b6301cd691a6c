// longctx tokenize / detokenize: run the tokenizer of a model folder from the command line.
//   longctx tokenize --model DIR (--text T | --text-file F) [--add-special]  -> JSON id array
//   longctx detokenize --model DIR --ids 1,2,3 [--skip-special]             -> text
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "command.h"
#include "longctx/core/error.h"
#include "longctx/tokenizer/tokenizer.h"
#include "token_ids.h"

namespace longctx::cli {
namespace {

struct TokenizeOptions {
  std::string model, tokenizer, text, text_file, ids;
  bool add_special = false, skip_special = false;
};

// --model and --tokenizer are alternatives; each names a folder or a tokenizer.json file.
Tokenizer load_tokenizer(const TokenizeOptions& o) {
  const std::string& path = !o.tokenizer.empty() ? o.tokenizer : o.model;
  LONGCTX_CHECK(!path.empty(), ErrorCode::kInvalidArgument, "give --model DIR or --tokenizer DIR");
  return Tokenizer::load(path);
}

std::vector<TokenId> parse_ids(const std::string& s) {
  std::vector<TokenId> ids;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, ',')) {
    size_t b = item.find_first_not_of(" \t[]"), e = item.find_last_not_of(" \t[]");
    if (b == std::string::npos) continue;
    ids.push_back(parse_token_id(item.substr(b, e - b + 1), "--ids"));
  }
  return ids;
}

void run_tokenize(const TokenizeOptions& o) {
  std::string text = o.text;
  if (!o.text_file.empty()) {
    std::ifstream f(o.text_file, std::ios::binary);
    LONGCTX_CHECK(f.good(), ErrorCode::kNotFound, "cannot open --text-file {}", o.text_file);
    std::ostringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  Tokenizer tok = load_tokenizer(o);
  std::vector<TokenId> ids = tok.encode(text, o.add_special);
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(ids[i]);
  }
  out += "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

void run_detokenize(const TokenizeOptions& o) {
  Tokenizer tok = load_tokenizer(o);
  std::string text = tok.decode(parse_ids(o.ids), o.skip_special);
  text += "\n";
  std::fwrite(text.data(), 1, text.size(), stdout);
}

void add_source_options(CLI::App* cmd, TokenizeOptions& o) {
  cmd->add_option("--model", o.model, "model folder (tokenizer.json [+ tokenizer_config.json])");
  cmd->add_option("--tokenizer", o.tokenizer, "tokenizer folder or tokenizer.json (alternative)");
}

CommandRegistration reg_tokenize("tokenize", [](CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "print the token ids of a text as a JSON array");
  add_source_options(cmd, *o);
  auto* text = cmd->add_option("--text", o->text, "text to encode");
  auto* file = cmd->add_option("--text-file", o->text_file, "file whose bytes to encode");
  text->excludes(file);
  cmd->add_flag("--add-special", o->add_special, "apply the post-processor (e.g. BOS)");
  cmd->callback([o, text, file] {
    LONGCTX_CHECK(text->count() + file->count() == 1, ErrorCode::kInvalidArgument,
                  "give exactly one of --text and --text-file");
    TokenizeOptions copy = *o;
    if (file->count()) copy.text.clear();
    run_tokenize(copy);
  });
});

CommandRegistration reg_detokenize("detokenize", [](CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("detokenize", "print the text of comma-separated token ids");
  add_source_options(cmd, *o);
  cmd->add_option("--ids", o->ids, "comma-separated token ids, e.g. 1,2,3")->required();
  cmd->add_flag("--skip-special", o->skip_special, "leave special tokens out");
  cmd->callback([o] { run_detokenize(*o); });
});

}  // namespace
}  // namespace longctx::cli
