// Routing on the GPU, bit for bit as CpuEngine::MoE: for each token, ggml's softmax over the n_expert router logits (f32
// [n_tokens, n_expert]), the top k by probability (ties to the lower id), and with norm_topk the
// weights renormalised over the k chosen (sum in double, clamped at 2^-14 as llama.cpp).
// chosen: int32 [n_tokens, k]; weights: f32 [n_tokens, k]. n_expert <= 1024, k <= 32.
// For a single token (decode), with slot_table and groups given, also writes the expert groups
// of moe_group.cuh (the k experts ascending, one pair each), saving that launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "services/compute/cuda/device_layout.cuh"
#include "services/compute/cuda/moe_group.cuh"

namespace mer::cuda {

void LaunchRouterTopK(const float* logits, int n_tokens, int n_expert, int k, bool norm_topk, int32_t* chosen,
                      float* weights, const int32_t* slot_table, const MoeGroups* groups, cudaStream_t stream);

// Preselected routes (backend.h's RouteOverride) given without weights: chosen holds each token's
// k given experts (int32 [n_tokens, k], distinct and < n_expert: checked by the host), and their
// weights are LaunchRouterTopK's probabilities of them, renormalised as its choices are with
// norm_topk (CpuEngine::MoE's formula, bit for bit). weights: f32 [n_tokens, k].
void LaunchRouteWeights(const float* logits, int n_tokens, int n_expert, int k, bool norm_topk, int32_t* chosen,
                        float* weights, cudaStream_t stream);

// The decode step's routing in one launch: the f32 router mat-vec of one token (x: f32 [n_embd],
// router: f32 [n_expert, n_embd]) fused with LaunchRouterTopK's work for that token, the groups
// included. blocks_done: a device counter that is 0 between launches (the kernel resets it).
// With next.router set, the same is done for a second router on the same x (the next layer's:
// the look-ahead prediction of its routing) into next's outputs.
struct Router1Next {
  const float* router = nullptr;  // f32 [n_expert, n_embd], or nullptr
  float* logits = nullptr;        // f32 [n_expert] scratch
  int32_t* chosen = nullptr;
  float* weights = nullptr;
  const int32_t* slot_table = nullptr;
  MoeGroups groups{};
};
// With residual set, the MoE block's RMSNorm runs in the same launch, before the mat-vec: every
// block normalises the residual row itself (the values LaunchRmsNorm writes), uses it as x, and
// writes its share of the experts' activations (act), so the norm costs no launch of its own.
struct Router1Norm {
  const float* residual = nullptr;  // f32 [n_embd], or nullptr: x is already normalised
  const float* w = nullptr;         // f32 [n_embd], the norm's weights
  float eps = 0.0f;
  DevAct act{};  // F32/F16/BF16/Q8_0 (not Q8_K: RouterTopK1NormSupported)
};
struct Router1Args {
  const float* router;
  const float* x;  // f32 [n_embd], unused with norm.residual
  int32_t n_embd, n_expert, k;
  bool norm_topk;
  float* logits;  // f32 [n_expert] scratch
  unsigned int* blocks_done;
  int32_t* chosen;
  float* weights;
  const int32_t* slot_table;  // this layer's
  MoeGroups groups;
  Router1Next next;
  Router1Norm norm;
};
bool RouterTopK1Supported(int64_t n_embd, int n_expert);
bool RouterTopK1NormSupported(int act_type);
void LaunchRouterTopK1(const Router1Args& args, cudaStream_t stream);

}  // namespace mer::cuda
