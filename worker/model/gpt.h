// The decoder's forward and backward, written op by op (no autograd), for
// every architecture its description (GptConfig) names: GPT-2, and the Llama
// family with RMSNorm, RoPE, grouped-query attention, SwiGLU and an untied
// classifier. Parameters are reached only through ParamStore uses;
// activations come from a counted Arena. With activation checkpointing only
// each block's input is kept and the block is recomputed during backward,
// giving bit-identical gradients.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "worker/core/arena.h"
#include "worker/core/status.h"
#include "worker/model/gpt_config.h"
#include "worker/model/model_kernels.h"
#include "worker/model/param_layout.h"
#include "worker/model/param_store.h"

namespace pstar {

// Model tensors in order of first use: the embeddings, each block's tensors,
// the final norm and an untied classifier. Names are the Hugging Face
// model's (transformer.h.0.attn.c_attn.weight for GPT-2,
// model.layers.0.self_attn.q_proj.weight for the Llama family), with weights
// stored (out, in) as in PyTorch's nn.Linear; q|k|v and gate|up are joined
// (one GEMM operand, ParamLayout).
std::vector<TensorSpec> GptTensorSpecs(const GptConfig& config);
// The same tensors as checkpoints, exports and users see them: without the
// vocabulary padding (wte has vocab_size rows), each whole (not in row parts).
std::vector<TensorSpec> GptVisibleTensorSpecs(const GptConfig& config);

// The rows of each row part of the token table and the untied classifier
// (padded_vocab_size when they are whole). GPT-2's are whole: its layout and
// bits are what they have always been. A Llama-family table larger than the
// largest group of tensors a block op reads is split into parts of at most
// that many elements (multiples of 64 rows, as even as that allows), so
// that a 128k vocabulary does not set the chunk size. A function of the
// model alone: every chunk size and world size sees the same parts.
int64_t VocabPartRows(const GptConfig& config);

// Fills every parameter from the counter RNG keyed by (tensor name, element):
// normal(0, std) weights, zero biases, unit norm weights.
void InitParameters(ParamStore& store, uint64_t seed);

// The parameter brackets one micro-batch of `tokens` (batch * seq) tokens'
// Forward and Backward open, in order: what the chunk trace will record,
// known before running (plans, budget checks). A test holds it equal to the
// recorded trace.
std::vector<AccessMoment> GptAccessSequence(const GptConfig& config, const ParamLayout& layout, bool recompute,
                                            int64_t tokens);

// One micro-batch in host memory: batch*seq tokens and their next-token
// targets (a negative target is a position the loss ignores: a prompt's
// token, a packed row's padding) and, where rows hold packed examples, each
// token's position in its example (kernels/attention.h: attention stays in
// the example, RoPE restarts with it); null: each row one sequence from 0.
struct MicroBatch {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  const int32_t* positions = nullptr;
};

class Gpt {
 public:
  // Bytes of activations and workspaces one micro-batch of (batch, seq) needs
  // on `device` (its kernels' scratch included).
  static int64_t ActivationBytes(const GptConfig& config, int64_t batch, int64_t seq, bool recompute,
                                 const ComputeSpec& compute = {}, bool keep_gelu = false);

  // Binds the model to `store` (laid out by GptTensorSpecs) and carves its
  // activations from `arena`, both in the memory of `kernels`' device (the CPU
  // kernels when null). `recompute`: each block's activations are recomputed
  // in backward from its input (activation checkpointing). Otherwise
  // `keep_gelu` keeps every layer's GELU output for its backward (4C more
  // per token per layer) instead of recomputing it there from the kept
  // pre-activation; the same bits either way.
  static Result<Gpt> Create(const GptConfig& config, ParamStore& store, Arena& arena, int64_t batch, int64_t seq,
                            bool recompute, std::unique_ptr<ModelKernels> kernels = nullptr, bool keep_gelu = false);

