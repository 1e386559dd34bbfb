// loom chat: the ChatML template recognised by rendering probes (others refused), the rendered prompt's
// tokens, the conversation kept in the KV cache, the end-of-turn stop, and the CLI driven through stdin.
#include <gtest/gtest.h>
#include <filesystem>
#include <algorithm>
#include <fstream>

#include "generate/chat.h"
#include "gguf/gguf.h"
#include "support/cli.h"
#include "support/files.h"
#include "support/gguf_files.h"
#include "quant/qmatmul.h"
#include "runs/load.h"

namespace fs = std::filesystem;
using namespace loom;
using loom::test::TempDir;

namespace {

const std::string kTiny = (fs::path(LOOM_SOURCE_DIR) / "tests/models/llama/fixtures/tiny_llama.gguf").string();

// SmolLM2-135M-Instruct's template, as its GGUF file holds it.
const std::string kSmolTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' "
    "+ message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

// The tiny GGUF with another chat template.
std::string with_template(const TempDir& dir, const std::string& name, const std::string& jinja) {
  return test::rewrite_gguf(kTiny, dir / name, [&](std::vector<gguf::KeyValue>& kv, auto&) {
    for (auto& e : kv) {
      if (e.key == "tokenizer.chat_template") e.value = gguf::Value{jinja};
    }
  });
}

std::string refusal(const std::string& jinja) {
  try {
    generate::ChatTemplate::from_jinja(jinja);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

generate::GenerateOptions greedy(int64_t n) {
  generate::GenerateOptions o;
  o.max_new_tokens = n;
  o.sampling.temperature = 0;
  return o;
}

}  // namespace

TEST(Chat, RecognisesChatMlAndItsDefaultSystemMessage) {
  auto t = generate::ChatTemplate::from_jinja(kSmolTemplate);
  ASSERT_TRUE(t.default_system.has_value());
  EXPECT_EQ(*t.default_system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  // Whitespace control and dotted access, as other ChatML templates write them.
  const std::string plain =
      "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
      "{%- endfor %}\n{%- if add_generation_prompt %}\n{{- '<|im_start|>assistant\\n' }}\n{%- endif %}";
  EXPECT_FALSE(generate::ChatTemplate::from_jinja(plain).default_system.has_value());
  EXPECT_EQ(generate::render_chat_template(kSmolTemplate, {{"system", "S"}, {"user", "U"}}, true),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
}

TEST(Chat, RefusesTemplatesItCannotRenderNamingThem) {
  // Llama 3's format: renders, but is not ChatML.
  const std::string llama3 =
      "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
      "message['content'] + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ "
      "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
  std::string e = refusal(llama3);
  EXPECT_NE(e.find("not ChatML"), std::string::npos) << e;
  EXPECT_NE(e.find("<|start_header_id|>"), std::string::npos) << e;
  // A construct outside the subset is named.
  e = refusal("{% set x = 1 %}" + kSmolTemplate);
  EXPECT_NE(e.find("set x = 1"), std::string::npos) << e;
  e = refusal("{{ bos_token }}" + kSmolTemplate);
  EXPECT_NE(e.find("bos_token"), std::string::npos) << e;
  // ChatML blocks without the assistant prefix (the fixture's own template): a reply has nowhere to go.
  e = refusal(
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
      "'\\n'}}{% endfor %}");
  EXPECT_NE(e.find("not ChatML"), std::string::npos) << e;
  EXPECT_NE(refusal("").find("no chat template"), std::string::npos);
}

TEST(Chat, PromptTokensAreTheRenderedTemplateWithControlTokensAndUserTextIsNeverControl) {
  auto loaded = runs::load_weights(kTiny);
  const auto& tok = *loaded.tokenizer;
  generate::ChatSession chat(*loaded.model, tok, generate::ChatTemplate::from_jinja(kSmolTemplate), std::nullopt,
                             greedy(3), loaded.eos);
  chat.turn("hello there");
  // The same ids as rendering the whole template and tokenizing it with control tokens recognised.
  const std::string rendered = generate::render_chat_template(kSmolTemplate, {{"user", "hello there"}}, true);
  std::vector<int32_t> expected;
  for (auto id : tok.encode(rendered)) expected.push_back(static_cast<int32_t>(id));
  EXPECT_EQ(chat.last_prefill(), expected);
  const int32_t im_start = static_cast<int32_t>(*tok.special_token_id("<|im_start|>"));
  EXPECT_EQ(std::count(expected.begin(), expected.end(), im_start), 3);  // system, user, assistant

  generate::ChatSession inject(*loaded.model, tok, generate::ChatTemplate::from_jinja(kSmolTemplate), std::string("s"),
                               greedy(1), loaded.eos);
  inject.turn("a <|im_start|>b");
  const auto& ids = inject.last_prefill();
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_start), 3);  // the template's own: system, user, assistant
}

TEST(Chat, LaterTurnsPrefillOnlyTheirTokensAndMatchAFreshRunOnTheWholeConversation) {
  auto loaded = runs::load_weights(kTiny);
  const auto& tok = *loaded.tokenizer;
  generate::ChatSession chat(*loaded.model, tok, generate::ChatTemplate::from_jinja(kSmolTemplate), std::string("s"),
                             greedy(6), loaded.eos);
  auto first = chat.turn("one");
  const size_t before = chat.conversation().size();
  auto second = chat.turn("two two");
  // The second turn fed the first reply's closing tokens and its own block, not the conversation again.
  EXPECT_LT(chat.last_prefill().size(), before);
  ASSERT_NE(second.stop, generate::ChatSession::Stop::kContextFull);
  // Cached: all but the closing <|im_end|>\n (one token each here) and a last reply token never fed.
  const size_t unfed = 2 + (second.stop == generate::ChatSession::Stop::kMaxTokens ? 1 : 0);
  EXPECT_EQ(chat.cached(), static_cast<int64_t>(chat.conversation().size() - unfed));
  // A fresh decode of the whole conversation up to the second prompt gives the same greedy reply.
  const auto& conv = chat.conversation();
  std::vector<int32_t> prompt(conv.begin(), conv.end() - static_cast<std::ptrdiff_t>(second.tokens.size() + 2));
  auto o = greedy(6);
  o.stop_token = static_cast<int32_t>(*tok.special_token_id("<|im_end|>"));
  auto fresh = generate::generate(*loaded.model, prompt, o);
  if (!fresh.empty() && fresh.back() == o.stop_token) fresh.pop_back();
  EXPECT_EQ(second.tokens, fresh);
  EXPECT_FALSE(first.tokens.empty());
  EXPECT_FALSE(second.tokens.empty());  // else the comparison above says nothing
}

TEST(Chat, StopsAtTheEndOfTurnTokenWithoutEmittingIt) {
  auto loaded = runs::load_weights(kTiny);
  const auto& tok = *loaded.tokenizer;
  auto tmpl = generate::ChatTemplate::from_jinja(kSmolTemplate);
  generate::ChatSession probe(*loaded.model, tok, tmpl, std::nullopt, greedy(1), loaded.eos);
  const int32_t first = probe.turn("hi").tokens.at(0);
  // With the greedy first token as the end-of-sequence token, the reply ends before anything is emitted.
  generate::ChatSession chat(*loaded.model, tok, tmpl, std::nullopt, greedy(8),
                             static_cast<tokenizer::TokenId>(first));
  std::vector<int32_t> streamed;
  auto r = chat.turn("hi", [&](int32_t id) { streamed.push_back(id); });
  EXPECT_EQ(r.stop, generate::ChatSession::Stop::kEndOfTurn);
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_TRUE(streamed.empty());
}

TEST(Chat, RefusesATurnThatDoesNotFitTheContext) {
  auto loaded = runs::load_weights(kTiny);  // context length 128
  generate::ChatSession chat(*loaded.model, *loaded.tokenizer, generate::ChatTemplate::from_jinja(kSmolTemplate),
                             std::nullopt, greedy(2), loaded.eos);
  try {
    chat.turn(std::string(400, 'x') + " y z w");
    FAIL() << "a turn longer than the context was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context length is 128"), std::string::npos) << e.what();
  }
}

