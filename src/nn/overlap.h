// What overlapping communication with compute remembers between layers and across a step (docs/mesh.md,
// "What is overlapped"): the FSDP Linear (nn/sharded.cpp) prefetches the next weight and reduce-scatters
// gradients in the background; the step's backward and finish_gradients (parallel/runtime.cpp) start the
// data-axis all-reduces in buckets and wait for everything. One per rank, made by shard_model and kept in
// RankContext::overlap_state.
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "mesh/rank_context.h"
#include "nn/parameter.h"
#include "ops/collective.h"

namespace loom::dist {

// One per rank; every rank takes the same decisions in the same
// order, so they start the same collectives in the same order.
struct OverlapState {
  // An FSDP Linear as a pass meets it: the weight, and the bias its forward gathers with it.
  struct Use {
    const nn::Parameter* weight = nullptr;
    const nn::Parameter* bias = nullptr;
  };
  // The order the forward (or the backward) pass gathers FSDP weights in, learned from the first pass:
  // complete when a weight comes round again, when the pass after it begins, or at finish_gradients.
  // Once complete it is cut into groups, the runs of uses of one block (nn/sharded.cpp), each gathered
  // in one collective.
  struct Order {
    std::vector<Use> uses;
    std::unordered_map<const nn::Parameter*, size_t> position;
    std::vector<size_t> group_end;  // per use, one past the last use of its group (made once learned)
    bool learned = false;
    void note(const Use& u) {
      if (learned) return;
      if (position.count(u.weight)) {
        learned = true;
        return;
      }
      position[u.weight] = uses.size();
      uses.push_back(u);
    }
    void close() { learned = learned || !uses.empty(); }
    const Use* find(const nn::Parameter* weight) const {
      auto it = position.find(weight);
      return it == position.end() ? nullptr : &uses[it->second];
    }
  };
  Order forward, backward;
  // A group's weights and biases, one collective's worth: every member's shard packed one after another
  // into a rank's block of `block` floats, `ranks` blocks back to back.
  struct Packing {
    std::vector<const nn::Parameter*> members;  // in packing order
    std::vector<int64_t> offsets;               // of each member's shard in a block
    int64_t block = 0, ranks = 0;
    // The member's index, or members.size() when p is not one.
    size_t index_of(const nn::Parameter* p) const {
      size_t m = 0;
      while (m < members.size() && members[m] != p) ++m;
      return m;
    }
    bool has(const nn::Parameter* p) const { return index_of(p) < members.size(); }
  };
  // A group's shards gathered whole in one all-gather, the ranks' blocks in `raw` ([ranks * block]).
  struct Gathered : Packing {
    Tensor raw;
  };
  // The group the pass is in (its whole weights are copied out of it as each Linear needs them), and
  // the next group's gather, started when this one's first Linear runs: at most two blocks' weights
  // whole at a time. Both are dropped after a pass's last Linear and at finish_gradients, so nothing
  // gathered outlives the pass (or sees the optimizer change the shards).
  Gathered current;
  struct Prefetch {
    Gathered group;
    ops::StartedCollective done;  // gives the group's raw
    const Order* order = nullptr;
    size_t end = 0;  // the group's end in *order
  } prefetch;
  // FSDP gradients being reduce-scattered, oldest first; each part is added to its shard's .grad on
  // completion (in start order, which is the order backward() would have added them in). A sum holds
  // one gradient, or a block's (a bucket): the parts' shards packed one after another in its result.
  struct GradPart {
    Tensor shard;
    bool accumulate = true;
    int64_t offset = 0;  // in the sum's result
  };
  struct GradSum {
    std::vector<GradPart> parts;
    ops::StartedCollective sum;
  };
  // The bucket of the block whose backward is running: its gradients, whole, packed as they come for
  // one reduce-scatter, started when the block's last Linear (in the backward's order) has added its own.
  struct GradBucket : Packing {
    std::vector<char> added, accumulate;
    size_t end = 0;  // the group's end in the backward's order
    Tensor packed;   // [ranks, block]: rank r's block holds every member's block r
  };
  GradBucket bucket;
  std::deque<GradSum> grads;
  // Data-axis all-reduces of the other gradients: the bucket being filled, and the started ones.
  struct Bucket {
    std::vector<nn::Parameter*> params;
    int64_t bytes = 0;
    Tensor flat;
    Communicator::Pending work;
  };
  Bucket filling;
  std::deque<Bucket> buckets;
  std::unordered_set<const nn::Parameter*> bucketed;  // this step's, whose all-reduce has started
};


// The state when overlap is on, else null.
OverlapState* overlap_of(const RankContext& c);
// Started gradient sums before the newest `keep` are completed (added to their shards' .grad).
void complete_grad_sums(OverlapState& s, size_t keep);
// The open gradient bucket's reduce-scatter started (nothing when none is open).
void start_bucket_sum(OverlapState& s, const RankContext& c);

}  // namespace loom::dist
