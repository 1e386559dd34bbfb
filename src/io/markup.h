#pragma once
// Text put into HTML or XML (SVG): the five characters with a meaning there written as entities, so a
// run name, a label or a model name can never open a tag or end an attribute.

#include <string>
#include <string_view>

namespace loom::io {

// & < > " ' -> &amp; &lt; &gt; &quot; &#39; (valid in HTML and in XML alike; the rest unchanged).
std::string escape_markup(std::string_view text);

}  // namespace loom::io
