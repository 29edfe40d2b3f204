// Shared by the StableHLO tests: capturing the exact OpCall an op's front end makes, running it on Kiln's CPU
// kernels for the expected storages, and running op_module(call) on a PJRT plugin (one client per test
// process, $KILN_PJRT_PLUGIN or the plugin of $KILN_TEST_DEVICE, the CPU plugin "xla-cpu" unless set),
// lowered for that plugin's platform.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/pjrt/pjrt_client.h"
#include "backends/pjrt/plugin_locator.h"
#include "backends/pjrt/stablehlo/op_module.h"
#include "kiln/runtime/execution_context.h"
#include "runtime/capture.h"
#include "runtime/dispatcher.h"
#include "support/pjrt_devices.h"

namespace kiln::pjrt::hlo::testing {

// Every op call `f` dispatches, in order, without running any.
template <class F>
std::vector<runtime::OpCall> capture_calls(F&& f) {
  std::vector<runtime::OpCall> calls;
  {
    runtime::CaptureGuard guard(&calls);
    f();
  }
  return calls;
}

// The test plugin's client, or null with `why` set (the test then skips).
inline std::shared_ptr<Client> shared_client(std::string* why) {
  static std::string reason;
  static const std::shared_ptr<Client> client = []() -> std::shared_ptr<Client> {
    if (!built_with_pjrt()) {
      reason = "this build has no PJRT support (./scripts/setup.sh --pjrt, then configure and build again)";
      return nullptr;
    }
    try {
      return Client::create(find_plugin(kiln::testing::test_device_kind()));
    } catch (const Error& e) {
      reason = e.what();
      return nullptr;
    }
  }();
  *why = reason;
  return client;
}

inline std::vector<char> storage_bytes(const Tensor& t) {
  const char* p = static_cast<const char*>(t.storage()->data());
  return std::vector<char>(p, p + t.storage()->bytes());
}

// The storages of the last call's outputs, before and after the CPU ran it (the calls before it, such as the
// front end's contiguous() copies, run first so its inputs hold their values).
struct CpuRun {
  runtime::OpCall call;
  std::vector<std::vector<char>> before, after;
};

inline CpuRun run_on_cpu(std::vector<runtime::OpCall> calls) {
  EXPECT_FALSE(calls.empty()) << "the front end dispatched no op";
  CpuRun run{calls.back(), {}, {}};
  for (size_t i = 0; i + 1 < calls.size(); ++i) runtime::launch(calls[i]);
  synchronize();
  for (const Tensor& out : run.call.outputs) run.before.push_back(storage_bytes(out));
  runtime::launch(run.call);
  synchronize();
  for (const Tensor& out : run.call.outputs) run.after.push_back(storage_bytes(out));
  return run;
}

// The two ways a device holds a storage that the lowerings must read and write alike: flat, and in the dims
// of the tensor that wrote it whole (storage_views.h).
struct ArrayPolicy {
  const char* name;  // "flat", "shaped"
  Shape (*dims)(const Tensor&);
};
inline const std::vector<ArrayPolicy>& array_policies() {
  static const std::vector<ArrayPolicy> policies{{"flat", flat_array_dims},
                                                 {"shaped", array_dims_as_written}};
  return policies;
}

// op_module(call) compiled and run on the plugin, each storage an array of `array_dims`; the outputs' new
// storages as bytes.
inline std::vector<std::vector<char>> run_on_pjrt(Client& client, const CpuRun& run,
                                                  const ArrayDims& array_dims = flat_array_dims) {
  const OpModule m = op_module(run.call, lowering_target(client.platform_name()), array_dims);
  const auto exe = client.compile(m.text);
  std::vector<std::shared_ptr<Buffer>> args;
  for (const OpModule::Param& p : m.params) {
    if (p.source == OpModule::Source::Scalar) {
      visit_dtype(p.dtype, [&](auto tag) {
        const auto v = scalar_from_double<decltype(tag)>(p.value);
        args.push_back(client.buffer_from_host(&v, sizeof v, p.dtype, {}, 0));
      });
      continue;
    }
    const std::vector<char> bytes = p.source == OpModule::Source::Input
                                        ? storage_bytes(run.call.inputs[static_cast<size_t>(p.index)])
                                        : run.before[static_cast<size_t>(p.index)];
    args.push_back(client.buffer_from_host(bytes.data(), bytes.size(), p.dtype, p.dims, 0));
  }
  const auto outs = client.execute_on(*exe, args, 0);
  std::vector<std::vector<char>> result;
  for (const auto& buffer : outs) {
    std::vector<char> bytes(buffer->bytes());
    buffer->to_host(bytes.data(), bytes.size());
    result.push_back(std::move(bytes));
  }
  return result;
}

// The elements of a flat storage as doubles.
inline std::vector<double> as_doubles(const std::vector<char>& bytes, DType dtype) {
  std::vector<double> out;
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    for (size_t i = 0; i + sizeof(T) <= bytes.size(); i += sizeof(T)) {
      T v;
      std::memcpy(&v, bytes.data() + i, sizeof(T));
      out.push_back(scalar_to_double(v));
    }
  });
  return out;
}

