// One pipeline call's frame (DiffusionPipeline::operator()): its turn among the calls to the pipeline, and
// its cancellation checkpoints.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "kiln/lora/lora_adapters.h"
#include "kiln/pipelines/pipeline_request.h"

namespace kiln::pipelines {

// Calls to one pipeline, served one at a time in arrival order (a ticket lock: a waiting call is never
// overtaken).
class CallQueue {
 public:
  class Turn {
   public:
    explicit Turn(CallQueue* queue) : queue_(queue) {}
    Turn(Turn&& other) noexcept : queue_(other.queue_) { other.queue_ = nullptr; }
    Turn& operator=(Turn&&) = delete;
    ~Turn();

   private:
    CallQueue* queue_;
  };
  // Blocks until every call that arrived before has ended.
  Turn wait_turn();

 private:
  std::mutex mutex_;
  std::condition_variable served_;
  uint64_t next_ticket_ = 0, serving_ = 0;
};

// What a pipeline shares with the pipelines from_pipe makes of it, which hold the same components: their
// calls take turns in one queue (one call at a time on the components), and the LoRA adapters loaded into
// the components are the same adapters whichever of them loaded or set them.
struct SharedPipelineState {
  CallQueue calls;
  std::unique_ptr<lora::LoraAdapters> lora;  // made on first use
};

// What a running call may ask of its frame.
class CallControl {
 public:
  explicit CallControl(std::function<void(const std::string&)> checkpoint)
      : checkpoint_(std::move(checkpoint)) {}
  // Throws Cancelled when the call was cancelled; `where` says how far it got ("after denoising step 3 of
  // 28"). Under tensor parallelism every rank stops at the same checkpoint (kiln/dist/call_sequencer.h
  // any_rank).
  void checkpoint(const std::string& where) const { checkpoint_(where); }

 private:
  std::function<void(const std::string&)> checkpoint_;
};

// A hash of every field of `request` (kiln/pipelines/request_fields.h: prompts, embeddings, images, sizes,
// steps, guidance, the generators' state, ...): the key under which tensor-parallel ranks agree on the order
// of calls (kiln/dist/call_sequencer.h).
uint64_t request_key(const PipelineRequest& request);

}  // namespace kiln::pipelines
