// The PJRT client layer (src/backends/pjrt/pjrt_client.h) against the CPU plugin that scripts/fetch_pjrt.sh
// installs (lammps-jax-pjrt-cpu 0.11.2). One client serves every test of the process: loading the 200 MB
// plugin is the slow part. Calls that could abort inside the plugin run in a child process (death tests).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <unistd.h>

#include "backends/pjrt/compile_options.h"
#include "backends/pjrt/cross_targets.h"
#include "backends/pjrt/mlir_signature.h"
#include "backends/pjrt/pjrt_client.h"
#include "backends/pjrt/plugin_locator.h"
#include "kiln/core/error.h"
#include "support/scoped_env.h"

namespace kiln::pjrt {
namespace {

namespace fs = std::filesystem;

// The CPU plugin's client, created once; null (and `why` set) when this build or machine has no PJRT.
std::shared_ptr<Client> shared_client(std::string* why) {
  static std::string reason;
  static const std::shared_ptr<Client> client = []() -> std::shared_ptr<Client> {
    if (!built_with_pjrt()) {
      reason = "this build has no PJRT support (./scripts/setup.sh --pjrt, then configure and build again)";
      return nullptr;
    }
    return Client::create(find_plugin("xla-cpu"));
  }();
  if (why) *why = reason;
  return client;
}

#define PJRT_CLIENT_OR_SKIP(name)           \
  std::string skip_reason_;                 \
  auto name = shared_client(&skip_reason_); \
  if (!name) GTEST_SKIP() << skip_reason_;  \
  static_assert(true)

template <class T>
std::shared_ptr<Buffer> upload(Client& c, const std::vector<T>& values, const Shape& dims, int device = 0) {
  return c.buffer_from_host(values.data(), values.size() * sizeof(T), dtype_of_v<T>, dims, device);
}

template <class T>
std::vector<T> download(const Buffer& b) {
  std::vector<T> out(b.bytes() / sizeof(T));
  b.to_host(out.data(), out.size() * sizeof(T));
  return out;
}

// Generic MLIR form, which every StableHLO consumer tried accepts (shared/reference/pjrt.md).
constexpr const char* kAdd = R"(module {
  "func.func"() <{function_type = (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>, sym_name = "main"}> ({
  ^bb0(%a: tensor<4xf32>, %b: tensor<4xf32>):
    %0 = "stablehlo.add"(%a, %b) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%0) : (tensor<4xf32>) -> ()
  }) : () -> ()
})";

// The pretty form, two outputs.
constexpr const char* kMulSub = R"(module {
  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>) {
    %0 = "stablehlo.multiply"(%a, %b) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %1 = "stablehlo.subtract"(%a, %b) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    return %0, %1 : tensor<2x3xf32>, tensor<2x3xf32>
  }
})";

std::shared_ptr<Executable> add_executable(Client& c) {
  static std::shared_ptr<Executable> exe = c.compile(kAdd);
  return exe;
}

// ---- without a plugin

TEST(PjrtBuild, PluginIsInstalledWhenBuiltWithPjrt) {
  // CI builds with the header; it must then find the plugin too, or every PJRT test would silently skip.
  if (!built_with_pjrt()) GTEST_SKIP() << "this build has no PJRT support";
  std::string path;
  ASSERT_NO_THROW(path = find_plugin("xla-cpu")) << "built with the PJRT header but no CPU plugin found";
  EXPECT_TRUE(fs::is_regular_file(path)) << path;
}

TEST(PjrtBuild, CreateWithoutPjrtSaysHowToGetIt) {
  if (built_with_pjrt()) GTEST_SKIP() << "this build has PJRT support";
  try {
    Client::create("/nonexistent.so");
    FAIL() << "expected a kiln::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("./scripts/setup.sh --pjrt"), std::string::npos) << e.what();
  }
}

TEST(PjrtCompileOptions, EncodesCountsAsVarints) {
  EXPECT_EQ(compile_options_proto(1, 1, false), std::string("\x1a\x04\x20\x01\x28\x01", 6));
  EXPECT_EQ(compile_options_proto(1, 1, true), std::string("\x1a\x04\x20\x01\x28\x01\x20\x01", 8));
  // 300 = 0b10'0101100: low 7 bits with the continuation bit (0xac), then 2.
  EXPECT_EQ(compile_options_proto(300, 2, false), std::string("\x1a\x05\x20\xac\x02\x28\x02", 7));
  EXPECT_THROW(compile_options_proto(0, 1, false), Error);
  EXPECT_THROW(compile_options_proto(2, 1, true), Error);
}