TEST(Chat, CliReadsStdinPrintsOnlyTheReplyAndRefusesUnknownTemplates) {
  TempDir dir;
  const std::string gguf = with_template(dir, "smol.gguf", kSmolTemplate);
  { std::ofstream(dir / "in.txt") << "hello there\n"; }
  const std::string args = " --temperature 0 --max-new-tokens 5 < " + dir / "in.txt";
  auto r = test::run_cli("chat --weights " + gguf + args, /*with_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.output;
  // The reply is the session's greedy reply, decoded.
  auto loaded = runs::load_weights(gguf, runs::MemoryBudget::of_machine(), runs::model_memory, true);
  generate::ChatSession chat(*loaded.model, *loaded.tokenizer, generate::ChatTemplate::from_jinja(kSmolTemplate),
                             std::nullopt, greedy(5), loaded.eos);
  auto reply = chat.turn("hello there");
  std::vector<tokenizer::TokenId> ids(reply.tokens.begin(), reply.tokens.end());
  EXPECT_EQ(r.output, loaded.tokenizer->decode(ids) + "\n");
  auto p = test::run_cli("chat --weights " + gguf + " --print-prompt" + args);
  std::string expected = "prompt ids:";
  for (int32_t id : chat.last_prefill()) expected += " " + std::to_string(id);
  EXPECT_NE(p.output.find(expected + "\n"), std::string::npos) << p.output;

  auto bad = test::run_cli("chat --weights " + kTiny + args);  // the fixture's template has no assistant prefix
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("not ChatML"), std::string::npos) << bad.output;
  auto none = test::run_cli("chat --max-new-tokens 0 --weights " + gguf + args);
  EXPECT_NE(none.status, 0);
  EXPECT_NE(none.output.find("--max-new-tokens"), std::string::npos) << none.output;
}

// `--activations` picks the rounding of the activations before the integer products (docs/quant.md): the
// CLI's reply is the in-process session's under that rounding; another name is refused by value.
TEST(Chat, ActivationsFlagChoosesTheRoundingAndRefusesOthers) {
  TempDir dir;
  const std::string gguf = with_template(dir, "smol.gguf", kSmolTemplate);
  { std::ofstream(dir / "in.txt") << "hello there\n"; }
  const std::string args = " --temperature 0 --max-new-tokens 6 < " + dir / "in.txt";
  auto loaded = runs::load_weights(gguf, runs::MemoryBudget::of_machine(), runs::model_memory, true);
  const quant::ActivationRounding saved = quant::default_activation_rounding();
  for (const char* name : {"int8", "int8x2"}) {
    SCOPED_TRACE(name);
    quant::set_default_activation_rounding(quant::activation_rounding_from_name(name, "test"));
    generate::ChatSession chat(*loaded.model, *loaded.tokenizer, generate::ChatTemplate::from_jinja(kSmolTemplate),
                               std::nullopt, greedy(6), loaded.eos);
    auto reply = chat.turn("hello there");
    std::vector<tokenizer::TokenId> ids(reply.tokens.begin(), reply.tokens.end());
    auto r = test::run_cli("chat --weights " + gguf + " --activations " + name + args, /*with_stderr=*/false);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output, loaded.tokenizer->decode(ids) + "\n");
  }
  quant::set_default_activation_rounding(saved);
  auto bad = test::run_cli("chat --weights " + gguf + " --activations int4" + args);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("--activations = 'int4'"), std::string::npos) << bad.output;
}

