// UTF-8 helpers shared by the tokenizers and the template engine.
//
// Decoding follows the WHATWG Encoding Standard (what JavaScript's
// TextDecoder and Python's bytes.decode("utf-8", "replace") do): each maximal
// invalid subpart becomes one U+FFFD. Pure functions; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace failsafe {

inline constexpr int kReplacementChar = 0xFFFD;

// Decodes the code point at s[*i] and advances *i past it. On an invalid
// sequence returns -1 and advances past its maximal subpart (at least one byte).
int DecodeUtf8(std::string_view s, size_t* i);

// Appends the UTF-8 encoding of a code point (0..0x10FFFF).
void AppendUtf8(int cp, std::string* out);

bool IsValidUtf8(std::string_view s);

// `s` with every maximal invalid subpart replaced by U+FFFD.
std::string ToValidUtf8(std::string_view s);

// Bytes at the end of `s` that start a UTF-8 sequence which is still
// incomplete (0..3): what a stream holds back until the next bytes arrive.
size_t IncompleteUtf8Suffix(std::string_view s);

// `s` without its leading / trailing code points for which `pred` holds.
std::string_view TrimStartIf(std::string_view s, bool (*pred)(int cp));
std::string_view TrimEndIf(std::string_view s, bool (*pred)(int cp));

// Number of code points in valid UTF-8 text.
size_t CountCodePoints(std::string_view s);

}  // namespace failsafe
