#include "serve/stop_text.h"

#include <algorithm>

namespace loom::serve {

std::string StopText::push(const std::string& piece) {
  if (stopped_) return "";
  held_ += piece;
  // The earliest complete stop string ends the text.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    if (!s.empty()) first = std::min(first, held_.find(s));
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest end of the text that is the start of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t n = std::min(s.size() - (s.empty() ? 0 : 1), held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopText::finish() {
  std::string out = stopped_ ? "" : held_;
  held_.clear();
  return out;
}

}  // namespace loom::serve
