// The chat page `loom serve` shows at `/`: one self-contained HTML file (no CDN, no external script or
// style), which keeps the conversation in the browser and streams each reply from /v1/chat/completions.
#pragma once

#include <string>

namespace loom::serve {

// The page, with `model` as its title (HTML-escaped).
std::string chat_page_html(const std::string& model);

}  // namespace loom::serve
