#include "kiln/families/stable_diffusion/unet_2d_condition.h"
#include <cmath>

#include "families/stable_diffusion/unet_blocks.h"
#include "kiln/nn/checkpoint_weights.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/layout.h"
#include "models/flux_embeddings.h"

namespace kiln::models {

namespace {

std::string describe(const Tensor& t) {
  return t.defined() ? t.str() : std::string("undefined");
}

// diffusers' get_timestep_embedding for t [N] (read as float32) -> [N, dim] float32. flip_sin_to_cos and a
// freq_shift of 0 are FLUX's sinusoid; the other settings reorder it or shift the frequencies' denominator.
Tensor timestep_sinusoid(const Tensor& t, int64_t dim, bool flip_sin_to_cos, int64_t freq_shift) {
  if (flip_sin_to_cos && freq_shift == 0) return flux_timestep_sinusoid(t, dim);
  const int64_t half = dim / 2;
  std::vector<float> freqs(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    // exp(-ln(10000) * i / (half - shift)) in float32, as torch computes it.
    const float exponent =
        -9.210340371976184f * static_cast<float>(i) / static_cast<float>(half - freq_shift);
    freqs[static_cast<size_t>(i)] = std::exp(exponent);
  }
  const Tensor f = Tensor::from_vector(freqs, {1, half}).to(t.device());
  const Tensor angles = mul(t.to(float32).view({t.size(0), 1}), f);
  return flip_sin_to_cos ? concat({cos(angles), sin(angles)}, 1) : concat({sin(angles), cos(angles)}, 1);
}

}  // namespace

UNet2DConditionModel::UNet2DConditionModel(const UNet2DConditionConfig& config, const nn::TensorParallel& tp)
    : config_((config.validate("UNet2DConditionModel config"), config)),
      conv_in_(config.in_channels, config.block_out_channels.front(), 3, 1, 1),
      time_linear_1_(config.block_out_channels.front(), config.time_embed_dim()),
      time_linear_2_(config.time_embed_dim(), config.time_embed_dim()),
      conv_norm_out_(config.norm_num_groups, config.block_out_channels.front(), config.norm_eps),
      conv_out_(config.block_out_channels.front(), config.out_channels, 3, 1, 1) {
  const UNet2DConditionConfig& c = config_;
  register_module("conv_in", &conv_in_);
  register_module("time_embedding.linear_1", &time_linear_1_);
  register_module("time_embedding.linear_2", &time_linear_2_);
  if (c.text_time()) {
    add_linear_1_ = std::make_unique<nn::Linear>(c.projection_class_embeddings_input_dim, c.time_embed_dim());
    add_linear_2_ = std::make_unique<nn::Linear>(c.time_embed_dim(), c.time_embed_dim());
    register_module("add_embedding.linear_1", add_linear_1_.get());
    register_module("add_embedding.linear_2", add_linear_2_.get());
  }
  const UNetBlockShape shape{.temb = c.time_embed_dim(),
                             .context = c.cross_attention_dim,
                             .groups = c.norm_num_groups,
                             .eps = c.norm_eps,
                             .linear_projection = c.use_linear_projection,
                             .tp = tp};
  const size_t levels = c.block_out_channels.size();
  int64_t channels = c.block_out_channels.front();
  for (size_t i = 0; i < levels; ++i) {
    const int64_t out = c.block_out_channels[i];
    const bool cross = c.down_block_types[i] == "CrossAttnDownBlock2D";
    down_blocks_.push_back(std::make_unique<UNetDownBlock>(
        shape, channels, out, c.layers_per_block[i], cross ? c.num_attention_heads[i] : 0,
        c.transformer_layers_per_block[i], i + 1 < levels, c.downsample_padding));
    register_module("down_blocks." + std::to_string(i), down_blocks_.back().get());
    channels = out;
  }
  mid_block_ =
      std::make_unique<UNetMidBlock>(shape, c.block_out_channels.back(), c.num_attention_heads.back(),
                                     c.transformer_layers_per_block.back());
  register_module("mid_block", mid_block_.get());
  // The up path mirrors the down path: level i of it is down level (levels - 1 - i).
  int64_t prev_out = c.block_out_channels.back();
  for (size_t i = 0; i < levels; ++i) {
    const size_t mirror = levels - 1 - i;
    const int64_t out = c.block_out_channels[mirror];
    const int64_t in = c.block_out_channels[mirror == 0 ? 0 : mirror - 1];
    const bool cross = c.up_block_types[i] == "CrossAttnUpBlock2D";
    up_blocks_.push_back(std::make_unique<UNetUpBlock>(
        shape, in, prev_out, out, c.layers_per_block[mirror] + 1, cross ? c.num_attention_heads[mirror] : 0,
        c.transformer_layers_per_block[mirror], i + 1 < levels));
    register_module("up_blocks." + std::to_string(i), up_blocks_.back().get());
    prev_out = out;
  }
  register_module("conv_norm_out", &conv_norm_out_);
  register_module("conv_out", &conv_out_);
}

UNet2DConditionModel::~UNet2DConditionModel() = default;

Tensor UNet2DConditionModel::time_embedding(const Tensor& timestep, int64_t batch,
                                            const UNetAddedConditions& added) const {
  const UNet2DConditionConfig& c = config_;
  Tensor t = on_weights_device(timestep).to(float32);
  if (t.size(0) != batch) t = t.expand({batch}).contiguous();
  const Tensor freq = timestep_sinusoid(t, c.block_out_channels.front(), c.flip_sin_to_cos, c.freq_shift);
  Tensor emb = time_linear_2_(silu(time_linear_1_(freq.to(dtype()))));
  if (!c.text_time()) return emb;
  const char* op = "UNet2DConditionModel";
  // As diffusers' UNet: the pooled prompt beside one addition_time_embed_dim-wide sinusoid per time id, as
  // many ids as projection_class_embeddings_input_dim leaves room for (SDXL base 6, the refiner 5).
  KILN_CHECK(added.time_ids.defined() && added.time_ids.dim() == 2 && added.time_ids.size(0) == batch &&
                 added.time_ids.size(1) > 0,
             op << ": addition_embed_type \"text_time\" needs time_ids [" << batch << ", ids], got "
                << describe(added.time_ids));
  const int64_t count = added.time_ids.size(1);
  const int64_t pooled = c.projection_class_embeddings_input_dim - count * c.addition_time_embed_dim;
  KILN_CHECK(added.text_embeds.defined() && added.text_embeds.dim() == 2 &&
                 added.text_embeds.size(0) == batch && added.text_embeds.size(1) == pooled,
             op << ": addition_embed_type \"text_time\" with " << count << " time ids needs text_embeds ["
                << batch << ", " << pooled << "] (the pooled prompt: projection_class_embeddings_input_dim "
                << c.projection_class_embeddings_input_dim << " less " << count
                << " x addition_time_embed_dim " << c.addition_time_embed_dim << "), got "
                << describe(added.text_embeds));
  // add_time_proj over the flattened ids, each id's sinusoid side by side, then beside the pooled prompt.
  const Tensor ids = on_weights_device(added.time_ids).to(float32).reshape({batch * count});
  const Tensor time_embeds =
      timestep_sinusoid(ids, c.addition_time_embed_dim, c.flip_sin_to_cos, c.freq_shift)
          .reshape({batch, count * c.addition_time_embed_dim});
  const Tensor add_embeds =
      concat({on_weights_device(added.text_embeds).to(float32), time_embeds}, 1).to(emb.dtype());
  return add(emb, (*add_linear_2_)(silu((*add_linear_1_)(add_embeds))));
}

Tensor UNet2DConditionModel::run(const Tensor& sample, const Tensor& timestep,
                                 const Tensor& encoder_hidden_states, const UNetAddedConditions& added,
                                 Trace* trace) const {
  const UNet2DConditionConfig& c = config_;
  const char* op = "UNet2DConditionModel";
  KILN_CHECK(conv_in_.weight.defined(), op << ": the weights are not loaded (call load_weights first)");
  KILN_CHECK(sample.defined() && sample.dim() == 4 && sample.size(1) == c.in_channels && sample.size(2) > 0 &&
                 sample.size(3) > 0,
             op << ": expected a sample [B, " << c.in_channels << ", h, w], got " << describe(sample));
  const int64_t batch = sample.size(0);
  KILN_CHECK(
      timestep.defined() && timestep.dim() == 1 && (timestep.size(0) == batch || timestep.size(0) == 1),
      op << ": expected a timestep [" << batch << "] or [1], got " << describe(timestep));
  KILN_CHECK(encoder_hidden_states.defined() && encoder_hidden_states.dim() == 3 &&
                 encoder_hidden_states.size(0) == batch &&
                 encoder_hidden_states.size(2) == c.cross_attention_dim,
             op << ": expected encoder_hidden_states [" << batch << ", S, " << c.cross_attention_dim
                << "], got " << describe(encoder_hidden_states));
  const Tensor temb = time_embedding(timestep, batch, added);
  const Tensor temb_act = silu(temb);
  const Tensor context = on_weights_device(encoder_hidden_states).to(dtype());
  Tensor x = conv_in_(on_weights_device(sample).to(dtype()));
  std::vector<Tensor> skips{x};
  for (const auto& block : down_blocks_) x = block->forward(x, temb_act, context, skips);
  if (trace) {
    trace->temb = temb;
    trace->down_block_res_samples = skips;
  }
  x = mid_block_->forward(x, temb_act, context);
  if (trace) trace->mid_block_out = x;
  for (const auto& block : up_blocks_) x = block->forward(x, temb_act, context, skips);
  x = conv_out_(silu(conv_norm_out_(x)));
  if (trace) trace->out = x;
  return x;
}

Tensor UNet2DConditionModel::forward(const Tensor& sample, const Tensor& timestep,
                                     const Tensor& encoder_hidden_states,
                                     const UNetAddedConditions& added) const {
  if (!is_compiled()) return run(sample, timestep, encoder_hidden_states, added, nullptr);
  // The program's inputs on the weights' device, the timestep as the float32 the sinusoid reads.
  std::vector<Tensor> inputs{sample, timestep.to(float32), encoder_hidden_states, added.text_embeds,
                             added.time_ids};
  for (Tensor& t : inputs) t = on_weights_device(t);
  return call_compiled(inputs, [this](const auto& in) {
    return std::vector<Tensor>{run(in[0], in[1], in[2], {.text_embeds = in[3], .time_ids = in[4]}, nullptr)};
  })[0];
}

std::vector<nn::BlockList> UNet2DConditionModel::repeated_blocks() const {
  nn::BlockList resnets{"resnets", {}}, blocks{"transformer_blocks", {}};
  for (const auto& block : down_blocks_) block->collect(resnets.blocks, blocks.blocks);
  mid_block_->collect(resnets.blocks, blocks.blocks);
  for (const auto& block : up_blocks_) block->collect(resnets.blocks, blocks.blocks);
  return {resnets, blocks};
}

UNet2DConditionModel::Trace UNet2DConditionModel::forward_traced(const Tensor& sample, const Tensor& timestep,
                                                                 const Tensor& encoder_hidden_states,
                                                                 const UNetAddedConditions& added) const {
  Trace trace;
  run(sample, timestep, encoder_hidden_states, added, &trace);
  return trace;
}

std::unique_ptr<UNet2DConditionModel> load_unet_2d_condition(const std::string& folder, DType dtype,
                                                             const nn::TensorParallel& tp) {
  auto model = std::make_unique<UNet2DConditionModel>(UNet2DConditionConfig::from_file(folder), tp);
  nn::LoadOptions options;
  options.dtype = dtype;
  model->load_weights(nn::CheckpointWeights(folder), options);
  return model;
}

}  // namespace kiln::models
