// Pipeline parallelism: the mesh's `pipe` axis (docs/mesh.md, "The pipe axis").
//
// The blocks are cut into `pipe` stages, stage s running blocks [bounds[s], bounds[s + 1]); the first
// stage also embeds the tokens, the last also runs the final norm, the head and the loss. A step's
// micro-batches (training.grad_accum_steps of them) flow through the stages: each stage receives a
// micro-batch's activations [b, T, C] from the previous stage (point to point), runs its blocks and
// sends the result on; the backward sends the gradient of those activations back the same way.
//
//   GPipe  every forward, then every backward (micro-batches 0, 1, ... both times): a stage holds the
//          activations of all M micro-batches at once.
//   1F1B   stage s runs min(P - s - 1, M) forwards ahead, then alternates one forward and one backward,
//          then the remaining backwards: at most P - s micro-batches in flight.
//   interleaved 1F1B (Narayanan et al. 2021): the blocks cut into P * v stages, rank s running virtual
//          stages s, P + s, 2P + s, ... (its v chunks); 1F1B over the chunks in Megatron-LM's order
//          (groups of P micro-batches per chunk), so fill and drain take 1/v as long: bubble
//          (P - 1) / (v M + P - 1), for v times the point-to-point messages. M must be a multiple of P.
//
// Both run every stage's backwards in micro-batch order, so each gradient accumulates over the
// micro-batches in the order one process adds them, and the step equals one process's up to the
// summation order inside autograd (the tests hold it to 1e-5). Idle time (waiting for a neighbour) is the
// bubble; with equal stages it is (P - 1) / (M + P - 1) of the step.
//
// Parameters are never split over `pipe`: every rank builds the whole model, then keeps only the
// parameters its stage runs (nn::Parameter::pipe_stages; the others' values become empty, and so do
// their AdamW moments); gather_whole and checkpoints take each from its first stage. A
// token table tied to the head (GPT-2) is used by the first and the last stage: its gradient is summed
// over the two (finish_pipe_gradients) and both apply the same AdamW update, so the copies stay
// bitwise equal. Data, fsdp and tensor parallelism run inside each stage on its own data x tensor mesh.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mesh/rank_context.h"
#include "models/model.h"
#include "nn/parameter.h"

namespace loom::dist {

// Bounds (stages + 1 entries, from 0 to block_cost.size()) that minimise the most expensive stage, each
// stage at least one block: stage s costs the sum of its blocks' costs, plus first_cost on stage 0 and
// last_cost on the last. Exact (dynamic programming over the cut points). Throws when stages exceeds the
// blocks, naming both.
std::vector<int64_t> balanced_stage_bounds(const std::vector<double>& block_cost, double first_cost, double last_cost,
                                           int64_t stages);
// The estimate loom balances by: a block's cost is its parameter elements (a GEMM's FLOPs per token are
// twice its weight's elements), the last stage adds the head's (V x C), the first nothing (a lookup).
std::vector<int64_t> estimated_stage_bounds(models::LanguageModel& model, int64_t stages);
// Bounds from blocks per stage set by hand ("3,1": parallel.pipe_layers). Throws naming the text when
// it does not list `stages` positive counts summing to `layers`.
std::vector<int64_t> stage_bounds_from_counts(const std::string& counts, int64_t layers, int64_t stages);

// Under a pipe axis, from shard_model: fills c.pipe_bounds if empty (estimated_stage_bounds over
// pipe * pipe_chunks stages), checks them against the model, and gives every parameter its pipe_stages
// (pipe coordinates).
void plan_pipeline(models::LanguageModel& model, const RankContext& c);

// One micro-batch as this rank sees it: its rows of the batch, and the forward's context.
struct MicroBatch {
  Tensor ids, targets;  // i32 [b, T]
  models::ForwardContext ctx;
};

// One forward or backward of a micro-batch through one of a rank's stages (its chunk: always 0 but
// under interleaved 1F1B, where chunk k of pipe coordinate s is virtual stage k * stages + s).
struct PipeStep {
  bool forward;
  int64_t chunk, micro;
};
// The order in which pipe coordinate `stage` of `stages` runs the forwards and backwards of
// micro-batches 0..micro-1 under `schedule` ("gpipe", "1f1b", or "interleaved" with `chunks` >= 2
// virtual stages per rank and micro a multiple of stages, as Megatron-LM's schedule needs). Every
// chunk's backwards come in micro-batch order.
std::vector<PipeStep> pipeline_order(const std::string& schedule, int64_t stages, int64_t stage, int64_t micro,
                                     int64_t chunks = 1);
// The bubble of equal stages: (stages - 1) / (chunks * micro + stages - 1); chunks is 1 but for
// interleaved 1F1B, whose fill and drain run chunk-sized pieces (Narayanan et al. 2021).
double ideal_bubble(int64_t stages, int64_t micro, int64_t chunks = 1);
// Checks a schedule's name against its virtual stages per rank, and (micro > 0) the micro-batches;
// throws naming the value.
void check_pipe_schedule(const std::string& schedule, int64_t chunks, int64_t stages, int64_t micro = 0);

struct PipelineTiming {
  double seconds = 0;       // this rank's forwards and backwards of the step, wall clock
  double busy_seconds = 0;  // of which running its stage (the rest waited for a neighbour)
  int64_t peak_in_flight = 0;  // micro-batches whose activations this rank held at once
};

// The forwards and backwards of one optimizer step on this rank's stage, in c.pipe_schedule's order.
// Each micro-batch's loss is scaled by 1 / micro.size() before its backward (the trainer's mean over
// micro-batches); the parameters' .grad accumulate as in one process and want finish_gradients and
// finish_pipe_gradients next. Returns the sum over micro-batches of the global batch's loss (global_loss
// of each), the same on every rank. Collective over the mesh.
double pipeline_step(const models::LanguageModel& model, const std::vector<nn::Parameter*>& params,
                     const std::vector<MicroBatch>& micro, const RankContext& c, PipelineTiming* timing = nullptr);
// After finish_gradients: the gradient of a parameter used by several stages (a tied table) summed
// over them, so each holds the single-process gradient.
void finish_pipe_gradients(const std::vector<nn::Parameter*>& params, const RankContext& c);
// The global batch's loss of this rank's rows, forward only through the stages (validation); the same
// on every rank.
double pipeline_loss(const models::LanguageModel& model, const Tensor& ids, const Tensor& targets,
                     const RankContext& c);

}  // namespace loom::dist
