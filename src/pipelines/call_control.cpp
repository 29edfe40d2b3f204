#include "pipelines/call_control.h"

#include <cstring>

namespace kiln::pipelines {

CallQueue::Turn::~Turn() {
  if (queue_ == nullptr) return;
  {
    std::lock_guard lock(queue_->mutex_);
    ++queue_->serving_;
  }
  queue_->served_.notify_all();
}

CallQueue::Turn CallQueue::wait_turn() {
  std::unique_lock lock(mutex_);
  const uint64_t ticket = next_ticket_++;
  served_.wait(lock, [&] { return serving_ == ticket; });
  return Turn(this);
}

namespace {

// FNV-1a, 64 bits.
class Hasher {
 public:
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ b[i]) * 1099511628211ull;
  }
  template <class T>
  void value(const T& v) {
    bytes(&v, sizeof v);
  }
  void text(const std::string& s) {
    value(s.size());
    bytes(s.data(), s.size());
  }
  void text(const std::optional<std::string>& s) {
    value(s.has_value());
    if (s) text(*s);
  }
  void tensor(const Tensor& t) {
    value(t.defined());
    if (!t.defined()) return;
    value(t.dtype());
    for (int64_t d : t.shape()) value(d);
    const Tensor c = t.contiguous();
    bytes(c.host_data(), c.nbytes());
  }
  template <class T>
  void optional(const std::optional<T>& v) {
    value(v.has_value());
    if (v) value(*v);
  }
  void image(const Image& image) {
    value(image.width);
    value(image.height);
    value(image.channels);
    bytes(image.pixels.data(), image.pixels.size());
  }
  uint64_t digest() const { return h_; }

 private:
  uint64_t h_ = 14695981039346656037ull;
};

}  // namespace

uint64_t request_key(const PipelineRequest& r) {
  Hasher h;
  h.tensor(r.prompt_embeds);
  h.tensor(r.pooled_prompt_embeds);
  h.tensor(r.negative_pooled_prompt_embeds);
  h.text(r.prompt);
  h.text(r.prompt_2);
  h.text(r.prompt_3);
  h.value(r.prompts.size());
  for (const std::string& p : r.prompts) h.text(p);
  h.value(r.negative_prompts.size());
  for (const std::string& p : r.negative_prompts) h.text(p);
  h.tensor(r.negative_prompt_embeds);
  h.text(r.negative_prompt);
  h.text(r.negative_prompt_2);
  h.text(r.negative_prompt_3);
  h.value(r.image.size());
  for (const Image& image : r.image) h.image(image);
  h.value(r.mask_image.has_value());
  if (r.mask_image) h.image(*r.mask_image);
  h.optional(r.padding_mask_crop);
  h.optional(r.strength);
  h.optional(r.height);
  h.optional(r.width);
  h.optional(r.num_inference_steps);
  h.optional(r.guidance_scale);
  h.optional(r.true_cfg_scale);
  h.optional(r.max_area);
  h.optional(r.auto_resize);
  h.value(static_cast<int>(r.output_type));
  h.value(r.generator.has_value());
  if (r.generator) {
    // The generator's state, not only its seed: the next draws are what the call will use.
    Generator g = *r.generator;
    h.value(g.initial_seed());
    h.value(g.random64());
  }
  h.optional(r.max_sequence_length);
  h.value(r.num_images_per_prompt);
  for (int64_t layer : r.skip_layer_guidance.layers) h.value(layer);
  h.value(r.skip_layer_guidance.scale);
  h.value(r.skip_layer_guidance.start);
  h.value(r.skip_layer_guidance.stop);
  return h.digest();
}

}  // namespace kiln::pipelines
