#include "cli/serve/metrics.h"

#include <unistd.h>

#include <charconv>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>

#include "kiln/core/allocator.h"
#include "kiln/runtime/device_ledger.h"

namespace kiln::serve {

namespace {

// The shortest text that reads back as `v`, with a "." whatever the locale (0.005, not
// 0.0050000000000000001).
std::string number(double v) {
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
  return std::string(buf, end);
}

void header(std::ostringstream& out, const char* name, const char* type, const char* help) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

// One device's memory, read once per scrape: what Kiln holds there, its limit, and the plugin's report.
struct DeviceMemorySnapshot {
  Device device;
  MemoryStats held;
  std::optional<int64_t> limit;
  std::optional<DriverMemoryReport> report;
};

// One gauge per device, labelled by its name, for the devices that have a value (`value` gives none: the line
// is left out).
void device_gauge(std::ostringstream& out, const std::vector<DeviceMemorySnapshot>& devices, const char* name,
                  const char* help,
                  const std::function<std::optional<int64_t>(const DeviceMemorySnapshot&)>& value) {
  bool any = false;
  for (const DeviceMemorySnapshot& d : devices) {
    const std::optional<int64_t> v = value(d);
    if (!v) continue;
    if (!any) header(out, name, "gauge", help);
    any = true;
    out << name << "{device=\"" << d.device.str() << "\"} " << *v << '\n';
  }
}

void render_device_memory(std::ostringstream& out, const std::vector<Device>& devices) {
  std::vector<DeviceMemorySnapshot> snapshots;
  for (const Device& d : devices)
    snapshots.push_back({d, memory_stats(d), total_memory_limit(d), driver_memory_report(d)});
  using Snapshot = const DeviceMemorySnapshot&;
  device_gauge(out, snapshots, "kiln_device_allocated_bytes",
               "Bytes Kiln holds on the device (arrays, weights brought in, a running program's scratch).",
               [](Snapshot d) { return d.held.current_bytes; });
  device_gauge(out, snapshots, "kiln_device_allocated_peak_bytes",
               "Peak of kiln_device_allocated_bytes since the start.",
               [](Snapshot d) { return d.held.peak_bytes; });
  device_gauge(out, snapshots, "kiln_device_memory_limit_bytes",
               "The most Kiln may hold on the device: the sum of its pipelines' memory budgets there.",
               [](Snapshot d) { return d.limit; });
  device_gauge(out, snapshots, "kiln_device_memory_total_bytes",
               "The device's memory, as its plugin reports it.", [](Snapshot d) -> std::optional<int64_t> {
                 return d.report ? std::optional<int64_t>(d.report->limit_bytes) : std::nullopt;
               });
  device_gauge(out, snapshots, "kiln_device_memory_in_use_bytes",
               "Bytes in use on the device by anyone, as its plugin reports it.",
               [](Snapshot d) -> std::optional<int64_t> {
                 return d.report ? std::optional<int64_t>(d.report->in_use_bytes) : std::nullopt;
               });
}

}  // namespace

void Histogram::observe(double value) {
  for (size_t i = 0; i < kBounds.size(); ++i)
    if (value <= kBounds[i]) {
      ++buckets_[i];
      break;
    }
  ++count_;
  sum_ += value;
}

std::string Histogram::render(const std::string& name) const {
  std::ostringstream out;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kBounds.size(); ++i) {
    cumulative += buckets_[i];
    out << name << "_bucket{le=\"" << number(kBounds[i]) << "\"} " << cumulative << '\n';
  }
  out << name << "_bucket{le=\"+Inf\"} " << count_ << '\n';
  out << name << "_sum " << number(sum_) << '\n' << name << "_count " << count_ << '\n';
  return out.str();
}

void Metrics::job_submitted() {
  std::lock_guard lock(mutex_);
  ++submitted_;
}

void Metrics::job_refused_queue_full() {
  std::lock_guard lock(mutex_);
  ++refused_queue_full_;
}