TEST(PjrtSignature, ReadsMainInBothForms) {
  const auto generic = main_parameters(kAdd);
  ASSERT_EQ(generic.size(), 2u);
  EXPECT_EQ(generic[0], (ArraySpec{DType::Float32, {4}}));
  const auto pretty = main_parameters(kMulSub);
  ASSERT_EQ(pretty.size(), 2u);
  EXPECT_EQ(pretty[1], (ArraySpec{DType::Float32, {2, 3}}));
  const auto mixed = main_parameters(
      "func.func @main(%a: tensor<bf16> {mhlo.sharding = \"{replicated}\"}, %b: tensor<1x2x3xi1>, %c: "
      "tensor<5xui8>) "
      "-> tensor<bf16>");
  ASSERT_EQ(mixed.size(), 3u);
  EXPECT_EQ(mixed[0], (ArraySpec{DType::BFloat16, {}}));
  EXPECT_EQ(mixed[1], (ArraySpec{DType::Bool, {1, 2, 3}}));
  EXPECT_EQ(mixed[2], (ArraySpec{DType::UInt8, {5}}));
  EXPECT_TRUE(main_parameters("func.func @main() -> tensor<f32>").empty());
}

TEST(PjrtSignature, RefusesWhatKilnCannotCheck) {
  auto message = [](const char* text) {
    try {
      main_parameters(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("func.func @other(%a: tensor<4xf32>)").find("no func.func @main"), std::string::npos);
  EXPECT_NE(message("func.func @main(%a: tensor<?x4xf32>)").find("static dimensions"), std::string::npos);
  EXPECT_NE(message("func.func @main(%a: tensor<4xui32>)").find("element type 'ui32'"), std::string::npos);
  EXPECT_NE(message("func.func @main(%a: tensor<4xf32>").find("never closed"), std::string::npos);
}

// ---- the plugin locator

using testing::ScopedEnv;

fs::path temp_folder(const char* name) {
  return testing::temp_folder("kiln-pjrt", name);
}

TEST(PjrtLocator, NothingInstalledNamesThePackageAndThePlaces) {
  const fs::path empty = temp_folder("empty");
  ScopedEnv env;
  for (const char* name : {"KILN_PJRT_PLUGIN", "KILN_PJRT_PLUGIN_DIR", "VIRTUAL_ENV", "XDG_CACHE_HOME"})
    env.set(name, std::nullopt);
  env.set("KILN_CACHE_DIR", empty.string());
  env.set("HOME", empty.string());
  env.set("PATH", (empty / "bin").string());
  env.set("PYTHONPATH", (empty / "site").string());
  for (const auto& [kind, package] : {std::pair{"xla-cpu", "lammps-jax-pjrt-cpu"},
                                      std::pair{"cuda", "jax-cuda13-pjrt"}, std::pair{"tpu", "libtpu"}}) {
    try {
      const std::string found = find_plugin(kind);
      ADD_FAILURE() << kind << ": expected no plugin, found " << found;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(package), std::string::npos) << m;
      EXPECT_NE(m.find((empty / "site").string()), std::string::npos) << m;
    }
  }
  const auto cpu = plugin_candidates("xla-cpu");
  ASSERT_FALSE(cpu.empty());
  EXPECT_EQ(cpu[0], (empty / "pjrt" / "lib" / "pjrt_c_api_cpu_plugin.so").string());
  fs::remove_all(empty);
}

TEST(PjrtLocator, EnvironmentOverridesAndUnknownKinds) {
  const fs::path dir = temp_folder("dir");
  std::ofstream(dir / "libtpu.so") << "x";
  ScopedEnv env;
  env.set("KILN_PJRT_PLUGIN", std::nullopt);
  env.set("KILN_PJRT_PLUGIN_DIR", dir.string());
  EXPECT_EQ(find_plugin("tpu"), (dir / "libtpu.so").string());
  env.set("KILN_PJRT_PLUGIN", (dir / "libtpu.so").string());  // wins for any kind
  EXPECT_EQ(find_plugin("cuda"), (dir / "libtpu.so").string());
  env.set("KILN_PJRT_PLUGIN", (dir / "missing.so").string());
  EXPECT_THROW(find_plugin("xla-cpu"), Error);
  try {
    find_plugin("gpu");
    ADD_FAILURE() << "expected an error for kind 'gpu'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("xla-cpu, cuda or tpu"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// A virtual environment whose bin/ is on PATH is searched without being activated (no VIRTUAL_ENV), as on the
// GPU machines, whose python3 is /opt/torch/.venv/bin/python3.
TEST(PjrtLocator, FindsThePluginInThePythonOnPath) {
  const fs::path venv = temp_folder("venv");
  fs::create_directories(venv / "bin");
  std::ofstream(venv / "bin" / "python3") << "#!/bin/sh\n";
  const fs::path plugin = venv / "lib" / "python3.12" / "site-packages" / "jax_plugins" / "xla_cuda13";
  fs::create_directories(plugin);
  std::ofstream(plugin / "xla_cuda_plugin.so") << "x";
  ScopedEnv env;
  for (const char* name : {"KILN_PJRT_PLUGIN", "KILN_PJRT_PLUGIN_DIR", "VIRTUAL_ENV", "PYTHONPATH"})
    env.set(name, std::nullopt);
  env.set("HOME", (venv / "home").string());
  env.set("PATH", (venv / "nothing").string() + ":" + (venv / "bin").string());
  EXPECT_EQ(find_plugin("cuda"), (plugin / "xla_cuda_plugin.so").string());
  fs::remove_all(venv);
}

// ---- loading

TEST(PjrtLoad, MissingFileAndNotAPlugin) {
  if (!built_with_pjrt()) GTEST_SKIP() << "this build has no PJRT support";
  try {
    Client::create("/nonexistent/plugin.so");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no such file"), std::string::npos) << e.what();
  }
  std::string libm;
  for (const char* p :
       {"/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6", "/lib64/libm.so.6"})
    if (fs::exists(p)) libm = p;
  if (libm.empty()) GTEST_SKIP() << "no libm.so.6 found";
  try {
    Client::create(libm);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a PJRT plugin (it exports no GetPjrtApi)"), std::string::npos)
        << e.what();
  }
}

// The CUDA plugin's client grows its pool as needed up to 90% of the GPU unless told otherwise; the other
// plugins get no options. A malformed variable is an error naming it.
TEST(PjrtClientOptions, TheCudaClientGrowsItsPoolUpToTheFraction) {
  const auto value_of = [](const std::vector<ClientOption>& options, const std::string& name) {
    for (const ClientOption& o : options)
      if (o.name == name) return o.value;
    ADD_FAILURE() << "no option " << name;
    return ClientOption::Value{};
  };
  unsetenv("KILN_PJRT_MEMORY_FRACTION");
  unsetenv("KILN_PJRT_PREALLOCATE");
  EXPECT_TRUE(client_options(DeviceType::XlaCpu).empty())
      << "the CPU plugin refuses options it does not know";
  EXPECT_TRUE(client_options(DeviceType::TPU).empty());
  std::vector<ClientOption> cuda = client_options(DeviceType::CUDA);
  EXPECT_EQ(std::get<float>(value_of(cuda, "memory_fraction")), 0.9f);
  EXPECT_EQ(std::get<bool>(value_of(cuda, "preallocate")), false);
  setenv("KILN_PJRT_MEMORY_FRACTION", "0.5", 1);
  setenv("KILN_PJRT_PREALLOCATE", "1", 1);
  cuda = client_options(DeviceType::CUDA);
  EXPECT_EQ(std::get<float>(value_of(cuda, "memory_fraction")), 0.5f);
  EXPECT_EQ(std::get<bool>(value_of(cuda, "preallocate")), true);
  for (const char* bad : {"0", "1.5", "ninety", "0.9x"}) {
    setenv("KILN_PJRT_MEMORY_FRACTION", bad, 1);
    EXPECT_THROW(
        {
          try {
            client_options(DeviceType::CUDA);
          } catch (const Error& e) {
            EXPECT_NE(
                std::string(e.what()).find(std::string("KILN_PJRT_MEMORY_FRACTION=") + bad + ": expected"),
                std::string::npos)
                << e.what();
            throw;
          }
        },
        Error)
        << bad;
  }
  unsetenv("KILN_PJRT_MEMORY_FRACTION");
  setenv("KILN_PJRT_PREALLOCATE", "yes", 1);
  EXPECT_THROW(client_options(DeviceType::CUDA), Error);
  unsetenv("KILN_PJRT_PREALLOCATE");
}

// The options reach the plugin's PJRT_Client_Create: the CPU plugin refuses one it does not take, by name.
TEST(PjrtLoad, ClientOptionsReachThePlugin) {
  PJRT_CLIENT_OR_SKIP(c);
  try {
    Client::create(c->plugin_path(), {{"memory_fraction", 0.9f}});
    ADD_FAILURE() << "the CPU plugin took an option it does not know";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory_fraction"), std::string::npos) << e.what();
  }
}

// Where the CUDA plugin is installed, it takes Kiln's options: its client is made on a GPU, and elsewhere it
// fails only for want of a GPU (it checks the options first).
TEST(PjrtLoad, TheCudaPluginTakesKilnsOptions) {
  if (!built_with_pjrt()) GTEST_SKIP() << "this build has no PJRT support";
  std::string path;
  try {
    path = find_plugin("cuda");
  } catch (const Error&) {
    try {
      path =
          find_cross_plugin("cuda");  // the pinned copy fetch_pjrt.sh --cross keeps for cross-compiling (CI)
    } catch (const Error&) {
      GTEST_SKIP()
          << "no CUDA plugin installed (pip install jax-cuda13-pjrt, or ./scripts/fetch_pjrt.sh --cross)";
    }
  }
  try {
    const std::shared_ptr<Client> cuda = Client::create(path, client_options(DeviceType::CUDA));
    EXPECT_EQ(cuda->platform_name(), "cuda");
    const std::optional<DriverMemoryReport> memory = cuda->memory_report(0);
    ASSERT_TRUE(memory.has_value()) << "the CUDA plugin reports its devices' memory";
    EXPECT_GT(memory->limit_bytes, int64_t{1} << 30);
    std::cerr << "cuda:0 memory " << memory->limit_bytes << " bytes, " << memory->in_use_bytes << " in use\n";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find("Unexpected option"), std::string::npos) << what;
    EXPECT_NE(what.find("No visible GPU devices"), std::string::npos) << what;
  }
}

// A plugin of an API version Kiln does not support is refused, naming the file, its version and what Kiln
// needs, before Kiln calls anything in it. Each version needs its own copy of the fake plugin: a library is
// loaded once per path, and the fake reads its version once.
TEST(PjrtLoad, APluginOfAnUnsupportedApiVersionIsRefusedNamingIt) {
#ifndef KILN_FAKE_PJRT_PLUGIN
  GTEST_SKIP() << "this build has no PJRT support";
#else
  // $KILN_FAKE_PJRT_PLUGIN: where the fake lies when the test binary was built elsewhere (device_bundle.sh).
  const char* moved = std::getenv("KILN_FAKE_PJRT_PLUGIN");
  const fs::path fake = moved != nullptr && *moved != '\0' ? moved : KILN_FAKE_PJRT_PLUGIN;
  const fs::path dir = fs::temp_directory_path() / ("kiln-fake-pjrt-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::vector<std::pair<std::string, std::string>> cases{
      {"0.50",
       "PJRT C API version 0.50 is not supported: Kiln needs 0.90 or a newer 0.x (install a newer plugin)"},
      {"1.3", "PJRT C API version 1.3 is not supported: Kiln needs 0.90 or a newer 0.x"}};
  for (const auto& [version, expected] : cases) {
    const fs::path copy = dir / ("fake_" + version + ".so");
    fs::copy_file(fake, copy, fs::copy_options::overwrite_existing);
    setenv("KILN_FAKE_PJRT_VERSION", version.c_str(), 1);
    try {
      Client::create(copy.string());
      ADD_FAILURE() << "a plugin of API " << version << " was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(expected), std::string::npos) << what;
      EXPECT_NE(what.find(copy.string()), std::string::npos) << what;
    }
  }
  unsetenv("KILN_FAKE_PJRT_VERSION");
  fs::remove_all(dir);
#endif
}

TEST(PjrtClient, DescribesThePluginAndItsDevices) {
  PJRT_CLIENT_OR_SKIP(c);
  int major = -1, minor = -1;
  ASSERT_EQ(std::sscanf(c->api_version().c_str(), "%d.%d", &major, &minor), 2) << c->api_version();
  EXPECT_EQ(major, 0);
  EXPECT_GE(minor, 90);
  EXPECT_EQ(c->platform_name(), "cpu");
  ASSERT_GE(c->devices().size(), 2u) << "the CPU plugin creates several devices";
  for (size_t i = 0; i < c->devices().size(); ++i) {
    EXPECT_EQ(c->devices()[i].local_index, int(i));
    EXPECT_FALSE(c->devices()[i].kind.empty());
  }
  std::cerr << "PJRT " << c->api_version() << " " << c->platform_name() << " " << c->platform_version()
            << ", " << c->devices().size() << " devices, device 0: " << c->devices()[0].kind << " ("
            << c->devices()[0].description << ")\n";
}

// ---- compiling and running

TEST(PjrtClient, CompilesAndRunsAdd) {
  PJRT_CLIENT_OR_SKIP(c);
  auto exe = add_executable(*c);
  EXPECT_EQ(exe->num_outputs(), 1);
  EXPECT_EQ(exe->outputs()[0], (ArraySpec{DType::Float32, {4}}));
  EXPECT_TRUE(exe->devices().empty()) << "a 1 x 1 executable is portable";
  auto a = upload<float>(*c, {1.5f, 2, 3, -4}, {4});
  auto b = upload<float>(*c, {0.25f, 10, -3, 4}, {4});
  auto out = c->execute(*exe, {{a, b}});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].size(), 1u);
  out[0][0]->await_ready();
  EXPECT_EQ(out[0][0]->device_index(), 0);
  EXPECT_EQ(download<float>(*out[0][0]), (std::vector<float>{1.75f, 12, 0, 0}));
}

