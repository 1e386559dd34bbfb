// `loom finetune` and `loom merge` end to end on the tiny ChatML Llama: a LoRA run, its resume, PEFT's
// adapter merged and exported, and a bad data line named by the CLI.
#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

#include "support/cli.h"
#include "support/files.h"
#include "support/gguf_files.h"

namespace fs = std::filesystem;
using namespace loom;
using loom::test::run_cli;
using loom::test::TempDir;

namespace {

std::string chatml_tiny(const TempDir& dir) {
  const std::string src = (fs::path(LOOM_SOURCE_DIR) / "tests/models/llama/fixtures/tiny_llama.gguf").string();
  const std::string chatml =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
      "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  return test::rewrite_gguf(src, dir / "tiny.gguf", [&](std::vector<gguf::KeyValue>& kv, auto&) {
    for (auto& e : kv) {
      if (e.key == "tokenizer.chat_template") e.value = gguf::Value{chatml};
    }
  });
}

}  // namespace

TEST(FinetuneCli, TrainsResumesMergesAndExports) {
  TempDir dir;
  const std::string base = chatml_tiny(dir);
  std::string data;
  for (int i = 0; i < 12; ++i) {
    data += R"({"prompt": "say )" + std::to_string(i) + R"(", "completion": ")" + std::to_string(i * 7) + "\"}\n";
  }
  test::write_file(dir / "d.jsonl", data);
  const std::string common = " --data " + (dir / "d.jsonl") + " --out " + (dir / "run") +
                             " --set logging.progress=none --set eval.interval=2 --set eval.exact_match=2 --set checkpoint.interval=2"
                             " --set data.val_fraction=0.25";
  auto r = run_cli("finetune --weights " + base + common + " --max-steps 4 --lora-rank 2 --lora-targets q_proj,down_proj");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("9 training and 3 held-out examples"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exact match 0.0% ->"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir / "run/adapter/adapter_config.json"));
  EXPECT_EQ(test::read_json(dir / "run/config.json")["lora"]["targets"], "q_proj,down_proj");
  // Without --resume a second run into the same directory is refused; with it, it continues at step 4.
  r = run_cli("finetune --weights " + base + common + " --max-steps 4");
  EXPECT_NE(r.status, 0);
  r = run_cli("finetune --out " + (dir / "run") + " --resume --max-steps 6 --set logging.progress=none");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("resuming from step 4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done: 6 steps"), std::string::npos) << r.output;
  // Merged into the base and exported.
  r = run_cli("merge --weights " + base + " --adapter " + (dir / "run/adapter") + " --out " + (dir / "merged"));
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_cli("export --run " + (dir / "merged") + " --format gguf --out " + (dir / "merged.gguf"));
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_cli("generate --weights " + (dir / "merged.gguf") + " --prompt hi --max-new-tokens 3 --temperature 0");
  EXPECT_EQ(r.status, 0) << r.output;
}

TEST(FinetuneCli, ABadLineIsNamed) {
  TempDir dir;
  const std::string base = chatml_tiny(dir);
  test::write_file(dir / "d.jsonl", R"({"prompt": "a", "completion": "b"})" "\n" R"({"messages": [{"role": "robot", "content": "x"}]})" "\n");
  auto r = run_cli("finetune --weights " + base + " --data " + (dir / "d.jsonl") + " --out " + (dir / "run"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("d.jsonl:2: messages[0].role must be \"system\", \"user\" or \"assistant\", got \"robot\""),
            std::string::npos) << r.output;
}

// An HF export carries the run's chat template and ends of text in its tokenizer_config.json (the family's
// export wrote one without them), so fine-tuning from the export takes chat data and `loom chat` on it
// finds the template, as they do on the GGUF it came from.
TEST(FinetuneCli, AnHfExportKeepsTheChatTemplateForFinetuneAndChat) {
  TempDir dir;
  const std::string base = chatml_tiny(dir);
  auto r = run_cli("import --gguf " + base + " --out " + (dir / "imported"));
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_cli("export --run " + (dir / "imported") + " --format hf --out " + (dir / "hf"));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto run_config = test::read_json(dir / "imported/tokenizer_config.json");
  const auto hf_config = test::read_json(dir / "hf/tokenizer_config.json");
  ASSERT_TRUE(run_config.contains("chat_template"));
  EXPECT_EQ(hf_config.value("chat_template", ""), run_config["chat_template"].get<std::string>());
  EXPECT_EQ(hf_config.value("eos_token", ""), run_config.value("eos_token", "?"));
  test::write_file(dir / "d.jsonl",
                   R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})" "\n"
                   R"({"messages": [{"role": "user", "content": "ho"}, {"role": "assistant", "content": "ya"}]})" "\n");
  r = run_cli("finetune --weights " + (dir / "hf") + " --data " + (dir / "d.jsonl") + " --val-data " + (dir / "d.jsonl") +
              " --out " + (dir / "ft") + " --max-steps 1 --set logging.progress=none --set eval.exact_match=0");
  EXPECT_EQ(r.status, 0) << r.output;
  test::write_file(dir / "say.txt", "hi\n");
  r = run_cli("chat --weights " + (dir / "hf") + " --max-new-tokens 2 --temperature 0 < " + (dir / "say.txt"));
  EXPECT_EQ(r.status, 0) << r.output;
}
