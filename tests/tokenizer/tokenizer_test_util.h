// Shared helpers for the tokenizer tests.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/test_data.h"
#include "longctx/core/error.h"
#include "longctx/tokenizer/tokenizer.h"

namespace longctx::testing {

// build/test-data/tokenizers/<name> (fetched by tools/fetch_test_data.sh).
inline std::string real_tokenizer_dir(const std::string& name) {
  return fetched_data_dir() + "/tokenizers/" + name;
}

inline nlohmann::json load_fixture(const std::string& name) {
  std::ifstream f(test_data_dir() + "/fixtures/tokenizers/" + name + ".json");
  EXPECT_TRUE(f.good()) << "missing fixture " << name;
  return nlohmann::json::parse(f);
}

// Loads (once per process) the real tokenizer; fails the test when the data was not fetched.
inline const Tokenizer* real_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second.get();
  std::string dir = real_tokenizer_dir(name);
  if (!std::filesystem::exists(dir + "/tokenizer.json")) return nullptr;
  auto t = std::make_unique<Tokenizer>(Tokenizer::load(dir));
  return cache.emplace(name, std::move(t)).first->second.get();
}

inline bool utf8_valid(const std::string& s) {
  size_t i = 0;
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  while (i < s.size()) {
    unsigned char c = b(i);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (int k = 1; k < n; ++k)
      if ((b(i + k) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

}  // namespace longctx::testing

#define LONGCTX_REQUIRE_TOKENIZER(var, name)                                  \
  const ::longctx::Tokenizer* var = ::longctx::testing::real_tokenizer(name); \
  ASSERT_NE(var, nullptr) << "real tokenizer files missing under "            \
                          << ::longctx::testing::real_tokenizer_dir(name)     \
                          << " (run tools/fetch_test_data.sh)"
