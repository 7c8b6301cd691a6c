// Encode throughput of longctx::Tokenizer on one core.
//
//   bench_tokenizer --tokenizer NAME=DIR [--tokenizer NAME=DIR ...] --text NAME=FILE [...]
//                   [--piece-chars 4096] [--repeats 5] [--dump DIR]
//
// For every tokenizer and text it times encoding the whole file and the file cut into pieces of
// --piece-chars characters (code points), each with a fresh tokenizer (so the first pass starts
// with an empty word cache) and then --repeats more passes; it prints MB/s of input bytes (1 MB =
// 1e6 bytes) for the first pass and the best pass, the token count and an FNV-1a hash of the
// ids. --dump writes the ids (one per line) to DIR/<tokenizer>.<text>.<mode>.ids so
// hf_tokenizer_bench.py can compare them with Hugging Face's.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/tokenizer/tokenizer.h"

namespace {

using longctx::TokenId;
using longctx::Tokenizer;

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::pair<std::string, std::string> split_eq(const std::string& s) {
  size_t p = s.find('=');
  if (p == std::string::npos) throw std::runtime_error("expected NAME=PATH, got " + s);
  return {s.substr(0, p), s.substr(p + 1)};
}

// Cuts text into pieces of `chars` code points (as Python's text[i:i+chars] would).
std::vector<std::string_view> pieces_of(const std::string& text, size_t chars) {
  std::vector<std::string_view> out;
  size_t start = 0, count = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) continue;
    if (count == chars) {
      out.emplace_back(text.data() + start, i - start);
      start = i;
      count = 0;
    }
    ++count;
  }
  if (start < text.size()) out.emplace_back(text.data() + start, text.size() - start);
  return out;
}

uint64_t fnv1a(const std::vector<TokenId>& ids) {
  uint64_t h = 1469598103934665603ull;
  for (TokenId id : ids) {
    h ^= static_cast<uint32_t>(id);
    h *= 1099511628211ull;
  }
  return h;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<std::string, std::string>> tokenizers, texts;
  size_t piece_chars = 4096;
  int repeats = 5;
  std::string dump;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--tokenizer") {
      tokenizers.push_back(split_eq(value()));
    } else if (a == "--text") {
      texts.push_back(split_eq(value()));
    } else if (a == "--piece-chars") {
      piece_chars = std::stoul(value());
    } else if (a == "--repeats") {
      repeats = std::stoi(value());
    } else if (a == "--dump") {
      dump = value();
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (tokenizers.empty() || texts.empty()) {
    std::fprintf(stderr, "usage: bench_tokenizer --tokenizer NAME=DIR --text NAME=FILE ...\n");
    return 2;
  }
  std::printf("%-8s %-8s %-7s %9s %12s %12s %9s %18s\n", "tokenizer", "text", "mode", "bytes",
              "first MB/s", "best MB/s", "tokens", "fnv1a(ids)");
  for (const auto& [tname, tdir] : tokenizers) {
    double t0 = now_s();
    Tokenizer::load(tdir);  // warm the file cache; the load time below is a second load
    t0 = now_s();
    Tokenizer probe = Tokenizer::load(tdir);
    std::printf("# %s: load %.3f s, vocab %zu\n", tname.c_str(), now_s() - t0, probe.vocab_size());
    for (const auto& [xname, xpath] : texts) {
      std::string text = read_all(xpath);
      for (const char* mode : {"whole", "pieces"}) {
        std::vector<std::string_view> parts = std::strcmp(mode, "whole") == 0
                                                  ? std::vector<std::string_view>{text}
                                                  : pieces_of(text, piece_chars);
        Tokenizer tok = Tokenizer::load(tdir);  // fresh: empty word cache
        std::vector<TokenId> ids, all, first_ids;
        double first = 0, best = 1e30;
        for (int r = 0; r <= repeats; ++r) {
          all.clear();
          double s = now_s();
          for (std::string_view p : parts) {
            ids.clear();
            tok.encode_into(p, false, ids);
            if (r == 0) all.insert(all.end(), ids.begin(), ids.end());
          }
          double e = now_s() - s;
          if (r == 0) {
            first = e;
            if (!dump.empty()) {
              std::ofstream f(dump + "/" + tname + "." + xname + "." + mode + ".ids");
              for (TokenId id : all) f << id << "\n";
            }
            std::printf("%-8s %-8s %-7s %9zu %12.2f ", tname.c_str(), xname.c_str(), mode,
                        text.size(), text.size() / first / 1e6);
            std::fflush(stdout);
            first_ids = all;
          }
          if (r > 0 || repeats == 0) best = std::min(best, e);
        }
        std::printf("%12.2f %9zu %18llx\n", text.size() / best / 1e6, first_ids.size(),
                    static_cast<unsigned long long>(fnv1a(first_ids)));
      }
    }
  }
  return 0;
}
