// The registered model families: adding a family is one line here (and its folder).
#include <string>

#include "core/error.h"
#include "models/deepseek_v3/family.h"
#include "models/family.h"
#include "models/gpt2/family.h"
#include "models/llama/family.h"

namespace loom::models {

const std::vector<const Family*>& families() {
  static const std::vector<const Family*> all = {
      &llama::family(),
      &gpt2::family(),
      &deepseek_v3::family(),
  };
  return all;
}

const Family& family(const std::string& arch) {
  std::string known;
  for (const Family* f : families()) {
    if (f->arch == arch) return *f;
    known += (known.empty() ? "" : ", ") + ("\"" + f->arch + "\"");
  }
  LOOM_FAIL("config: model.arch \"", arch, "\" is not a model family loom knows (families: ", known, ")");
}

const Family* family_for_hf(const std::string& model_type) {
  for (const Family* f : families()) {
    if (f->hf_model_type == model_type) return f;
  }
  return nullptr;
}

const Family* family_for_gguf(const std::string& arch) {
  for (const Family* f : families()) {
    if (!f->gguf_arch.empty() && f->gguf_arch == arch) return f;
  }
  return nullptr;
}

}  // namespace loom::models
