// The dispatch of the routed experts (ops/moe.h), shared by the CPU and CUDA kernels (backends/cpu/moe.h,
// backends/cuda/moe.h): computed on the host from the routing alone, so its layout never depends on the
// device or the thread count.
//
// Legend: N tokens, E routed experts, K experts per token, P = N*K routed slots (slot s = n*K + k is token
// n's k-th choice), R rows per tile (kMoeRowTile).
//
// A counting sort by expert orders the P slots so that each expert's slots are one contiguous run of
// "rows": expert e owns rows [offsets[e], offsets[e+1]), and within a run the slots keep their order
// (token-major). Row p holds slot slot_of_row[p]; slot s sits at row row_of_slot[s]. Every run is cut
// into tiles of at most R rows: the CPU kernels' unit of work.
#pragma once

#include <cstdint>
#include <vector>

namespace loom {

// Rows per expert tile. 128 keeps a tile's x, SwiGLU activations and output (C, F in the hundreds) in
// L2 while giving oneDNN a full-height block. bench/moe.cpp, dsv3-mini shapes, 1 thread, MoE / dense CPU
// time (medians of 5): 1.11 with 64 rows, 1.04 with 128, 1.11 with 256.
constexpr int64_t kMoeRowTile = 128;

struct MoeDispatch {
  int64_t N = 0, K = 0, E = 0;
  std::vector<int64_t> offsets;      // [E+1]
  std::vector<int32_t> slot_of_row;  // [P]
  std::vector<int32_t> row_of_slot;  // [P]
  struct Tile {
    int32_t expert;
    int64_t begin, end;  // rows
  };
  std::vector<Tile> tiles;  // every expert's run cut into R-row tiles, in expert order
};

// expert_index: [N,K], every value in [0, E) (checked by the op).
MoeDispatch moe_dispatch(const int32_t* expert_index, int64_t N, int64_t K, int64_t E);

}  // namespace loom
