// StopStringMatcher: stop strings split across pieces are held back and never emitted.
#include <gtest/gtest.h>

#include "longctx/core/error.h"
#include "longctx/engine/stop_strings.h"

namespace longctx {
namespace {

// Feeds pieces; returns everything emitted (plus the flush when no stop matched).
std::string feed(StopStringMatcher& m, const std::vector<std::string>& pieces,
                 std::vector<std::string>* emitted = nullptr) {
  std::string all;
  for (const auto& p : pieces) {
    auto u = m.append(p);
    if (emitted) emitted->push_back(u.emit);
    all += u.emit;
    if (u.stop_index) return all;
  }
  return all + m.flush();
}

TEST(StopStrings, NoStopsPassesEverythingThrough) {
  StopStringMatcher m(std::vector<std::string>{});
  std::vector<std::string> emitted;
  EXPECT_EQ(feed(m, {"ab", "cd"}, &emitted), "abcd");
  EXPECT_EQ(emitted, (std::vector<std::string>{"ab", "cd"}));
}

TEST(StopStrings, SplitAcrossPiecesIsHeldBackAndCut) {
  StopStringMatcher m({"STOP"});
  std::vector<std::string> emitted;
  EXPECT_EQ(feed(m, {"hello S", "TO", "P world"}, &emitted), "hello ");
  EXPECT_EQ(emitted, (std::vector<std::string>{"hello ", "", ""}));
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.text(), "hello ");
}

TEST(StopStrings, FalseStartIsReleased) {
  StopStringMatcher m({"STOP"});
  std::vector<std::string> emitted;
  EXPECT_EQ(feed(m, {"a ST", "OX b"}, &emitted), "a STOX b");
  EXPECT_EQ(emitted[0], "a ");  // "ST" could still become STOP
  EXPECT_EQ(emitted[1], "STOX b");
  EXPECT_FALSE(m.stopped());
}

TEST(StopStrings, PartialMatchAtTheEndComesOutOnFlush) {
  StopStringMatcher m({"</s>"});
  auto u = m.append("x </");
  EXPECT_EQ(u.emit, "x ");
  EXPECT_EQ(m.flush(), "</");
}

TEST(StopStrings, EarliestOfSeveralStopsWins) {
  StopStringMatcher m({"world", "lo w"});
  auto u = m.append("hello world");
  ASSERT_TRUE(u.stop_index);
  EXPECT_EQ(*u.stop_index, 1u);
  EXPECT_EQ(u.emit, "hel");
}

TEST(StopStrings, StopAtTheStartEmitsNothing) {
  StopStringMatcher m({"\n"});
  auto u = m.append("\nmore");
  ASSERT_TRUE(u.stop_index);
  EXPECT_EQ(u.emit, "");
  EXPECT_EQ(m.text(), "");
}

TEST(StopStrings, OverlappingPrefixesHoldTheLongestCandidate) {
  // "aab" with stop "aaab": the tail "aa" may still begin "aaab".
  StopStringMatcher m({"aaab"});
  auto u = m.append("xaa");
  EXPECT_EQ(u.emit, "x");
  u = m.append("a");
  EXPECT_EQ(u.emit, "");
  u = m.append("b");
  ASSERT_TRUE(u.stop_index);
  EXPECT_EQ(m.text(), "x");
}

TEST(StopStrings, EmptyStopIsRejected) { EXPECT_THROW(StopStringMatcher({"a", ""}), Error); }

}  // namespace
}  // namespace longctx