TEST(PjrtClient, PrettyFormWithTwoOutputs) {
  PJRT_CLIENT_OR_SKIP(c);
  auto exe = c->compile(kMulSub);
  ASSERT_EQ(exe->num_outputs(), 2);
  auto a = upload<float>(*c, {1, 2, 3, 4, 5, 6}, {2, 3});
  auto b = upload<float>(*c, {2, 2, 2, 0.5f, 0.5f, 0.5f}, {2, 3});
  auto out = c->execute(*exe, {{a, b}})[0];
  EXPECT_EQ(out[0]->dims(), (Shape{2, 3}));
  EXPECT_EQ(download<float>(*out[0]), (std::vector<float>{2, 4, 6, 2, 2.5f, 3}));
  EXPECT_EQ(download<float>(*out[1]), (std::vector<float>{-1, 0, 1, 3.5f, 4.5f, 5.5f}));
}

TEST(PjrtClient, ExecuteOnAnotherDevice) {
  PJRT_CLIENT_OR_SKIP(c);
  auto exe = add_executable(*c);
  auto a = upload<float>(*c, {1, 2, 3, 4}, {4}, 1);
  auto b = upload<float>(*c, {10, 20, 30, 40}, {4}, 1);
  auto out = c->execute_on(*exe, {a, b}, 1);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]->device_index(), 1);
  EXPECT_EQ(download<float>(*out[0]), (std::vector<float>{11, 22, 33, 44}));
  // execute() runs a portable executable where its arguments are.
  EXPECT_EQ(c->execute(*exe, {{a, b}})[0][0]->device_index(), 1);
}

