// The PJRT client of a build without the PJRT C API header (not fetched when Kiln was configured): the
// library and the PJRT backend still build, and Client::create says how to get PJRT support. No Client,
// Buffer or Executable can exist in such a build, so their other members are never reached.
#ifndef KILN_HAVE_PJRT
#include "backends/pjrt/pjrt_client.h"
#include "backends/pjrt/pjrt_topology.h"
#include "kiln/core/error.h"

namespace kiln::pjrt {
namespace {
[[noreturn]] void unavailable() {
  KILN_FAIL(
      "PJRT: this build of Kiln has no PJRT support (the PJRT C API header was not found when it was "
      "configured). Run ./scripts/setup.sh --pjrt, then configure and build again (cmake finds the header in "
      "Kiln's cache, or set -DKILN_PJRT_INCLUDE_DIR)");
}
}  // namespace

bool built_with_pjrt() {
  return false;
}

struct Client::State {};
std::shared_ptr<Client> Client::create(const std::string&, const std::vector<ClientOption>&) {
  unavailable();
}
Client::~Client() = default;
const std::string& Client::plugin_path() const {
  unavailable();
}
std::string Client::api_version() const {
  unavailable();
}
std::string Client::platform_name() const {
  unavailable();
}
std::string Client::platform_version() const {
  unavailable();
}
const std::vector<DeviceInfo>& Client::devices() const {
  unavailable();
}
std::shared_ptr<Executable> Client::compile(std::string_view, int, int) {
  unavailable();
}
std::shared_ptr<Executable> Client::deserialize(std::string_view) {
  unavailable();
}
std::shared_ptr<Buffer> Client::buffer_from_host(const void*, size_t, DType, const Shape&, int) {
  unavailable();
}
std::vector<std::vector<std::shared_ptr<Buffer>>> Client::execute(
    const Executable&, const std::vector<std::vector<std::shared_ptr<Buffer>>>&) {
  unavailable();
}
std::vector<std::shared_ptr<Buffer>> Client::execute_on(const Executable&,
                                                        const std::vector<std::shared_ptr<Buffer>>&, int) {
  unavailable();
}

Buffer::Buffer(std::shared_ptr<const Plugin> plugin, Raw* raw, DType dtype, Shape dims, int device_index)
    : plugin_(std::move(plugin)),
      raw_(raw),
      dtype_(dtype),
      dims_(std::move(dims)),
      device_index_(device_index) {
  unavailable();
}
Buffer::~Buffer() = default;
size_t Buffer::bytes() const {
  unavailable();
}
void Buffer::to_host(void*, size_t) const {
  unavailable();
}
void Buffer::await_ready() const {
  unavailable();
}

std::optional<DriverMemoryReport> Client::memory_report(int) const {
  unavailable();
}

Executable::Executable(std::shared_ptr<const Plugin> plugin, Raw* raw)
    : plugin_(std::move(plugin)), raw_(raw) {
  unavailable();
}
Executable::~Executable() = default;
int Executable::num_outputs() const {
  unavailable();
}
const std::vector<ArraySpec>& Executable::parameters() const {
  unavailable();
}
const std::vector<ArraySpec>& Executable::outputs() const {
  unavailable();
}
int Executable::num_replicas() const {
  unavailable();
}
int Executable::num_partitions() const {
  unavailable();
}
const std::vector<int>& Executable::devices() const {
  unavailable();
}
std::optional<int64_t> Executable::scratch_bytes() const {
  unavailable();
}
std::string Executable::serialize() const {
  unavailable();
}

struct Topology::State {};
std::shared_ptr<Topology> Topology::create(const std::string&, const std::string&,
                                           const std::vector<ClientOption>&) {
  unavailable();
}
Topology::~Topology() = default;
const std::string& Topology::platform_name() const {
  unavailable();
}
int Topology::device_count() const {
  unavailable();
}
const std::string& Topology::device_kind() const {
  unavailable();
}
TargetProgram Topology::compile(std::string_view, int, int) const {
  unavailable();
}

}  // namespace kiln::pjrt
#endif  // !KILN_HAVE_PJRT
