// The dispatch of the routed experts (ops/moe.h), shared by the CPU and CUDA kernels (backends/cpu/moe.h,
// backends/cuda/moe.h): computed on the host from the routing alone, so its layout never depends on the
// device or the thread count.
//
// Legend: N tokens, E routed experts, K experts per token, P = N*K routed slots (slot s = n*K + k is token
// n's k-th choice).
//
// A counting sort by expert orders the P slots so that each expert's slots are one contiguous run of
// "rows": expert e owns rows [offsets[e], offsets[e+1]), and within a run the slots keep their order
// (token-major). Row p holds slot slot_of_row[p] and reads token token_of_row[p]; slot s sits at row
// row_of_slot[s]. The CPU kernels run each expert's run as one group of a grouped GEMM (cpu/gemm.h).
#pragma once

#include <cstdint>
#include <vector>

namespace loom {

struct MoeDispatch {
  int64_t N = 0, K = 0, E = 0;
  std::vector<int64_t> offsets;      // [E+1]
  std::vector<int32_t> slot_of_row;  // [P]
  std::vector<int32_t> row_of_slot;  // [P]
  std::vector<int32_t> token_of_row;  // [P]: slot_of_row / K
};

// expert_index: [N,K], every value in [0, E) (checked by the op).
MoeDispatch moe_dispatch(const int32_t* expert_index, int64_t N, int64_t K, int64_t E);

}  // namespace loom