TEST(PjrtClient, Bf16AndBoolRoundTrip) {
  PJRT_CLIENT_OR_SKIP(c);
  const std::vector<bf16_t> h = {f32_to_bf16(1.0f), f32_to_bf16(-2.5f), f32_to_bf16(3.140625f),
                                 f32_to_bf16(1e-3f)};
  auto hb = upload(*c, h, {2, 2});
  EXPECT_EQ(hb->dtype(), DType::BFloat16);
  const auto back = download<bf16_t>(*hb);
  ASSERT_EQ(back.size(), h.size());
  EXPECT_EQ(std::memcmp(back.data(), h.data(), h.size() * sizeof(bf16_t)), 0);

  // bf16 arithmetic in the plugin: x + x is exact in bf16.
  auto doubled = c->compile(R"(func.func @main(%x: tensor<2x2xbf16>) -> tensor<2x2xbf16> {
    %0 = "stablehlo.add"(%x, %x) : (tensor<2x2xbf16>, tensor<2x2xbf16>) -> tensor<2x2xbf16>
    return %0 : tensor<2x2xbf16>
  })");
  const auto twice = download<bf16_t>(*c->execute(*doubled, {{hb}})[0][0]);
  for (size_t i = 0; i < h.size(); ++i) EXPECT_EQ(bf16_to_f32(twice[i]), 2 * bf16_to_f32(h[i])) << i;

  const std::vector<uint8_t> flags = {1, 0, 0, 1, 1};  // Kiln's bool is one byte, as PRED
  auto fb = c->buffer_from_host(flags.data(), flags.size(), DType::Bool, {5}, 0);
  auto negate = c->compile(R"(func.func @main(%x: tensor<5xi1>) -> tensor<5xi1> {
    %0 = "stablehlo.not"(%x) : (tensor<5xi1>) -> tensor<5xi1>
    return %0 : tensor<5xi1>
  })");
  auto out = c->execute(*negate, {{fb}})[0][0];
  EXPECT_EQ(out->dtype(), DType::Bool);
  EXPECT_EQ(download<uint8_t>(*out), (std::vector<uint8_t>{0, 1, 1, 0, 0}));
  EXPECT_EQ(download<uint8_t>(*fb), flags);
}