void Metrics::job_ended(const Job::Snapshot& end) {
  std::lock_guard lock(mutex_);
  ++ended_[status_name(end.status)];
  images_ += end.images;
  queue_seconds_.observe(end.queue_seconds);
  if (end.run_seconds > 0) job_seconds_.observe(end.run_seconds);
}

void Metrics::step(double seconds) {
  std::lock_guard lock(mutex_);
  step_seconds_.observe(seconds);
}

void Metrics::http_answer(int status) {
  std::lock_guard lock(mutex_);
  ++http_answers_[status];
}

std::string Metrics::render(const Gauges& gauges) const {
  std::lock_guard lock(mutex_);
  std::ostringstream out;
  header(out, "kiln_queue_length", "gauge", "Jobs waiting to start.");
  out << "kiln_queue_length " << gauges.queue_length << '\n';
  header(out, "kiln_jobs_running", "gauge", "Jobs running now.");
  out << "kiln_jobs_running " << gauges.running << '\n';
  header(out, "kiln_models", "gauge", "Models this server was started with.");
  out << "kiln_models " << gauges.models << '\n';
  header(out, "kiln_models_loaded", "gauge", "Models whose pipelines are loaded now.");
  out << "kiln_models_loaded " << gauges.models_loaded << '\n';
  header(out, "kiln_jobs_submitted_total", "counter", "Jobs accepted into the queue.");
  out << "kiln_jobs_submitted_total " << submitted_ << '\n';
  header(out, "kiln_jobs_refused_total", "counter", "Jobs refused with 503 because the queue was full.");
  out << "kiln_jobs_refused_total " << refused_queue_full_ << '\n';
  header(out, "kiln_jobs_total", "counter", "Jobs that ended, by outcome.");
  for (const char* status : {"succeeded", "failed", "cancelled"}) {
    const auto it = ended_.find(status);
    out << "kiln_jobs_total{status=\"" << status << "\"} " << (it == ended_.end() ? 0 : it->second) << '\n';
  }
  header(out, "kiln_images_total", "counter", "Images generated.");
  out << "kiln_images_total " << images_ << '\n';
  header(out, "kiln_step_seconds", "histogram", "Time of one denoising step.");
  out << step_seconds_.render("kiln_step_seconds");
  header(out, "kiln_queue_wait_seconds", "histogram", "Time from a job's submission to its start.");
  out << queue_seconds_.render("kiln_queue_wait_seconds");
  header(out, "kiln_job_seconds", "histogram", "Time from a job's start to its end.");
  out << job_seconds_.render("kiln_job_seconds");
  header(out, "kiln_http_responses_total", "counter", "HTTP answers, by status code.");
  for (const auto& [status, n] : http_answers_)
    out << "kiln_http_responses_total{code=\"" << status << "\"} " << n << '\n';
  header(out, "kiln_errors_total", "counter",
         "Jobs that failed plus HTTP answers with status 500 (a full queue's 503 is not an error).");
  uint64_t errors = 0;
  if (const auto it = ended_.find("failed"); it != ended_.end()) errors += it->second;
  if (const auto it = http_answers_.find(500); it != http_answers_.end()) errors += it->second;
  out << "kiln_errors_total " << errors << '\n';
  header(out, "kiln_resident_memory_bytes", "gauge", "Resident memory of the process.");
  out << "kiln_resident_memory_bytes " << resident_memory_bytes() << '\n';
  const MemoryStats memory = memory_stats();
  header(out, "kiln_allocated_bytes", "gauge",
         "Bytes held by Kiln's CPU allocator (tensors, packed weights).");
  out << "kiln_allocated_bytes " << memory.current_bytes << '\n';
  header(out, "kiln_allocated_peak_bytes", "gauge", "Peak of kiln_allocated_bytes since the start.");
  out << "kiln_allocated_peak_bytes " << memory.peak_bytes << '\n';
  render_device_memory(out, gauges.devices);
  return out.str();
}

int64_t resident_memory_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace kiln::serve
