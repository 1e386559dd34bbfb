// Tests of what loom::Error says: the message a call throws, and checks that it names what it should.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"

namespace loom::test {

// The message of the loom::Error `fn` throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Asserts that `fn` throws loom::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error_mentions(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected loom::Error";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace loom::test

// The message `msg` contains `needle` (a failure prints the message's first 1000 characters).
#define EXPECT_HAS(msg, needle) EXPECT_NE((msg).find(needle), std::string::npos) << "message: " << (msg).substr(0, 1000)
