#include "kiln/io/model_ref.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "kiln/core/error.h"

namespace kiln::io {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool is_commit_hash(const std::string& s) {
  static const std::regex hash("[0-9a-f]{40}");
  return std::regex_match(s, hash);
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t'))
    s.pop_back();
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  return s.substr(i);
}

}  // namespace

std::string hf_hub_cache_dir() {
  if (auto v = env("HF_HUB_CACHE"); !v.empty()) return v;
  // The older name, still honoured by huggingface_hub, ahead of HF_HOME.
  if (auto v = env("HUGGINGFACE_HUB_CACHE"); !v.empty()) return v;
  if (auto v = env("HF_HOME"); !v.empty()) return (fs::path(v) / "hub").string();
  const std::string home = env("HOME");
  const std::string xdg = env("XDG_CACHE_HOME");
  const fs::path cache = !xdg.empty() ? fs::path(xdg) : fs::path(home.empty() ? "/" : home) / ".cache";
  return (cache / "huggingface" / "hub").string();
}

bool looks_like_repo_id(const std::string& ref) {
  // Hub rules: names of letters, digits, '-', '_', '.', not starting with '.' or '-', at most one '/'.
  static const std::regex id(
      R"(([A-Za-z0-9][A-Za-z0-9_.\-]*/)?[A-Za-z0-9][A-Za-z0-9_.\-]*(@[A-Za-z0-9_.\-/]+)?)");
  return std::regex_match(ref, id) && ref.find("..") == std::string::npos;
}

ResolvedModel resolve_model(const std::string& ref, const ResolveOptions& options) {
  KILN_CHECK(!ref.empty(),
             "model reference is empty: expected a folder or a Hugging Face repo id such as "
             "black-forest-labs/FLUX.1-schnell");
  std::error_code ec;
  if (fs::exists(ref, ec)) {
    KILN_CHECK(fs::is_directory(ref, ec), ref << ": not a directory (expected a diffusers model folder)");
    KILN_CHECK(options.revision.empty(),
               ref << ": a revision (" << options.revision
                   << ") only applies to Hugging Face repo ids, not to local folders");
    ResolvedModel local;
    local.path = ref;
    return local;
  }
  KILN_CHECK(looks_like_repo_id(ref), ref << ": no such file or directory (and not a Hugging Face repo id "
                                             "of the form org/name)");

  std::string repo = ref, revision = options.revision;
  if (const auto at = ref.find('@'); at != std::string::npos) {
    repo = ref.substr(0, at);
    const std::string rev = ref.substr(at + 1);
    KILN_CHECK(revision.empty() || revision == rev, ref << ": two different revisions asked for: '" << rev
                                                        << "' in the reference and '" << revision
                                                        << "' as an option");
    revision = rev;
  }
  if (revision.empty()) revision = "main";
  KILN_CHECK(revision.find("..") == std::string::npos && revision.front() != '/',
             ref << ": invalid revision '" << revision << "'");

  const std::string cache = options.cache_dir.empty() ? hf_hub_cache_dir() : options.cache_dir;
  std::string folder = "models--" + repo;
  for (size_t p; (p = folder.find('/')) != std::string::npos;) folder.replace(p, 1, "--");
  const fs::path repo_dir = fs::path(cache) / folder;
  KILN_CHECK(
      fs::is_directory(repo_dir, ec),
      repo << ": not a local folder, and not in the Hugging Face cache (looked for " << repo_dir.string()
           << "; the cache is $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub). Download it "
              "with: huggingface-cli download "
           << repo << (revision == "main" ? "" : " --revision " + revision));

  ResolvedModel out;
  out.repo_id = repo;
  out.revision = revision;
  if (is_commit_hash(revision)) {
    out.commit = revision;
  } else {
    const fs::path ref_file = repo_dir / "refs" / revision;
    std::ifstream in(ref_file);
    KILN_CHECK(in.good() && fs::is_regular_file(ref_file, ec),
               repo << ": revision '" << revision << "' is not in the cache (no file " << ref_file.string()
                    << "). Download it with: huggingface-cli download " << repo << " --revision "
                    << revision);
    std::string hash;
    std::getline(in, hash);
    out.commit = trim(hash);
    KILN_CHECK(is_commit_hash(out.commit),
               ref_file.string() << ": expected a 40-character commit hash, got '" << out.commit << "'");
  }
  const fs::path snapshot = repo_dir / "snapshots" / out.commit;
  KILN_CHECK(fs::is_directory(snapshot, ec),
             repo << ": revision '" << revision << "' points to commit " << out.commit
                  << " but there is no snapshot " << snapshot.string()
                  << " (incomplete download?). Download it with: huggingface-cli download " << repo
                  << (revision == "main" ? "" : " --revision " + revision));
  out.path = snapshot.string();
  return out;
}

}  // namespace kiln::io