TEST(PjrtClient, SerializeDeserializeRun) {
  PJRT_CLIENT_OR_SKIP(c);
  const std::string bytes = add_executable(*c)->serialize();
  EXPECT_GT(bytes.size(), 100u);
  auto exe = c->deserialize(bytes);
  ASSERT_EQ(exe->parameters().size(), 2u);
  EXPECT_EQ(exe->parameters()[1], (ArraySpec{DType::Float32, {4}}));
  auto a = upload<float>(*c, {1, 1, 1, 1}, {4}, 1);
  auto b = upload<float>(*c, {1, 2, 3, 4}, {4}, 1);
  EXPECT_EQ(download<float>(*c->execute_on(*exe, {a, b}, 1)[0]), (std::vector<float>{2, 3, 4, 5}));
  EXPECT_THROW(c->deserialize("not an executable"), Error);
}

// Two products in a row: the first one's 64 x 64 result lives only inside the run, in XLA's scratch.
TEST(PjrtClient, ReportsTheScratchOfARun) {
  PJRT_CLIENT_OR_SKIP(c);
  auto chain =
      c->compile(R"(func.func @main(%a: tensor<64x64xf32>, %b: tensor<64x64xf32>) -> tensor<64x64xf32> {
    %0 = "stablehlo.dot_general"(%a, %b) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1],
        rhs_contracting_dimensions = [0]>} : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
    %1 = "stablehlo.dot_general"(%0, %b) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1],
        rhs_contracting_dimensions = [0]>} : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
    return %1 : tensor<64x64xf32>
  })");
  const std::optional<int64_t> scratch = chain->scratch_bytes();
  ASSERT_TRUE(scratch.has_value()) << "the CPU plugin reports its executables' temporary memory";
  EXPECT_GE(*scratch, 64 * 64 * 4) << "the first product is held between the two";
  EXPECT_LT(*scratch, 64 * 64 * 4 * 8);
  // A deserialized executable knows it too.
  EXPECT_EQ(c->deserialize(chain->serialize())->scratch_bytes(), scratch);
  std::cerr << "scratch of two chained 64x64 products: " << *scratch
            << " bytes; of an add: " << add_executable(*c)->scratch_bytes().value_or(-1) << "\n";
}