  // One micro-batch, for its loss only (evaluation, sampling). Its summed
  // loss is added to the loss accumulator on the device, without waiting.
  // With `logits` (host memory, batch*seq x vocab_size floats), the logits
  // are also copied out (waiting for the device): for tests, inspection and
  // sampling; `logits_rows` >= 0 copies only the first that many rows.
  void Forward(const MicroBatch& batch, float* logits = nullptr, int64_t logits_rows = -1);
  // The same for training: Backward follows, adding d(token_weight * the
  // summed loss of the counted positions)/d(params): 1 / (their count) for
  // their mean. The classifier's loss and dlogits are one pass here
  // (ClassifierRows: when the micro-batch's logits are kept whole, dlogits
  // are written now). With `logits`, they are copied out first, as above.
  void TrainForward(const MicroBatch& batch, float token_weight, float* logits = nullptr);
  // The mean loss per counted position over the Forwards since the last
  // call (waits for the device once).
  double TakeLoss();
  // The summed loss and the counted positions it is over, since the last
  // call (waits once): what ranks add up before they divide.
  struct LossTotals {
    double sum = 0.0;
    int64_t positions = 0;
  };
  LossTotals TakeLossTotals();
  // The same from a loss sum the kernels gave already (a training step takes
  // it with its gradients' sums, ModelKernels::TakeStepSums, in one wait).
  LossTotals LossTotalsOf(double loss_sum);
  // Adds the gradients of the last TrainForward's micro-batch, weighted as it
  // said, into the gradient chunks. Only after a TrainForward. Where the
  // dlogits are kept whole, the classifier's weight gradient waits for the
  // end, beside the embeddings' backward: the first gradient chunk is final
  // that much sooner, and the tied embedding's gradient chunk is untouched
  // (not partial) through the blocks' backward. The same bits either way.
  void Backward();

  const GptConfig& config() const { return config_; }
  // The kernels the model runs on (the optimizer's reductions use them too).
  ModelKernels& kernels() { return *kernels_; }

 private:
  // The tensors one op reads: its weight (the first of its joined weights)
  // and bias (-1: none), and every tensor its use acquires.
  struct OpTensors {
    TensorId w = -1, b = -1;
    std::vector<TensorId> ids;
  };
  // A block's ops in forward order.
  enum BlockOp { kNorm1 = 0, kQkv, kAttnProj, kNorm2, kFc, kFcProj, kBlockOps };
  using LayerTensors = std::array<OpTensors, kBlockOps>;
  // What one block keeps for its backward pass. The ActTensors are 16-bit
  // in a 16-bit run (model_kernels.h).
  // ln1/ln2: the norms' outputs; qkv: q|k|v (q and k rotated with RoPE);
  // atty: the attention's output; res2: the residual stream after attention;
  // fch: the MLP's first GEMM's output (fc, or gate|up).
  struct BlockActivations {
    ActTensor ln1, qkv, atty, res2, ln2, fch;
    ActTensor fch_gelu;                // the MLP's activation (GELU or SwiGLU), when kept per layer (keep_gelu)
    float *ln1_mean, *ln1_rstd, *lse;  // lse: (B, NH, T); the means: LayerNorm only
    float *ln2_mean, *ln2_rstd;
  };
  struct Activations {
    std::vector<ActTensor> residual;  // n_layer + 1 block inputs, (B, T, C) each
    std::vector<BlockActivations> blocks;  // one per layer, or one shared when recomputing
    ActTensor lnf;
    float *lnf_mean, *lnf_rstd, *losses;
    // The classifier's logits (ClassifierRows rows, padded vocab) in the
    // run's activation format, turned into dlogits in place.
    ActTensor logits;
    float* tmp;  // (B, T, C) projection output before the residual add
    // The MLP's activation (B, T, F), one for all layers: backward recomputes
    // a layer's from its fch (F per token per layer less memory). Empty when
    // every layer keeps its own (BlockActivations::fch_gelu).
    ActTensor fch_gelu;
    // Backward workspaces, reused by every layer.
    // The residual stream's gradient (fp32: every layer adds to it), and in a
    // 16-bit run its 16-bit copy, the operand of the GEMMs that read it
    // (LayerNormBackward writes both; in an fp32 run dres_gemm is dres). The
    // other activation gradients are in the run's activation format.
    float* dres;
    ActTensor dres16, dres_gemm;
    ActTensor dtmp, dqkv, dfch;
    ActTensor dmlp;  // SwiGLU's output gradient (B, T, F); empty with GELU (in place in dfch)
    int32_t *tokens, *targets;
    // Each token's position (RoPE's, the attention mask's and the learned
    // table's row with packed examples); RoPE's cos/sin tables (seq rows),
    // null with learned positions.
    int32_t* positions;
    float *rope_cos, *rope_sin;
    void* scratch;  // the kernels' (KernelScratchBytes), null when none
  };

