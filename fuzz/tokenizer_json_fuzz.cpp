// libFuzzer target over the tokenizer readers: the input as a Hugging Face tokenizer.json
// (tokenizer_from_hf_json) and as GPT-2's vocab.json with an empty merges.txt (tokenizer_from_gpt2_files).
// Built and run by tools/fuzz.sh (ASan + UBSan). A finding is any crash, sanitizer report, exception
// other than loom::Error, or a broken invariant (reported through __builtin_trap):
//   * a refused input throws loom::Error and nothing else;
//   * an accepted tokenizer writes a tokenizer.json that reads back as the same vocabulary, merges and
//     special tokens, and decodes what it encodes back to the same bytes, less those its vocabulary has
//     no token for (dropped on encoding, as Hugging Face's BPE drops them).
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "tokenizer/formats.h"

using namespace loom::tokenizer;

namespace {

void require(bool ok) {
  if (!ok) __builtin_trap();
}

void check_accepted(const Tokenizer& tok) {
  const Tokenizer back = tokenizer_from_hf_json(to_hf_json(tok), "round trip");
  require(back.vocab() == tok.vocab());
  require(back.merges() == tok.merges());
  require(back.special_tokens() == tok.special_tokens());
  // A vocabulary may lack some single-byte tokens (SmolLM2's does): encoding then drops those bytes, as
  // Hugging Face's BPE does, or turns them into the unknown token. So the round trip gives the text
  // without its missing bytes, and is only checked without an unknown token.
  const std::vector<uint8_t> missing = tok.missing_bytes();
  auto without_missing = [&](const std::string& s) {
    std::string out;
    for (char c : s) {
      if (!std::binary_search(missing.begin(), missing.end(), static_cast<uint8_t>(c))) out += c;
    }
    return out;
  };
  std::string text = "Hello, world! 1984 caf\xc3\xa9 \n\n  x", expected = without_missing(text);
  if (!tok.special_tokens().empty()) {
    text += tok.special_tokens().front() + "tail";
    expected += tok.special_tokens().front() + without_missing("tail");
  }
  if (!tok.unknown_token()) require(tok.decode_bytes(tok.encode(text)) == expected);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    check_accepted(tokenizer_from_hf_json(text, "fuzz tokenizer.json"));
  } catch (const loom::Error&) {
  }
  try {
    check_accepted(tokenizer_from_gpt2_files(text, "", "fuzz vocab.json"));
  } catch (const loom::Error&) {
  }
  return 0;
}
