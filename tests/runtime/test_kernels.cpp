#include "test_kernels.h"

#include <omp.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <thread>

#include "runtime/dispatcher.h"
#include "runtime/op_table.h"

namespace kiln::runtime_test {

std::atomic<bool> block_release{false};
std::atomic<bool> block_finished{false};
std::vector<int64_t> appended;
std::atomic<int> omp_team{0};
std::atomic<double> nested_read{0.0};
std::atomic<bool> lazy_static_created{false};

namespace {

void block(const runtime::OpCall&) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!block_release.load() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  block_finished.store(true);
}

void append(const runtime::OpCall& call) {
  appended.push_back(call.attrs.get_int("value"));
}

void sleep_write(const runtime::OpCall& call) {
  std::this_thread::sleep_for(std::chrono::milliseconds(call.attrs.get_int("ms")));
  const Tensor& out = call.outputs.at(0);
  auto* p = static_cast<float*>(out.raw_data());
  for (int64_t i = 0; i < out.numel(); ++i) p[i] = static_cast<float>(call.attrs.get_int("value"));
}

void fail(const runtime::OpCall&) {
  KILN_FAIL("deliberate failure");
}

void fail_std(const runtime::OpCall&) {
  throw std::runtime_error("plain failure");
}

void omp(const runtime::OpCall&) {
  int team = 0;
#pragma omp parallel
  {
#pragma omp single
    team = omp_get_num_threads();
  }
  omp_team.store(team);
}

void nested(const runtime::OpCall& call) {
  Tensor out = call.outputs.at(0);  // shares the output's storage
  out.copy_(Tensor::full(out.shape(), 42.0, out.dtype()));
  nested_read.store(out.select(0, out.size(0) - 1).item());  // a 1-D output
}

// A static created by the kernel's first run, as oneDNN's engine and primitive cache are: registered with
// the exit machinery after anything registered before the kernel ran.
struct LazyStatic {
  std::atomic<bool> alive{true};
  ~LazyStatic() { alive.store(false); }
};

void uses_lazy_static(const runtime::OpCall& call) {
  static LazyStatic state;
  lazy_static_created.store(true);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(call.attrs.get_int("ms"));
  while (std::chrono::steady_clock::now() < deadline) {
    // Destroyed under a running kernel: end at once with a code the test recognises.
    if (!state.alive.load()) std::_Exit(static_cast<int>(call.attrs.get_int("value")));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void exit_now(const runtime::OpCall& call) {
  std::exit(static_cast<int>(call.attrs.get_int("value")));
}

}  // namespace

void register_test_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (std::string_view op : {"runtime_test.block", "runtime_test.append", "runtime_test.sleep_write",
                                "runtime_test.fail", "runtime_test.fail_std", "runtime_test.omp",
                                "runtime_test.nested", "runtime_test.exit", "runtime_test.lazy_static"})
      runtime::add_op({op});
    auto& r = runtime::kernel_registry();
    r.add("runtime_test.block", DeviceType::CPU, block);
    r.add("runtime_test.append", DeviceType::CPU, append);
    r.add("runtime_test.sleep_write", DeviceType::CPU, sleep_write);
    r.add("runtime_test.fail", DeviceType::CPU, fail);
    r.add("runtime_test.fail_std", DeviceType::CPU, fail_std);
    r.add("runtime_test.omp", DeviceType::CPU, omp);
    r.add("runtime_test.nested", DeviceType::CPU, nested);
    r.add("runtime_test.exit", DeviceType::CPU, exit_now);
    r.add("runtime_test.lazy_static", DeviceType::CPU, uses_lazy_static);
  });
}

void run(const char* op, std::vector<Tensor> inputs, std::vector<Tensor> outputs, int64_t value, int64_t ms) {
  register_test_kernels();
  runtime::dispatch(runtime::OpCall{op, std::move(inputs), std::move(outputs),
                                    runtime::Attrs().set("value", value).set("ms", ms)});
}

}  // namespace kiln::runtime_test
