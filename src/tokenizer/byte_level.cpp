#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/unicode.h"

namespace longctx::tokenizer {
namespace {

struct Tables {
  std::array<uint32_t, 256> to_char{};
  std::array<int16_t, 512> to_byte{};  // indexed by code point; every alphabet char is < 324
  Tables() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_char[b] = printable ? static_cast<uint32_t>(b) : next++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t byte_to_char(uint8_t b) { return tables().to_char[b]; }

std::optional<uint8_t> char_to_byte(uint32_t cp) {
  if (cp >= 512 || tables().to_byte[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(tables().to_byte[cp]);
}

std::optional<std::string> byte_level_decode(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    int len = unicode::valid_sequence_length(token, i);
    if (len == 0) return std::nullopt;
    auto b = char_to_byte(unicode::decode_at(token, i, len));
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
    i += len;
  }
  return out;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) unicode::append_utf8(out, byte_to_char(static_cast<uint8_t>(c)));
  return out;
}

}  // namespace longctx::tokenizer
