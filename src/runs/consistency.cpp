#include "runs/consistency.h"

#include <filesystem>

#include "core/error.h"
#include "data/provenance.h"

namespace loom::runs {
namespace fs = std::filesystem;

void check_loaded_run(const LoadedRun& run, const std::string& source) {
  if (!run.model || !run.tokenizer) return;
  data::TokenizerIdentity tok;
  tok.path = run.tokenizer_path.empty() ? "beside " + source : run.tokenizer_path;
  tok.vocab_size = static_cast<int64_t>(run.tokenizer->vocab_size());
  data::check_tokenizer_fits_model(tok, run.model->vocab_size(), source);
}

std::string check_eval_data(const LoadedRun& run, const std::string& source, const std::string& data_path) {
  const std::string meta_path = (fs::path(data_path).parent_path() / "meta.json").string();
  std::error_code ec;
  if (!fs::exists(meta_path, ec)) return "";  // TokenFile::open says what is missing
  const data::TokenProvenance recorded = data::read_provenance(meta_path);
  LOOM_CHECK(recorded.vocab_size <= run.model->vocab_size(), meta_path, " says ", data_path,
             " was made by a tokenizer of ", recorded.vocab_size, " tokens, more than the model's vocab_size=",
             run.model->vocab_size(), " (", source, ")");
  if (!recorded.records_tokenizer()) return "";
  if (!run.tokenizer) {
    return str(data_path, " was made by the tokenizer ", recorded.tokenizer_path, " (", meta_path, "), but ", source,
               " has no tokenizer.json to compare it with: the loss is only meaningful if the model was trained with it");
  }
  const data::TokenizerIdentity tok = data::identify_tokenizer(*run.tokenizer, run.tokenizer_path);
  data::check_made_by(tok, recorded, "the tokenizer of " + source);
  return "";
}

}  // namespace loom::runs
