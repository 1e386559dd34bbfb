// The built-in presets (train/presets.h): configs/*.json compiled in, each stating only what differs
// from its base (another preset, or the built-in defaults). Tables made up here stand in for configs/
// where a test needs a broken preset.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "train/config.h"
#include "train/presets.h"
#include "support/errors.h"

namespace fs = std::filesystem;
using loom::train::Preset;
using loom::train::TrainConfig;
using nlohmann::json;

namespace {

// The error message of resolving `name` in `table`, or "" if it resolved.
std::string resolve_error(const std::string& name, const std::vector<Preset>& table) {
  try {
    loom::train::resolve_preset(name, table);
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "";
}

// Each leaf of `layer` that has the same value in `base`, as "section.key".
void restated_keys(const json& layer, const json& base, const std::string& prefix, std::vector<std::string>& out) {
  for (const auto& [key, value] : layer.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (!base.contains(key)) continue;  // the key check reports it
    if (value.is_object()) {
      restated_keys(value, base[key], path, out);
    } else if (value == base[key]) {
      out.push_back(path);
    }
  }
}

}  // namespace

TEST(Presets, EveryFileInConfigsIsAPresetAndLoads) {
  std::set<std::string> files;
  for (const auto& entry : fs::directory_iterator(fs::path(LOOM_SOURCE_DIR) / "configs")) {
    if (entry.path().extension() == ".json") files.insert(entry.path().stem().string());
  }
  const std::vector<std::string> names = loom::train::preset_names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), files) << "the build compiled in another configs/";
  EXPECT_EQ(names.size(), files.size()) << "a name twice";
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    TrainConfig c;
    ASSERT_NO_THROW(c = TrainConfig::load(name));
    EXPECT_FALSE(c.description.empty()) << "every preset says what it is for";
    // Resolved, the preset is complete: written out, it loads back the same as a plain file.
    EXPECT_EQ(TrainConfig::from_json(c.to_json()).to_json(), c.to_json());
  }
}

TEST(Presets, StateOnlyWhatDiffersFromTheirBase) {
  for (const auto& name : loom::train::preset_names()) {
    SCOPED_TRACE(name);
    json layer = json::parse(loom::train::preset_text(name));
    const json base = layer.contains("base") ? loom::train::resolve_preset(layer["base"].get<std::string>())
                                             : TrainConfig::defaults_json(TrainConfig::load(name).model.arch());
    layer.erase("base");
    layer.erase("description");  // its own, always
    if (layer.contains("model") && !json::parse(loom::train::preset_text(name)).contains("base")) {
      layer["model"].erase("arch");  // a preset on the defaults names its family, default or not
    }
    std::vector<std::string> same;
    restated_keys(layer, base, "", same);
    EXPECT_TRUE(same.empty()) << "configs/" << name << ".json restates its base's value of " << same.front();
  }
}

TEST(Presets, ABaseChainIsResolvedLayerByLayer) {
  // gpt2-medium names gpt2-small, which sits on the gpt2 defaults: it gets gpt2-small's data and
  // precision (neither is the defaults') and keeps its own shape.
  const json medium = json::parse(loom::train::preset_text("gpt2-medium"));
  ASSERT_EQ(medium.value("base", ""), "gpt2-small");
  ASSERT_FALSE(medium.contains("data"));
  const TrainConfig m = TrainConfig::load("gpt2-medium"), s = TrainConfig::load("gpt2-small");
  const json defaults = TrainConfig::defaults_json("gpt2");
  EXPECT_EQ(m.data.tokenizer, s.data.tokenizer);
  EXPECT_NE(json(m.data.tokenizer), defaults["data"]["tokenizer"]);
  EXPECT_EQ(m.training.precision, "bf16");
  EXPECT_EQ(m.model.json()["d_model"], 1024);
  EXPECT_EQ(m.model.json()["qkv_bias"], true);

  // Three layers: each key from the nearest layer that states it, the rest from the defaults.
  const std::vector<Preset> table = {
      {"root", R"({"description": "r", "optimizer": {"lr": 0.5, "min_lr": 0.1}, "training": {"max_steps": 9}})"},
      {"middle", R"({"base": "root", "description": "m", "training": {"max_steps": 7, "batch_size": 3}})"},
      {"top", R"({"base": "middle", "description": "t", "optimizer": {"min_lr": 0.01}})"},
  };
  json expected = TrainConfig::defaults_json("llama");
  expected["description"] = "t";
  expected["optimizer"]["lr"] = 0.5;
  expected["optimizer"]["min_lr"] = 0.01;
  expected["training"]["max_steps"] = 7;
  expected["training"]["batch_size"] = 3;
  EXPECT_EQ(loom::train::resolve_preset("top", table), expected);
}

TEST(Presets, AnUnknownBaseOrACycleOfBasesIsAnErrorNamingIt) {
  const std::vector<Preset> unknown = {{"mine", R"({"base": "huge"})"}, {"other", "{}"}};
  const std::string u = resolve_error("mine", unknown);
  EXPECT_HAS(u, "preset \"mine\" names base \"huge\", which is not a preset");
  EXPECT_HAS(u, "presets: mine, other");

  const std::vector<Preset> cycle = {
      {"a", R"({"base": "b"})"}, {"b", R"({"base": "c"})"}, {"c", R"({"base": "a"})"}, {"d", R"({"base": "b"})"}};
  EXPECT_HAS(resolve_error("a", cycle), "preset \"a\": its bases form a cycle: a -> b -> c -> a");
  EXPECT_HAS(resolve_error("d", cycle), "preset \"d\": its bases form a cycle: d -> b -> c -> a -> b");
  const std::vector<Preset> itself = {{"self", R"({"base": "self"})"}};
  EXPECT_HAS(resolve_error("self", itself), "cycle: self -> self");

  const std::vector<Preset> broken = {
      {"number", R"({"base": 3})"},
      {"family", R"({"base": "small", "model": {"arch": "llama"}})"},
      {"small", R"({"model": {"arch": "gpt2", "num_layers": 2}})"},
      {"typo", R"({"base": "small", "optimizer": {"lrr": 1}})"},
      {"text", R"({"base": )"},
  };
  EXPECT_HAS(resolve_error("number", broken), "preset \"number\": \"base\" must name a preset");
  EXPECT_HAS(resolve_error("family", broken),
             "preset \"family\" sets model.arch = \"llama\" but its base \"small\" is a gpt2 model");
  EXPECT_HAS(resolve_error("typo", broken), "preset \"typo\" (configs/typo.json): unknown key optimizer.lrr");
  EXPECT_HAS(resolve_error("text", broken), "preset \"text\" (configs/text.json): the file is not valid JSON");
  EXPECT_HAS(resolve_error("nothing", broken), "no preset named \"nothing\"");
  EXPECT_EQ(loom::train::resolve_preset("small", broken)["model"]["num_layers"], 2);
  EXPECT_EQ(loom::train::preset_names_of_family("gpt2", broken), "small");  // the broken ones belong to none
}
