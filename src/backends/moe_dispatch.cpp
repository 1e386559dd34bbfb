#include "backends/moe_dispatch.h"

#include <cstddef>

namespace loom {

MoeDispatch moe_dispatch(const int32_t* expert_index, int64_t N, int64_t K, int64_t E) {
  MoeDispatch d;
  d.N = N;
  d.K = K;
  d.E = E;
  const int64_t P = N * K;
  d.offsets.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t s = 0; s < P; ++s) ++d.offsets[static_cast<size_t>(expert_index[s]) + 1];
  for (int64_t e = 0; e < E; ++e) d.offsets[static_cast<size_t>(e + 1)] += d.offsets[static_cast<size_t>(e)];
  // Stable counting sort: slots in increasing order land at increasing rows of their expert's run.
  std::vector<int64_t> next(d.offsets.begin(), d.offsets.end() - 1);
  d.slot_of_row.resize(static_cast<size_t>(P));
  d.row_of_slot.resize(static_cast<size_t>(P));
  for (int64_t s = 0; s < P; ++s) {
    const int64_t row = next[static_cast<size_t>(expert_index[s])]++;
    d.slot_of_row[static_cast<size_t>(row)] = static_cast<int32_t>(s);
    d.row_of_slot[static_cast<size_t>(s)] = static_cast<int32_t>(row);
  }
  d.token_of_row.resize(static_cast<size_t>(P));
  for (int64_t p = 0; p < P; ++p)
    d.token_of_row[static_cast<size_t>(p)] = static_cast<int32_t>(d.slot_of_row[static_cast<size_t>(p)] / K);
  return d;
}

}  // namespace loom
