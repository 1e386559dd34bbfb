// Element types and devices: small value types that check their invariants (c10-style).
#pragma once

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>

#include "core/error.h"

namespace loom {

enum class DType : uint8_t {
  F32,   // float
  BF16,  // bfloat16 storage; kernels accumulate in f32
  I32,   // int32: token ids, positions, targets
  U16,   // uint16: token files (the nanoGPT/llm.c .bin convention)
  Bool,  // one byte, 0 or 1: attention masks (true = may attend)
};

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::U16: return 2;
    case DType::Bool: return 1;
  }
  LOOM_ASSERT(false, "unknown dtype");
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::U16: return "u16";
    case DType::Bool: return "bool";
  }
  return "?";
}

inline DType dtype_from_name(const std::string& name) {
  if (name == "f32" || name == "float32") return DType::F32;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  if (name == "i32" || name == "int32") return DType::I32;
  if (name == "u16" || name == "uint16") return DType::U16;
  if (name == "bool") return DType::Bool;
  LOOM_FAIL("unknown dtype '", name, "' (expected f32, bf16, i32, u16 or bool)");
}

inline bool is_floating(DType t) { return t == DType::F32 || t == DType::BF16; }

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

// bfloat16 <-> float. Rounding to nearest even, as PyTorch and oneDNN do; NaN stays NaN.
struct bf16 {
  uint16_t bits = 0;
  static bf16 from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    bf16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      r.bits = static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      r.bits = static_cast<uint16_t>(u >> 16);
    }
    return r;
  }
  float to_float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<bf16>() { return DType::BF16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::U16; }
template <> constexpr DType dtype_of<bool>() { return DType::Bool; }

enum class DeviceType : uint8_t { CPU, CUDA };

// Where a tensor's memory lives. CPU now; CUDA devices carry an index.
class Device {
 public:
  constexpr Device() = default;
  Device(DeviceType type, int index = 0) : type_(type), index_(index) {
    LOOM_CHECK(index >= 0, "device index must be >= 0, got ", index);
    LOOM_CHECK(type != DeviceType::CPU || index == 0, "the CPU device has index 0, got ", index);
  }
  static Device cpu() { return Device(); }
  static Device cuda(int index = 0) { return Device(DeviceType::CUDA, index); }
  // Parses "cpu", "cuda", "cuda:1".
  static Device parse(const std::string& s);

  DeviceType type() const { return type_; }
  int index() const { return index_; }
  bool is_cpu() const { return type_ == DeviceType::CPU; }
  bool is_cuda() const { return type_ == DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index_); }

 private:
  DeviceType type_ = DeviceType::CPU;
  int index_ = 0;
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

}  // namespace loom
