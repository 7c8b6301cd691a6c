// GPT-2's byte-level alphabet: every byte maps to one printable code point, so byte-level BPE
// vocabularies spell arbitrary bytes as text (e.g. ' ' -> 'Ġ', '\n' -> 'Ċ').
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace longctx::tokenizer {

// The code point byte b is spelled with.
uint32_t byte_to_char(uint8_t b);

// The byte spelled by code point cp, if cp is in the alphabet.
std::optional<uint8_t> char_to_byte(uint32_t cp);

// Decodes a vocabulary string spelled in the byte-level alphabet into raw bytes; nullopt when
// it holds a character outside the alphabet (or is not valid UTF-8).
std::optional<std::string> byte_level_decode(std::string_view token);

// Spells raw bytes in the byte-level alphabet (for id_to_token-style display).
std::string byte_level_encode(std::string_view bytes);

}  // namespace longctx::tokenizer
