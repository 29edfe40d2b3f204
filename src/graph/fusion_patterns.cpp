#include "graph/fusion_patterns.h"

#include <optional>
#include <string_view>

#include "graph/graph_facts.h"
#include "kiln/ops/fused.h"
#include "ops/activation_op.h"
#include "runtime/capture.h"

namespace kiln::graph {

namespace {

using runtime::OpCall;

// Whether `read` reads exactly the elements `written` holds, in the same order (a reshaped view of it).
bool flat_view(const Tensor& read, const Tensor& written) {
  return read.defined() && sid(read) == sid(written) && read.offset() == written.offset() &&
         read.dtype() == written.dtype() && read.numel() == written.numel() && read.is_contiguous() &&
         written.is_contiguous();
}

// A view of `out`'s storage laid out like the contiguous tensor `like` (same element count).
Tensor retarget(const Tensor& out, const Tensor& like) {
  return Tensor(out.storage(), like.shape(), like.strides(), out.offset(), out.dtype());
}

// The Activation a linear_fused applies in place of the op `op`, if one does.
std::optional<Activation> activation_of(std::string_view op) {
  const std::optional<runtime::EwOp> ew = runtime::find_ew_op(op);
  return ew ? ops::activation_of(*ew) : std::nullopt;
}

class PatternRewriter {
 public:
  PatternRewriter(std::vector<OpCall>& calls, const std::vector<const Storage*>& keep)
      : calls_(calls),
        facts_(gather_facts(calls, keep)),
        removed_(calls.size(), false),
        replacement_(calls.size()) {}

  int64_t run() {
    int64_t n = 0;
    for (int i = 0; i < static_cast<int>(calls_.size()); ++i) {
      if (removed_[i]) continue;
      if (calls_[i].op == "linear" || is_low_rank_only(calls_[i]))
        n += try_linear(i);
      else if (calls_[i].op == "layer_norm" || calls_[i].op == "rms_norm")
        n += try_norm(i);
    }
    return n;
  }

  std::vector<OpCall> result() {
    std::vector<OpCall> out;
    out.reserve(calls_.size());
    for (size_t i = 0; i < calls_.size(); ++i) {
      if (!replacement_[i].empty()) {
        for (OpCall& c : replacement_[i]) out.push_back(std::move(c));
      } else if (!removed_[i]) {
        out.push_back(std::move(calls_[i]));
      }
    }
    return out;
  }

 private:
  // The one live call reading `t` when `t` is private to its writer; -1 otherwise.
  int sole_reader(const Tensor& t, int writer) const {
    if (!is_private(facts_, t, writer)) return -1;
    const auto& readers = facts_.at(sid(t)).readers;
    if (readers.size() != 1 || removed_[readers[0]]) return -1;
    return readers[0];
  }

  // For a binary call with two tensors, the index of the operand that reads `value` as a flat view, with the
  // call's output having that operand's shape (so `value` is not broadcast); -1 otherwise.
  int operand_reading(const OpCall& c, const Tensor& value) const {
    if (c.inputs.size() != 2 || c.outputs.size() != 1) return -1;
    for (int k = 0; k < 2; ++k) {
      const Tensor& other = c.inputs[1 - k];
      if (flat_view(c.inputs[k], value) && other.defined() && sid(other) != sid(value) &&
          c.outputs[0].shape() == c.inputs[k].shape() && c.outputs[0].dtype() == value.dtype())
        return k;
    }
    return -1;
  }

  // Captures `make` (which calls a fused op's front end) and retargets the fused call to write `out`.
  template <class Make>
  bool replace(const std::vector<int>& chain, std::string_view fused_op, const Tensor& out, Make&& make) {
    std::vector<OpCall> captured;
    try {
      runtime::CaptureGuard capture(&captured);
      make();
    } catch (const Error&) {
      return false;  // the fused op refuses this case (a dtype or layout it does not take): keep the chain
    }
    if (captured.empty() || captured.back().op != fused_op || captured.back().outputs.size() != 1)
      return false;
    Tensor& fused_out = captured.back().outputs[0];
    if (!fused_out.is_contiguous() || fused_out.numel() != out.numel() || !out.is_contiguous()) return false;
    fused_out = retarget(out, fused_out);
    for (int c : chain) removed_[c] = true;
    replacement_[chain.back()] = std::move(captured);
    return true;
  }

  // A linear_fused call that only adds a low-rank pair (nn::Linear with LoRA adapters): a linear whose
  // activation, gate and residual can still be fused after it.
  static bool is_low_rank_only(const OpCall& c) {
    return c.op == "linear_fused" && c.attrs.get_bool("has_low_rank") && !c.attrs.get_bool("has_gate") &&
           !c.attrs.get_bool("has_residual") &&
           c.attrs.get_int("act") == static_cast<int64_t>(Activation::None);
  }

