#include "pipelines/call_control.h"

#include <cstring>
#include <variant>

#include "kiln/pipelines/request_fields.h"

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
  void tensor(const Tensor& t) {
    value(t.defined());
    if (!t.defined()) return;
    value(t.dtype());
    for (int64_t d : t.shape()) value(d);
    const Tensor c = t.contiguous();
    bytes(c.host_data(), c.nbytes());
  }
  void image(const Image& image) {
    value(image.width);
    value(image.height);
    value(image.channels);
    bytes(image.pixels.data(), image.pixels.size());
  }
  // A field's value, by its kind.
  void field(const std::string& s) { text(s); }
  void field(const std::vector<std::string>& list) {
    value(list.size());
    for (const std::string& s : list) text(s);
  }
  void field(int64_t v) { value(v); }
  void field(const std::vector<int64_t>& list) {
    value(list.size());
    for (int64_t v : list) value(v);
  }
  void field(double v) { value(v); }
  void field(bool v) { value(v); }
  void field(const Image& i) { image(i); }
  void field(const std::vector<Image>& list) {
    value(list.size());
    for (const Image& i : list) image(i);
  }
  void field(const Tensor& t) { tensor(t); }
  void field(const Generator& generator) {
    // The generator's state, not only its seed: the next draws are what the call will use.
    Generator g = generator;
    value(g.initial_seed());
    value(g.random64());
  }
  void field(const std::vector<Generator>& list) {
    value(list.size());
    for (const Generator& g : list) field(g);
  }
  uint64_t digest() const { return h_; }

 private:
  uint64_t h_ = 14695981039346656037ull;
};

}  // namespace

uint64_t request_key(const PipelineRequest& r) {
  // Every field of the table (kiln/pipelines/request_fields.h), so that none can be left out.
  Hasher h;
  for (const RequestField& field : request_fields()) {
    const bool set = field.is_set(r);
    h.value(set);
    if (set) std::visit([&](const auto& value) { h.field(value); }, field.get(r));
  }
  return h.digest();
}

}  // namespace kiln::pipelines