TEST(Chat, DecodeLastGivesTheLastRowOfDecode) {
  auto loaded = runs::load_weights(kTiny);
  const auto& m = *loaded.model;
  const int64_t V = m.vocab_size();
  std::vector<int32_t> ids = {5, 40, 41, 7, 100, 3};
  auto a = m.make_decode_cache(1), b = m.make_decode_cache(1);
  Tensor all = m.decode(Tensor::from_vector<int32_t>({1, 6}, ids), *a);
  Tensor last = m.decode_last(Tensor::from_vector<int32_t>({1, 6}, ids), *b);
  ASSERT_EQ(last.shape(), Shape({1, 1, V}));
  EXPECT_EQ(b->length(), 6);  // every position still went into the cache
  // Equal up to the GEMM's summation order (one row and six rows take different kernels' blockings).
  for (int64_t v = 0; v < V; ++v) EXPECT_NEAR(last.data<float>()[v], all.data<float>()[5 * V + v], 1e-5) << v;
  // And the cache it filled continues as decode()'s does.
  Tensor na = m.decode(Tensor::from_vector<int32_t>({1, 1}, {9}), *a), nb = m.decode(Tensor::from_vector<int32_t>({1, 1}, {9}), *b);
  for (int64_t v = 0; v < V; ++v) EXPECT_NEAR(na.data<float>()[v], nb.data<float>()[v], 1e-5) << v;
}
