// A reply's text as its tokens come, cut at the first stop string (OpenAI's `stop`): text is handed on
// as soon as it can no longer turn out to be the start of a stop string, and a stop string, once complete,
// ends the text before it (the stop string itself is never shown, as OpenAI's API does).
#pragma once

#include <string>
#include <vector>

namespace loom::serve {

class StopText {
 public:
  explicit StopText(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Appends `piece` and returns the text that is now certain. After a stop string is complete, stopped()
  // is true and the text before it has been returned; later pieces are ignored.
  std::string push(const std::string& piece);
  // What is still held back (a partial stop string that never completed): the rest of the text.
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace loom::serve