// The CPU plugin does not report its devices' memory (they share the host's): no limit, so --offload auto
// plans for the device as it does without a report. (A plugin that reports it: cli/device_flag.cmake's
// kiln_memory_reporting_pjrt_plugin tests.)
TEST(PjrtClient, TheCpuPluginReportsNoDeviceMemory) {
  PJRT_CLIENT_OR_SKIP(c);
  EXPECT_FALSE(c->memory_report(0).has_value());
  EXPECT_THROW(c->memory_report(int(c->devices().size())), Error);
}

TEST(PjrtClient, AllReduceAcrossTwoReplicas) {
  PJRT_CLIENT_OR_SKIP(c);
  auto exe = c->compile(R"(func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
    %0 = "stablehlo.all_reduce"(%x) ({
    ^bb0(%p: tensor<f32>, %q: tensor<f32>):
      %s = "stablehlo.add"(%p, %q) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%s) : (tensor<f32>) -> ()
    }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<3xf32>) -> tensor<3xf32>
    return %0 : tensor<3xf32>
  })",
                        2, 1);
  ASSERT_EQ(exe->devices().size(), 2u);
  EXPECT_EQ(exe->num_replicas(), 2);
  std::vector<std::vector<std::shared_ptr<Buffer>>> args;
  for (int r = 0; r < 2; ++r) {
    const float base = r == 0 ? 1.0f : 100.0f;
    args.push_back({upload<float>(*c, {base, 2 * base, 3 * base}, {3}, exe->devices()[r])});
  }
  auto out = c->execute(*exe, args);
  ASSERT_EQ(out.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(out[r][0]->device_index(), exe->devices()[r]);
    EXPECT_EQ(download<float>(*out[r][0]), (std::vector<float>{101, 202, 303})) << "replica " << r;
  }
  EXPECT_THROW(c->execute_on(*exe, args[0], 0), Error);  // not a 1 x 1 executable
}

