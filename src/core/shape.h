// Shape: up to 8 dimensions, outermost first, stored inline so that building one never allocates.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "core/error.h"

namespace loom {

class Shape {
 public:
  static constexpr int kMaxDims = 8;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.end()); }
  explicit Shape(const std::vector<int64_t>& dims) { assign(dims.begin(), dims.end()); }
  template <typename It>
  Shape(It first, It last) { assign(first, last); }

  int ndim() const { return ndim_; }
  size_t size() const { return static_cast<size_t>(ndim_); }
  bool empty() const { return ndim_ == 0; }
  // Negative indices count from the end, as in Python: shape[-1] is the innermost dimension.
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(normalize(i))]; }
  int64_t& operator[](int i) { return dims_[static_cast<size_t>(normalize(i))]; }
  int64_t back() const { return (*this)[-1]; }
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + ndim_; }

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim_; ++i) n *= dims_[static_cast<size_t>(i)];
    return n;
  }
  // Product of all dimensions before `dim` (e.g. the B*T rows of a [B,T,C] tensor for dim=-1).
  int64_t numel_before(int dim) const {
    int d = normalize(dim);
    int64_t n = 1;
    for (int i = 0; i < d; ++i) n *= dims_[static_cast<size_t>(i)];
    return n;
  }
  void push_back(int64_t d) {
    LOOM_CHECK(ndim_ < kMaxDims, "shapes have at most ", kMaxDims, " dimensions");
    dims_[static_cast<size_t>(ndim_++)] = d;
  }
  // The same shape with the last dimension replaced: x.shape().with_last(V).
  Shape with_last(int64_t d) const {
    Shape s = *this;
    s[-1] = d;
    return s;
  }
  Shape drop_last(int n = 1) const { return Shape(begin(), end() - n); }
  std::vector<int64_t> vec() const { return {begin(), end()}; }

  bool operator==(const Shape& o) const {
    return ndim_ == o.ndim_ && std::equal(begin(), end(), o.begin());
  }
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < ndim_; ++i) s += (i ? ", " : "") + std::to_string(dims_[static_cast<size_t>(i)]);
    return s + "]";
  }

 private:
  template <typename It>
  void assign(It first, It last) {
    ndim_ = 0;
    for (; first != last; ++first) {
      push_back(static_cast<int64_t>(*first));
      LOOM_CHECK(dims_[static_cast<size_t>(ndim_ - 1)] >= 0, "negative dimension ", *first, " in shape");
    }
  }
  int normalize(int i) const {
    int j = i < 0 ? i + ndim_ : i;
    LOOM_CHECK(j >= 0 && j < ndim_, "dimension ", i, " out of range for a ", ndim_, "-d shape");
    return j;
  }
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

inline std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

}  // namespace loom
