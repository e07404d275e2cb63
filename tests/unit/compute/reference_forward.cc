#include "tests/unit/compute/reference_forward.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/quant/quant.h"

namespace mer::testing {
namespace {

using Vec = std::vector<double>;

Vec Row(const MatrixView& m, int64_t r) {
  std::vector<float> f(m.cols);
  DequantizeRow(m.type, m.row(r), f.data(), m.cols);
  return Vec(f.begin(), f.end());
}

// y = M x for M [rows, cols].
Vec MatVec(const MatrixView& m, const Vec& x, int64_t row0 = 0, int64_t rows = -1) {
  if (rows < 0) rows = m.rows;
  Vec y(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const Vec w = Row(m, row0 + r);
    y[r] = std::inner_product(w.begin(), w.end(), x.begin(), 0.0);
  }
  return y;
}

Vec RmsNorm(const Vec& x, const float* w, double eps, int64_t off = 0, int64_t n = -1) {
  if (n < 0) n = static_cast<int64_t>(x.size());
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
  const double s = 1.0 / std::sqrt(ss / n + eps);
  Vec y(n);
  for (int64_t i = 0; i < n; ++i) y[i] = x[off + i] * s * w[i];
  return y;
}

void Softmax(Vec& x) {
  const double m = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (double& v : x) sum += (v = std::exp(v - m));
  for (double& v : x) v /= sum;
}

}  // namespace

std::vector<std::vector<double>> ReferenceForward(const ModelWeights& w, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = w.config();
  const int64_t E = c.n_embd, HD = c.head_dim;
  const int n = static_cast<int>(tokens.size());
  std::vector<std::vector<Vec>> kc(c.n_layer), vc(c.n_layer);  // [layer][pos] kv_dim
  std::vector<std::vector<double>> out;
  for (int p = 0; p < n; ++p) {
    Vec x = Row(w.token_embd, tokens[p]);
    for (int il = 0; il < c.n_layer; ++il) {
      const LayerWeights& L = w.layers[il];
      const Vec xn = RmsNorm(x, L.attn_norm, c.rms_norm_eps);
      Vec q = MatVec(L.wq, xn), k = MatVec(L.wk, xn), v = MatVec(L.wv, xn);
      const auto rope = [&](Vec& t, int heads, const float* norm) {
        for (int h = 0; h < heads; ++h) {
          Vec hn = RmsNorm(t, norm, c.rms_norm_eps, h * HD, HD);
          for (int64_t i = 0; i < HD / 2; ++i) {
            const double theta = p * std::pow(double(c.rope_freq_base), -2.0 * i / HD);
            const double a = hn[i], b = hn[i + HD / 2];
            t[h * HD + i] = a * std::cos(theta) - b * std::sin(theta);
            t[h * HD + i + HD / 2] = a * std::sin(theta) + b * std::cos(theta);
          }
        }
      };
      rope(q, c.n_head, L.q_norm);
      rope(k, c.n_head_kv, L.k_norm);
      kc[il].push_back(k);
      vc[il].push_back(v);
      Vec attn(c.q_dim(), 0.0);
      for (int h = 0; h < c.n_head; ++h) {
        const int kvh = h / (c.n_head / c.n_head_kv);
        Vec s(p + 1);
        for (int j = 0; j <= p; ++j) {
          double d = 0;
          for (int64_t i = 0; i < HD; ++i) d += q[h * HD + i] * kc[il][j][kvh * HD + i];
          s[j] = d / std::sqrt(double(HD));
        }
        Softmax(s);
        for (int j = 0; j <= p; ++j)
          for (int64_t i = 0; i < HD; ++i) attn[h * HD + i] += s[j] * vc[il][j][kvh * HD + i];
      }
      const Vec o = MatVec(L.wo, attn);
      for (int64_t i = 0; i < E; ++i) x[i] += o[i];

      const Vec fn = RmsNorm(x, L.ffn_norm, c.rms_norm_eps);
      Vec probs = MatVec(L.router, fn);
      Softmax(probs);
      std::vector<int> order(c.n_expert);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return probs[a] > probs[b]; });
      double wsum = 0;
      for (int j = 0; j < c.n_expert_used; ++j) wsum += probs[order[j]];
      Vec moe(E, 0.0);
      for (int j = 0; j < c.n_expert_used; ++j) {
        const ExpertWeights ew = w.Expert(il, order[j]);
        const Vec g = MatVec(ew.gate, fn), u = MatVec(ew.up, fn);
        Vec h(c.n_ff_exp);
        for (int64_t i = 0; i < c.n_ff_exp; ++i) h[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
        const Vec d = MatVec(ew.down, h);
        const double weight = c.norm_topk_prob ? probs[order[j]] / wsum : probs[order[j]];
        for (int64_t i = 0; i < E; ++i) moe[i] += weight * d[i];
      }
      for (int64_t i = 0; i < E; ++i) x[i] += moe[i];
    }
    const Vec xn = RmsNorm(x, w.output_norm, c.rms_norm_eps);
    out.push_back(MatVec(w.output, xn));
  }
  return out;
}

}  // namespace mer::testing