// ---- errors, caught before the plugin sees them

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(PjrtErrors, BadArgumentsAreRefusedByKiln) {
  PJRT_CLIENT_OR_SKIP(c);
  auto exe = add_executable(*c);
  auto a = upload<float>(*c, {1, 2, 3, 4}, {4});
  auto wrong_dims = upload<float>(*c, {1, 2, 3, 4}, {2, 2});
  auto wrong_dtype = upload<int32_t>(*c, {1, 2, 3, 4}, {4});
  auto other_device = upload<float>(*c, {1, 2, 3, 4}, {4}, 1);
  EXPECT_NE(error_of([&] { c->execute(*exe, {{a}}); }).find("1 arguments given, the executable takes 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              c->execute(*exe, {{a, wrong_dims}});
            }).find("expects float32[4]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              c->execute(*exe, {{a, wrong_dtype}});
            }).find("argument 1 is int32[4]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              c->execute(*exe, {{a, other_device}});
            }).find("is on device 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              c->execute(*exe, {{a, nullptr}});
            }).find("argument 1 is null"),
            std::string::npos);
  const int n = int(c->devices().size());
  EXPECT_NE(error_of([&] { c->execute_on(*exe, {a, a}, n); }).find("out of range"), std::string::npos);
  const std::vector<float> v(4);
  EXPECT_NE(
      error_of([&] { c->buffer_from_host(v.data(), 16, DType::Float32, {4}, -1); }).find("out of range"),
      std::string::npos);
  EXPECT_NE(
      error_of([&] { c->buffer_from_host(v.data(), 12, DType::Float32, {4}, 0); }).find("which needs 16"),
      std::string::npos);
  std::vector<float> small(3);
  EXPECT_NE(error_of([&] { a->to_host(small.data(), 12); }).find("which has 16"), std::string::npos);
  EXPECT_NE(error_of([&] { c->compile(""); }).find("empty"), std::string::npos);
  EXPECT_NE(error_of([&] { c->compile(kAdd, n + 1, 1); }).find("do not fit"), std::string::npos);
}

// Invalid MLIR reaches the plugin's parser: run in a child so that an abort there fails this test, not the
// run.
TEST(PjrtErrorsDeathTest, InvalidMlirIsAnErrorCarryingThePluginsMessage) {
  if (!built_with_pjrt()) GTEST_SKIP() << "this build has no PJRT support";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto c = shared_client(nullptr);
        const std::string m = error_of([&] {
          c->compile(R"(func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
            %0 = "stablehlo.no_such_op"(%a) : (tensor<4xf32>) -> tensor<4xf32>
            return %0 : tensor<4xf32>
          })");
        });
        std::fprintf(stderr, "%s\n", m.c_str());
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "PJRT_Client_Compile: [A-Z_]+: .*no_such_op");
}

}  // namespace
}  // namespace kiln::pjrt
