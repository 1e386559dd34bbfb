// Checks shared by the model families' Hugging Face tests (tests/models/<family>/hf_*_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "models/hf.h"
#include "models/model.h"
#include "support/op_test.h"

namespace loom::test {

// The family's model class behind an import (throws when the import built another family).
template <typename Model>
const Model& model_as(const models::LanguageModel& m) {
  auto* typed = dynamic_cast<const Model*>(&m);
  if (typed == nullptr) throw std::runtime_error("the model is a " + m.arch() + ", not the family this test expects");
  return *typed;
}

// The same parameters and state tensors (routing biases), under the same names, bit for bit.
inline void expect_same_model(models::LanguageModel& a, models::LanguageModel& b) {
  auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_EQ(pa[i]->name, pb[i]->name);
    EXPECT_EQ(pa[i]->value.to_vector<float>(), pb[i]->value.to_vector<float>()) << pa[i]->name;
  }
  auto sa = a.state_tensors(), sb = b.state_tensors();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    ASSERT_EQ(sa[i].first, sb[i].first);
    EXPECT_EQ(sa[i].second.to_vector<float>(), sb[i].second.to_vector<float>()) << sa[i].first;
  }
}

// The message with which importing the HF directory `dir` fails, or "" when it imports.
inline std::string hf_import_error(const std::filesystem::path& dir) {
  return error_of([&] { models::import_hf(dir.string()); });
}

}  // namespace loom::test