  Gpt(const GptConfig& config, int64_t batch, int64_t seq, bool recompute, const ComputeSpec& compute, bool keep_gelu);
  // Assigns every activation pointer from alloc(elements), in one fixed order.
  template <typename Alloc>
  void Lay(Alloc&& alloc);
  Status Carve(Arena& arena);
  BlockActivations& BlockActs(int64_t layer);
  // Where a block's GELU output lives: its own (keep_gelu) or the shared one.
  ActTensor GeluOutput(const BlockActivations& a) const { return keep_gelu_ ? a.fch_gelu : acts_.fch_gelu; }
  // A param as the kernels read it: 16-bit with 16-bit parameter chunks;
  // none for id -1.
  Param P(const ParamStore::Use& u, TensorId id) const {
    if (id < 0) return Param{};
    return store_->chunks().half_params() ? Param{nullptr, u.half_param(id)} : Param{u.param(id), nullptr};
  }
  // A gradient, or null for id -1.
  static float* G(const ParamStore::Use& u, TensorId id) { return id < 0 ? nullptr : u.grad(id); }
  kernels::AttentionShape Shape() const {
    return {B_, T_, config_.n_head, config_.kv_heads(), config_.head_size(), packed_ ? acts_.positions : nullptr};
  }
  const RopeTable* Rope() const { return rotary_ ? &rope_ : nullptr; }
  // Norm forward (LayerNorm or RMSNorm) of inp into out, and its backward.
  void NormForward(const OpTensors& t, ActTensor out, float* mean, float* rstd, ActTensor inp);
  void NormBackward(const OpTensors& t, ActTensor dout, ActTensor inp, const float* mean, const float* rstd);
  // The MLP's activation of fch into out (GELU or SwiGLU).
  void MlpActivation(ActTensor out, ActTensor fch);
  // Forward for its loss and, with a loss weight, readying Backward.
  void RunForward(const MicroBatch& batch, std::optional<float> token_weight, float* logits, int64_t logits_rows);
  void BlockForward(int64_t layer, ActTensor x, ActTensor y);
  // The logits of rows [r0, r0 + n) part by part, each part in a use of its
  // own (forward, or a backward use of its values alone).
  void ClassifierPartsForward(int64_t r0, int64_t n, Pass pass);
  // dlnf of rows [r0, r0 + n) from their dlogits, summed over the parts in
  // order, and with `weight_grads` each part's weight gradient too.
  void ClassifierPartsInputGrad(int64_t r0, int64_t n, bool weight_grads);
  void BlockBackward(int64_t layer, ActTensor x);

  GptConfig config_;
  ParamStore* store_;
  int64_t B_, T_;
  bool recompute_;
  bool keep_gelu_;  // never with recompute_
  ComputeSpec compute_;
  int64_t classifier_rows_;  // ClassifierRows of the micro-batch
  int64_t loss_tokens_ = 0;  // counted positions in the loss accumulator
  // The micro-batch under way holds packed examples: acts_.positions holds
  // its positions (else each row's 0..T-1).
  bool packed_ = false;
  // What Backward has to do for the classifier: nothing is pending (no
  // TrainForward since the last Backward), dlogits are in the logits buffer,
  // or each block's logits are to be computed again; and d(loss)/d(logit)'s
  // weight.
  enum class ClassifierBackward { kNone, kDlogitsReady, kRecompute };
  ClassifierBackward pending_ = ClassifierBackward::kNone;
  float dloss_ = 0.0f;
  std::unique_ptr<ModelKernels> kernels_;
  // A vocabulary table's row parts: rows [row0, row0 + rows) in tensor `id`.
  struct RowPart {
    TensorId id = -1;
    int64_t row0 = 0, rows = 0;
  };
  // The token table's and the classifier's (the token table's when tied)
  // parts, one when whole; the position table (-1 with RoPE).
  std::vector<RowPart> embed_parts_, cls_parts_;
  TensorId wpe_ = -1;
  OpTensors final_norm_;
  std::vector<LayerTensors> layers_;
  bool rotary_ = false;
  RopeTable rope_;
  Activations acts_{};
};

}  // namespace pstar