  int64_t try_linear(int i) {
    const OpCall& lin = calls_[i];
    if (lin.inputs.size() < 2 || lin.outputs.size() != 1) return 0;
    const Tensor& x2 = lin.inputs[0];
    const Tensor& w = lin.inputs[1];
    const bool low_rank = lin.op == "linear_fused";
    const bool has_bias = low_rank ? lin.attrs.get_bool("has_bias") : lin.inputs.size() > 2;
    const Tensor bias = has_bias ? lin.inputs[2] : Tensor();
    std::vector<int> chain{i};
    Tensor cur = lin.outputs[0];
    LinearEpilogue epilogue;
    if (low_rank) {
      const size_t first = has_bias ? 3 : 2;
      if (lin.inputs.size() != first + 2) return 0;
      epilogue.low_rank_down = lin.inputs[first];
      epilogue.low_rank_up = lin.inputs[first + 1];
    }
    std::vector<std::pair<Tensor, int>> read_at;  // epilogue operands and where the chain read them

    int r = sole_reader(cur, chain.back());
    if (r >= 0 && calls_[r].inputs.size() == 1 && calls_[r].outputs.size() == 1) {
      const auto act = activation_of(calls_[r].op);
      if (act && flat_view(calls_[r].inputs[0], cur) && calls_[r].outputs[0].dtype() == cur.dtype()) {
        epilogue.act = *act;
        chain.push_back(r);
        cur = calls_[r].outputs[0];
        r = sole_reader(cur, r);
      }
    }
    if (r >= 0 && calls_[r].op == "mul") {
      const int k = operand_reading(calls_[r], cur);
      if (k >= 0 && calls_[r].inputs[1 - k].dtype() == x2.dtype()) {
        epilogue.gate = calls_[r].inputs[1 - k];
        read_at.emplace_back(epilogue.gate, r);
        chain.push_back(r);
        cur = calls_[r].outputs[0];
        r = sole_reader(cur, r);
      }
    }
    if (r >= 0 && calls_[r].op == "add") {
      const int k = operand_reading(calls_[r], cur);
      const Tensor& other = k >= 0 ? calls_[r].inputs[1 - k] : cur;
      if (k >= 0 && other.shape() == calls_[r].outputs[0].shape() && other.dtype() == x2.dtype()) {
        epilogue.residual = other;
        read_at.emplace_back(other, r);
        chain.push_back(r);
        cur = calls_[r].outputs[0];
      }
    }
    if (chain.size() < 2) return 0;
    const int end = chain.back();
    if (written_between(facts_, {x2, w, bias, epilogue.low_rank_down, epilogue.low_rank_up}, i, end))
      return 0;
    for (const auto& [t, at] : read_at)
      if (written_between(facts_, {t}, at, end)) return 0;
    const Tensor out = calls_[end].outputs[0];
    Shape x_shape = out.shape();
    x_shape.back() = x2.size(-1);
    return replace(chain, "linear_fused", out,
                   [&] { (void)linear_fused(x2.reshape(x_shape), w, bias, epilogue); });
  }

  int64_t try_norm(int i) {
    const OpCall& norm = calls_[i];
    const bool layer = norm.op == "layer_norm";
    const size_t affine_inputs = layer ? 2 : 1;
    if (norm.inputs.size() != 1 + affine_inputs || norm.outputs.size() != 1) return 0;
    for (size_t k = 1; k < norm.inputs.size(); ++k)
      if (norm.inputs[k].defined()) return 0;  // an affine norm: not adaLN's
    const Tensor& x2 = norm.inputs[0];
    const Tensor& y = norm.outputs[0];
    const int m = sole_reader(y, i);
    if (m < 0 || calls_[m].op != "mul") return 0;
    const int km = operand_reading(calls_[m], y);
    if (km < 0) return 0;
    // The other factor must be 1 + scale, made by add(1.0, scale) in this graph.
    const Tensor& one_plus = calls_[m].inputs[1 - km];
    const auto& writers = facts_.at(sid(one_plus)).writers;
    if (writers.size() != 1 || writers[0] > m || removed_[writers[0]]) return 0;
    const OpCall& add_one = calls_[writers[0]];
    if (add_one.op != "add" || add_one.inputs.size() != 1 || !add_one.attrs.has("scalar") ||
        add_one.attrs.get_float("scalar") != 1.0 || !flat_view(one_plus, add_one.outputs[0]))
      return 0;
    const Tensor& scale = add_one.inputs[0];
    const Tensor prod = calls_[m].outputs[0];
    const int a = sole_reader(prod, m);
    if (a < 0 || calls_[a].op != "add") return 0;
    const int ka = operand_reading(calls_[a], prod);
    if (ka < 0) return 0;
    const Tensor& shift = calls_[a].inputs[1 - ka];
    if (written_between(facts_, {x2}, i, a) || written_between(facts_, {scale}, writers[0], a) ||
        written_between(facts_, {shift}, a, a))
      return 0;
    const Tensor out = calls_[a].outputs[0];
    const double eps = norm.attrs.get_float("eps");
    const NormKind kind = layer ? NormKind::LayerNorm : NormKind::RmsNorm;
    const Shape scale_shape = one_plus.shape();
    return replace({i, m, a}, "norm_modulate", out, [&] {
      (void)norm_modulate(x2.reshape(out.shape()), scale.reshape(scale_shape), shift, kind, eps);
    });
  }

  std::vector<OpCall>& calls_;
  Facts facts_;
  std::vector<bool> removed_;
  std::vector<std::vector<OpCall>> replacement_;
};

}  // namespace

std::vector<OpCall> rewrite_fused_patterns(std::vector<OpCall> calls, const std::vector<const Storage*>& keep,
                                           int64_t* rewritten) {
  int64_t n = 0;
  std::vector<OpCall> out;
  {
    PatternRewriter rewriter(calls, keep);
    n = rewriter.run();
    if (n == 0) {
      out = std::move(calls);
    } else {
      out = rewriter.result();
    }
  }
  if (rewritten) *rewritten = n;
  return out;
}

}  // namespace kiln::graph