struct Tolerance {
  double rtol = 1e-6, atol = 1e-6;
};

}  // namespace kiln::pjrt::hlo::testing

// Runs the last op `body` dispatches on the CPU and through op_module on the plugin (its storages held flat,
// then shaped: array_policies) and compares every output storage element: |pjrt - cpu| <= atol + rtol |cpu|
// (NaN must match NaN). Reports the worst element.
#define EXPECT_PJRT_MATCHES_CPU(tolerance, body)                                                             \
  do {                                                                                                       \
    std::string why_;                                                                                        \
    auto client_ = ::kiln::pjrt::hlo::testing::shared_client(&why_);                                         \
    if (!client_) GTEST_SKIP() << why_;                                                                      \
    const auto run_ =                                                                                        \
        ::kiln::pjrt::hlo::testing::run_on_cpu(::kiln::pjrt::hlo::testing::capture_calls(body));             \
    for (const auto& policy_ : ::kiln::pjrt::hlo::testing::array_policies()) {                               \
      const auto got_ = ::kiln::pjrt::hlo::testing::run_on_pjrt(*client_, run_, policy_.dims);               \
      ASSERT_EQ(got_.size(), run_.after.size());                                                             \
      for (size_t o_ = 0; o_ < got_.size(); ++o_) {                                                          \
        const DType dt_ = run_.call.outputs[o_].dtype();                                                     \
        const auto want_ = ::kiln::pjrt::hlo::testing::as_doubles(run_.after[o_], dt_);                      \
        const auto have_ = ::kiln::pjrt::hlo::testing::as_doubles(got_[o_], dt_);                            \
        ASSERT_EQ(want_.size(), have_.size()) << run_.call.describe() << " (" << policy_.name << " arrays)"; \
        double worst_ = 0;                                                                                   \
        size_t at_ = 0, bad_ = 0;                                                                            \
        for (size_t i_ = 0; i_ < want_.size(); ++i_) {                                                       \
          const double w_ = want_[i_], h_ = have_[i_];                                                       \
          const bool nan_ok_ = std::isnan(w_) && std::isnan(h_);                                             \
          const double err_ = nan_ok_ ? 0.0 : std::abs(h_ - w_);                                             \
          const double excess_ =                                                                             \
              (std::isnan(err_) ? 1e30 : err_) - (tolerance).atol - (tolerance).rtol * std::abs(w_);         \
          if (excess_ > 0) ++bad_;                                                                           \
          if (excess_ > 0 && (bad_ == 1)) at_ = i_;                                                          \
          if (!std::isnan(err_) && err_ > worst_) worst_ = err_;                                             \
        }                                                                                                    \
        EXPECT_EQ(bad_, 0u) << run_.call.describe() << " (" << policy_.name << " arrays): output " << o_     \
                            << " has " << bad_ << " of " << want_.size() << " elements off; first at "       \
                            << at_ << ": cpu " << want_[at_] << ", pjrt " << have_[at_]                      \
                            << "; worst |error| " << worst_;                                                 \
        char worst_text_[32];                                                                                \
        std::snprintf(worst_text_, sizeof worst_text_, "%.3g", worst_);                                      \
        RecordProperty(                                                                                      \
            "worst_error_line" + std::to_string(__LINE__) + "_" + std::to_string(o_) + "_" + policy_.name,   \
            worst_text_);                                                                                    \
      }                                                                                                      \
    }                                                                                                        \
  } while (0)
