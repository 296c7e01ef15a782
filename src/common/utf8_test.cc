#include "common/utf8.h"

#include <gtest/gtest.h>

namespace failsafe {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

// The WHATWG / Unicode "maximal subpart" cases: what TextDecoder and
// Python's errors="replace" produce.
TEST(Utf8, InvalidSequencesBecomeOneReplacementPerMaximalSubpart) {
  EXPECT_EQ(ToValidUtf8("abc"), "abc");
  EXPECT_EQ(ToValidUtf8("\xFF"), kFffd);
  EXPECT_EQ(ToValidUtf8("\xE6\x97"), kFffd);  // truncated 3-byte
  EXPECT_EQ(ToValidUtf8("\xE6\x97"
                        "a"),
            kFffd + "a");                                                     // the 'a' survives
  EXPECT_EQ(ToValidUtf8("\xF0\x9F\x9A"), kFffd);                              // truncated 4-byte
  EXPECT_EQ(ToValidUtf8("\xC0\xAF"), kFffd + kFffd);                          // overlong lead
  EXPECT_EQ(ToValidUtf8("\xE0\x80\xAF"), kFffd + kFffd + kFffd);              // overlong 3-byte
  EXPECT_EQ(ToValidUtf8("\xED\xA0\x80"), kFffd + kFffd + kFffd);              // a surrogate
  EXPECT_EQ(ToValidUtf8("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // > U+10FFFF
  EXPECT_EQ(ToValidUtf8("\x80\x80"), kFffd + kFffd);
  EXPECT_TRUE(IsValidUtf8("日本語 🚀"));
  EXPECT_FALSE(IsValidUtf8("\xC3"));
}

TEST(Utf8, IncompleteSuffixIsWhatMayStillBecomeValid) {
  EXPECT_EQ(IncompleteUtf8Suffix("ab"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("ab\xE6\x97"), 2u);
  EXPECT_EQ(IncompleteUtf8Suffix("ab\xF0\x9F\x9A"), 3u);
  EXPECT_EQ(IncompleteUtf8Suffix("ab\xE6\x97\xA5"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("ab\xFF"), 0u);      // never valid: not held back
  EXPECT_EQ(IncompleteUtf8Suffix("ab\xE0\x80"), 0u);  // overlong: already invalid
}

TEST(Utf8, EncodesEveryPlane) {
  for (int cp : {0x24, 0xA2, 0x20AC, 0x10348, 0x10FFFF}) {
    std::string s;
    AppendUtf8(cp, &s);
    size_t i = 0;
    EXPECT_EQ(DecodeUtf8(s, &i), cp);
    EXPECT_EQ(i, s.size());
  }
}

}  // namespace
}  // namespace failsafe
