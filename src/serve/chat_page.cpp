#include "serve/chat_page.h"

#include "io/markup.h"

namespace loom::serve {

namespace {

// The page. The reply streams in as server-sent events read from fetch()'s body (EventSource cannot
// POST); text is put in with textContent, never as HTML.
constexpr const char* kPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>loom serve: @MODEL@</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 0; background: #f4f4f1; color: #222; }
  header { padding: 10px 16px; background: #2d3a3a; color: #eee; display: flex; gap: 16px; align-items: center; flex-wrap: wrap; }
  header h1 { font-size: 17px; margin: 0; font-weight: 600; }
  header label { font-size: 13px; }
  header input { width: 64px; }
  #log { max-width: 820px; margin: 0 auto; padding: 16px; display: flex; flex-direction: column; gap: 10px; padding-bottom: 120px; }
  .msg { padding: 10px 14px; border-radius: 10px; white-space: pre-wrap; line-height: 1.4; max-width: 85%; }
  .user { align-self: flex-end; background: #d7e8ff; }
  .assistant { align-self: flex-start; background: #fff; border: 1px solid #ddd; }
  .error { align-self: center; background: #fde2e2; color: #8a1111; }
  .meta { font-size: 11px; color: #888; margin-top: 4px; }
  form { position: fixed; bottom: 0; left: 0; right: 0; background: #e8e8e3; padding: 12px; display: flex; gap: 8px; justify-content: center; }
  textarea { width: min(700px, 70vw); height: 52px; font: inherit; padding: 6px; }
  button { font: inherit; padding: 0 18px; }
</style>
</head>
<body>
<header>
  <h1>loom serve: <span id="model">@MODEL@</span></h1>
  <label>temperature <input id="temperature" type="number" value="0.7" min="0" max="2" step="0.1"></label>
  <label>max tokens <input id="max_tokens" type="number" value="256" min="1"></label>
  <label>API key <input id="key" type="password" style="width:120px"></label>
  <button type="button" id="clear">new chat</button>
</header>
<div id="log"></div>
<form id="form">
  <textarea id="input" placeholder="Say something (Enter sends, Shift+Enter for a new line)"></textarea>
  <button id="send" type="submit">Send</button>
</form>
<script>
"use strict";
const model = document.getElementById("model").textContent;
const log = document.getElementById("log"), input = document.getElementById("input"), send = document.getElementById("send");
const keyBox = document.getElementById("key");
keyBox.value = localStorage.getItem("loom-key") || "";
keyBox.onchange = () => localStorage.setItem("loom-key", keyBox.value);
let history = [];
function bubble(cls, text) {
  const d = document.createElement("div");
  d.className = "msg " + cls;
  d.textContent = text;
  log.appendChild(d);
  window.scrollTo(0, document.body.scrollHeight);
  return d;
}
document.getElementById("clear").onclick = () => { history = []; log.textContent = ""; };
input.addEventListener("keydown", e => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); document.getElementById("form").requestSubmit(); }
});
document.getElementById("form").onsubmit = async e => {
  e.preventDefault();
  const text = input.value.trim();
  if (!text || send.disabled) return;
  input.value = "";
  history.push({role: "user", content: text});
  bubble("user", text);
  const reply = bubble("assistant", "");
  reply.dataset.state = "streaming";
  send.disabled = true;
  const started = performance.now();
  let tokens = 0, content = "";
  try {
    const headers = {"Content-Type": "application/json"};
    if (keyBox.value) headers["Authorization"] = "Bearer " + keyBox.value;
    const res = await fetch("/v1/chat/completions", {method: "POST", headers, body: JSON.stringify({
      model, messages: history, stream: true,
      temperature: Number(document.getElementById("temperature").value),
      max_tokens: Number(document.getElementById("max_tokens").value)})});
    if (!res.ok) {
      let message = "HTTP " + res.status;
      try { message = (await res.json()).error.message; } catch (_) {}
      throw new Error(message);
    }
    const reader = res.body.getReader(), decoder = new TextDecoder();
    let buffer = "", finish = null;
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        if (!event.startsWith("data: ")) continue;
        const data = event.slice(6);
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        const choice = chunk.choices[0];
        if (!choice) continue;
        if (choice.delta && choice.delta.content) { content += choice.delta.content; tokens++; reply.textContent = content; }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }
    history.push({role: "assistant", content});
    const meta = document.createElement("div");
    meta.className = "meta";
    meta.textContent = ((performance.now() - started) / 1000).toFixed(2) + " s, finish: " + finish;
    reply.appendChild(meta);
    reply.dataset.state = "done";
  } catch (err) {
    history.pop();
    reply.remove();
    bubble("error", "error: " + err.message).dataset.state = "done";
  } finally {
    send.disabled = false;
    input.focus();
  }
};
input.focus();
</script>
</body>
</html>
)HTML";

}  // namespace

std::string chat_page_html(const std::string& model) {
  std::string page = kPage;
  const std::string name = io::escape_markup(model);
  for (size_t at = page.find("@MODEL@"); at != std::string::npos; at = page.find("@MODEL@", at + name.size())) {
    page.replace(at, 7, name);
  }
  return page;
}

}  // namespace loom::serve
