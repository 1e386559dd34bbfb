// Errors, in the two kinds c10 uses:
//   * loom::Error: the user asked for something impossible (a shape mismatch, a bad config value,
//     a malformed file). The message names the offending values: LOOM_CHECK(x == y, "rms_norm: weight
//     has shape ", w.shape(), " but x has C=", c).
//   * loom::InternalError: an invariant of loom itself broke ("bug in loom, please report").
// Library code never calls exit() or abort(); the CLI turns these into a message and exit code 1.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace loom {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A file or stream could not be read or written (missing file, permission, short read).
class IoError : public Error {
 public:
  using Error::Error;
};

class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

// Builds a message from any streamable pieces: loom::str("got ", n, " heads").
template <typename... Args>
std::string str(Args&&... args) {
  return detail::concat(std::forward<Args>(args)...);
}

}  // namespace loom

// User-facing check: throws loom::Error with the concatenated message.
#define LOOM_CHECK(cond, ...)                                  \
  do {                                                         \
    if (!(cond)) [[unlikely]] {                                \
      throw ::loom::Error(::loom::detail::concat(__VA_ARGS__)); \
    }                                                          \
  } while (0)

// Throws loom::Error unconditionally.
#define LOOM_FAIL(...) throw ::loom::Error(::loom::detail::concat(__VA_ARGS__))

// Invariant check for loom's own bugs.
#define LOOM_ASSERT(cond, ...)                                                               \
  do {                                                                                       \
    if (!(cond)) [[unlikely]] {                                                              \
      throw ::loom::InternalError(::loom::detail::concat(                                    \
          "bug in loom, please report: ", __FILE__, ":", __LINE__, ": ", #cond, " ", ##__VA_ARGS__)); \
    }                                                                                        \
  } while (0)
