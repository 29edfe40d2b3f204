#include "backends/pjrt/executable_disk_cache.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/cache_dir.h"
#include "io/atomic_file.h"
#include "kiln/core/error.h"
#include "kiln/core/log.h"

namespace kiln::pjrt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMagic = "kiln-pjrt-executable 1";

uint64_t fnv1a64(const std::string& bytes, uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string hex(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = digits[v & 15];
  return s;
}

// Two differently seeded 64-bit hashes: a 128-bit name, so distinct keys practically never share a file
// (the key inside the entry is what makes a shared one harmless).
std::string name_of(const std::string& key) {
  return hex(fnv1a64(key, 0xcbf29ce484222325ull)) + hex(fnv1a64(key, 0x84222325cbf29ce4ull));
}

std::string checksum(const std::string& key, const std::string& payload) {
  return hex(fnv1a64(payload, fnv1a64(key, 0xcbf29ce484222325ull)));
}

// The entry's header: magic, sizes and checksum, each on its own line; then the key and the payload.
std::string header_of(const std::string& key, const std::string& payload) {
  std::ostringstream h;
  h << kMagic << "\nkey " << key.size() << "\npayload " << payload.size() << "\nchecksum "
    << checksum(key, payload) << "\n";
  return h.str();
}

bool read_whole(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream s;
  s << f.rdbuf();
  *out = s.str();
  return true;
}

// The payload of `entry` when it is a complete, intact entry for exactly `key`; why not otherwise.
bool parse_entry(const std::string& entry, const std::string& key, std::string* payload, std::string* why) {
  std::istringstream in(entry);
  std::string magic, word;
  size_t key_size = 0, payload_size = 0;
  std::string sum;
  if (!std::getline(in, magic) || magic != kMagic) {
    *why = "not a Kiln PJRT executable entry (or of another format version)";
    return false;
  }
  if (!(in >> word >> key_size) || word != "key" || !(in >> word >> payload_size) || word != "payload" ||
      !(in >> word >> sum) || word != "checksum" || in.get() != '\n') {
    *why = "its header is damaged";
    return false;
  }
  const size_t start = static_cast<size_t>(in.tellg());
  if (entry.size() != start + key_size + payload_size) {
    *why = "it holds " + std::to_string(entry.size()) + " bytes, its header says " +
           std::to_string(start + key_size + payload_size) + " (truncated or damaged)";
    return false;
  }
  if (entry.compare(start, key_size, key) != 0) {
    *why = "it was compiled from another module or plugin (a name collision)";
    return false;
  }
  *payload = entry.substr(start + key_size);
  if (checksum(key, *payload) != sum) {
    *why = "its checksum does not match its bytes (damaged)";
    return false;
  }
  return true;
}

}  // namespace

ExecutableDiskCache::ExecutableDiskCache(std::string folder) : folder_(std::move(folder)) {}

ExecutableDiskCache ExecutableDiskCache::from_environment() {
  const std::string root = cache_dir();
  return ExecutableDiskCache(root.empty() ? std::string() : (fs::path(root) / "pjrt-executables").string());
}

std::string ExecutableDiskCache::key_of(const Client& client, const std::string& module_text) {
  return "platform " + client.platform_name() + "\nplatform-version " + client.platform_version() +
         "\npjrt-api " + client.api_version() + "\nmodule\n" + module_text;
}

std::string ExecutableDiskCache::path_of(const std::string& key) const {
  return (fs::path(folder_) / (name_of(key) + ".pjrt")).string();
}

std::shared_ptr<Executable> ExecutableDiskCache::load(Client& client, const std::string& key,
                                                      Lookup* result) const {
  *result = Lookup::Absent;
  if (!enabled()) return nullptr;
  const std::string path = path_of(key);
  std::string entry;
  if (!read_whole(path, &entry)) return nullptr;
  std::string payload, why;
  *result = Lookup::Rejected;
  if (!parse_entry(entry, key, &payload, &why)) {
    warn("PJRT executable cache: ignoring " + path + ": " + why + "; compiling again");
    return nullptr;
  }
  try {
    std::shared_ptr<Executable> made = client.deserialize(payload);
    *result = Lookup::Hit;
    return made;
  } catch (const Error& e) {
    warn("PJRT executable cache: the plugin could not load " + path + " (" + e.what() + "); compiling again");
    return nullptr;
  }
}

void ExecutableDiskCache::store(const Executable& executable, const std::string& key) const {
  if (!enabled()) return;
  try {
    const std::string payload = executable.serialize();
    std::error_code ec;
    fs::create_directories(folder_, ec);
    KILN_CHECK(!ec, "cannot create " << folder_ << ": " << ec.message());
    const std::string header = header_of(key, payload);
    io::AtomicFile file(path_of(key));
    file.write(header.data(), header.size());
    file.write(key.data(), key.size());
    file.write(payload.data(), payload.size());
    file.commit();
  } catch (const Error& e) {
    warn(std::string("PJRT executable cache: cannot save an executable (") + e.what() +
         "); it will be compiled again in the next process");
  }
}

}  // namespace kiln::pjrt
