#include "train/metrics.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/json.h"

namespace loom::train {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }
}  // namespace

json to_json(const TrainEvent& e) {
  json j{{"event", "train"},         {"step", e.step},
         {"loss", number(e.loss)},   {"lr", number(e.lr)},
         {"grad_norm", number(e.grad_norm)}, {"tokens_per_s", number(e.tokens_per_s)},
         {"mfu", number(e.mfu)}};
  if (e.model.is_object()) {
    for (const auto& [k, v] : e.model.items()) {
      if (!j.contains(k)) j[k] = v;  // the loop's own fields win
    }
  }
  return j;
}

json to_json(const ValEvent& e) {
  return json{{"event", "val"}, {"step", e.step}, {"val_loss", number(e.val_loss)}};
}

MetricsWriter::MetricsWriter(const std::string& run_dir, std::optional<int64_t> resume_step, bool redo_val_at_resume_step) {
  fs::create_directories(run_dir);
  path_ = (fs::path(run_dir) / "metrics.jsonl").string();
  std::vector<json> kept;
  if (resume_step && fs::exists(path_)) {
    for (auto& e : read_metrics(path_)) {
      const bool has_step = e.contains("step") && e["step"].is_number();
      if (has_step && e["step"].get<int64_t>() > *resume_step) continue;
      if (has_step && redo_val_at_resume_step && e["step"].get<int64_t>() == *resume_step &&
          e.value("event", "") == "val") {
        continue;
      }
      kept.push_back(std::move(e));
    }
  }
  if (resume_step) {
    // Rewrite the kept events through a temporary file and a rename, so a crash here cannot lose them.
    std::string tmp = path_ + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      for (const auto& e : kept) out << e.dump() << "\n";
      if (!out) throw IoError(str("metrics: cannot write ", tmp));
    }
    fs::rename(tmp, path_);
  }
  file_ = std::fopen(path_.c_str(), resume_step ? "a" : "w");
  if (!file_) throw IoError(str("metrics: cannot open ", path_, " for writing"));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const json& event) {
  std::string line = event.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    throw IoError(str("metrics: cannot write to ", path_));
  }
}

void MetricsWriter::train(const TrainEvent& e) { write(to_json(e)); }
void MetricsWriter::val(const ValEvent& e) { write(to_json(e)); }

std::vector<json> read_metrics(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError(str("metrics: cannot open ", path));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::vector<json> events;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = io::try_parse_json(lines[i]);
    if (j.is_discarded() || !j.is_object()) {
      if (i + 1 == lines.size()) break;  // a last line cut short by a killed run
      LOOM_FAIL("metrics: ", path, " line ", i + 1, " is not a JSON object: ", io::brief_text(lines[i]));
    }
    events.push_back(std::move(j));
  }
  return events;
}

std::optional<double> median_tokens_per_s(const std::vector<json>& events) {
  std::vector<double> v;
  bool first = true;
  for (const auto& e : events) {
    if (e.value("event", "") != "train" || !e.contains("tokens_per_s") || !e["tokens_per_s"].is_number()) continue;
    if (first) {  // the first interval includes start-up (allocation, first-touch, planning)
      first = false;
      continue;
    }
    v.push_back(e["tokens_per_s"].get<double>());
  }
  if (v.empty()) return std::nullopt;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace loom::train
