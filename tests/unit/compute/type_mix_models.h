// The per-tensor type mixes that both backends' tests run: the CPU engine against the double
// reference (cpu_engine_test.cc) and the cuda backend against the CPU engine
// (tests/gpu/cuda_engine_test.cc). Their geometry, and the mixes the two run alike.
#pragma once

#include <map>
#include <string>

#include "common/model/synth_model.h"
#include "common/tensor/ggml_type.h"

namespace mer::test {

// The micro preset with every matrix's rows 256 long (n_embd and n_ff_exp 256, 4 heads of 64), so
// that any type, the 256-element K-quant and IQ blocks included, can take any matrix; 4 experts,
// every one used: an activation rounding cannot change which experts a token takes, which would
// move its logits far from those it is compared with.
inline SynthGeometry TypeMixGeometry() {
  SynthGeometry g = *SynthPreset("micro");
  g.n_embd = g.n_ff_exp = 256;
  g.n_head = 4;
  g.head_dim = 64;
  g.n_expert = g.n_expert_used = 4;
  return g;
}

// IQ3_S, IQ2_S and IQ1_S in every role (the embedding rows, the LM head, attention, experts: each
// of them as gate, as up and as down), beside types of the other activation formats: layer 1's
// attn_k Q8_0, and its up Q5_1 (Q8_1 activations) beside its gate's IQ2_S (Q8_K).
inline std::map<std::string, GgmlType> SGridTypeMix() {
  return {
      {"token_embd.weight", GgmlType::kIQ3_S},
      {"output.weight", GgmlType::kIQ2_S},
      // Layer 0: the three grids, and IQ4_NL (Q8_0 activations).
      {"blk.0.attn_q.weight", GgmlType::kIQ1_S},
      {"blk.0.attn_k.weight", GgmlType::kIQ2_S},
      {"blk.0.attn_v.weight", GgmlType::kIQ3_S},
      {"blk.0.attn_output.weight", GgmlType::kIQ4_NL},
      {"blk.0.ffn_gate_exps.weight", GgmlType::kIQ1_S},
      {"blk.0.ffn_up_exps.weight", GgmlType::kIQ2_S},
      {"blk.0.ffn_down_exps.weight", GgmlType::kIQ3_S},
      // Layer 1: the grids in other roles, beside Q8_0 and Q5_1.
      {"blk.1.attn_q.weight", GgmlType::kIQ3_S},
      {"blk.1.attn_k.weight", GgmlType::kQ8_0},
      {"blk.1.attn_v.weight", GgmlType::kIQ1_S},
      {"blk.1.attn_output.weight", GgmlType::kIQ2_S},
      {"blk.1.ffn_gate_exps.weight", GgmlType::kIQ2_S},
      {"blk.1.ffn_up_exps.weight", GgmlType::kQ5_1},
      {"blk.1.ffn_down_exps.weight", GgmlType::kIQ1_S},
  };
}

}  // namespace mer::test
