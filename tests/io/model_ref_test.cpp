// resolve_model: local folders and repo ids in fake Hugging Face caches built in temp dirs.
#include "kiln/io/model_ref.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "io/io_test_util.h"
#include "support/test_data.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::temp_dir;
using testing::write_text;

const std::string kMainHash = "0123456789abcdef0123456789abcdef01234567";
const std::string kTagHash = "fedcba9876543210fedcba9876543210fedcba98";

// A cache laid out as huggingface_hub writes it: refs, snapshots of symlinks, blobs.
std::string make_cache(const std::string& name) {
  const std::string cache = temp_dir(name);
  const fs::path repo = fs::path(cache) / "models--black-forest-labs--FLUX.1-schnell";
  fs::create_directories(repo / "refs");
  fs::create_directories(repo / "blobs");
  write_text((repo / "refs" / "main").string(), kMainHash);  // no trailing newline, as the hub writes it
  write_text((repo / "refs" / "v1.0").string(), kTagHash + "\n");
  write_text((repo / "blobs" / "abc123").string(), R"({"_class_name": "FluxPipeline"})");
  for (const auto& hash : {kMainHash, kTagHash}) {
    fs::create_directories(repo / "snapshots" / hash);
    fs::create_symlink("../../blobs/abc123", repo / "snapshots" / hash / "model_index.json");
  }
  return cache;
}

// Sets an environment variable for the scope of one test.
struct ScopedEnv {
  std::string name;
  std::string old;
  bool had;
  ScopedEnv(const char* n, const std::string& value) : name(n) {
    const char* v = getenv(n);
    had = v != nullptr;
    if (had) old = v;
    if (value.empty())
      unsetenv(n);
    else
      setenv(n, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had)
      setenv(name.c_str(), old.c_str(), 1);
    else
      unsetenv(name.c_str());
  }
};

TEST(ResolveModel, LocalFolder) {
  const std::string dir = temp_dir("resolve_local");
  const auto r = io::resolve_model(dir);
  EXPECT_EQ(r.path, dir);
  EXPECT_FALSE(r.from_cache());
  write_text(dir + "/file.txt", "x");
  EXPECT_KILN_ERROR(io::resolve_model(dir + "/file.txt"), "file.txt", "not a directory");
  EXPECT_KILN_ERROR(io::resolve_model(dir + "/absent"), "absent", "no such file or directory");
  EXPECT_KILN_ERROR(io::resolve_model(dir, {.revision = "main"}), "revision", "local folders");
  EXPECT_KILN_ERROR(io::resolve_model(""), "empty");
}

TEST(ResolveModel, RepoIdInTheCache) {
  const std::string cache = make_cache("resolve_cache");
  ScopedEnv hub("HF_HUB_CACHE", cache);
  const auto r = io::resolve_model("black-forest-labs/FLUX.1-schnell");
  EXPECT_TRUE(r.from_cache());
  EXPECT_EQ(r.repo_id, "black-forest-labs/FLUX.1-schnell");
  EXPECT_EQ(r.revision, "main");
  EXPECT_EQ(r.commit, kMainHash);
  EXPECT_EQ(r.path, cache + "/models--black-forest-labs--FLUX.1-schnell/snapshots/" + kMainHash);
  // Files are symlinks into blobs/, followed like any file.
  EXPECT_EQ(testing::read_bytes(r.path + "/model_index.json"), R"({"_class_name": "FluxPipeline"})");

  // Revisions: a tag through refs/, a commit hash directly, from the reference or the option.
  EXPECT_EQ(io::resolve_model("black-forest-labs/FLUX.1-schnell@v1.0").commit, kTagHash);
  EXPECT_EQ(io::resolve_model("black-forest-labs/FLUX.1-schnell", {.revision = "v1.0"}).commit, kTagHash);
  EXPECT_EQ(io::resolve_model("black-forest-labs/FLUX.1-schnell@" + kTagHash).path,
            cache + "/models--black-forest-labs--FLUX.1-schnell/snapshots/" + kTagHash);
  EXPECT_KILN_ERROR(io::resolve_model("black-forest-labs/FLUX.1-schnell@v1.0", {.revision = "main"}),
                    "two different revisions");
  // An explicit cache directory overrides the environment.
  ScopedEnv hub2("HF_HUB_CACHE", "/nonexistent");
  EXPECT_EQ(io::resolve_model("black-forest-labs/FLUX.1-schnell", {.cache_dir = cache}).commit, kMainHash);
}

TEST(ResolveModel, CacheLocationFromTheEnvironment) {
  ScopedEnv hub("HF_HUB_CACHE", "");
  ScopedEnv legacy("HUGGINGFACE_HUB_CACHE", "");
  ScopedEnv xdg("XDG_CACHE_HOME", "");
  ScopedEnv home("HOME", "/home/someone");
  {
    ScopedEnv hf_home("HF_HOME", "");
    EXPECT_EQ(io::hf_hub_cache_dir(), "/home/someone/.cache/huggingface/hub");
  }
  ScopedEnv hf_home("HF_HOME", "/data/hf");
  EXPECT_EQ(io::hf_hub_cache_dir(), "/data/hf/hub");
  ScopedEnv hub2("HF_HUB_CACHE", "/fast/hub");
  EXPECT_EQ(io::hf_hub_cache_dir(), "/fast/hub");

  // HF_HOME is used for lookups.
  const std::string root = temp_dir("resolve_hf_home");
  fs::rename(make_cache("resolve_hf_home_cache"), root + "/hub");
  ScopedEnv unset_hub("HF_HUB_CACHE", "");
  ScopedEnv hf_home2("HF_HOME", root);
  EXPECT_EQ(io::resolve_model("black-forest-labs/FLUX.1-schnell").commit, kMainHash);
}

TEST(ResolveModel, ClearErrors) {
  const std::string cache = make_cache("resolve_errors");
  ScopedEnv hub("HF_HUB_CACHE", cache);
  EXPECT_KILN_ERROR(io::resolve_model("stabilityai/stable-diffusion-3.5-medium"),
                    "stabilityai/stable-diffusion-3.5-medium", "not in the Hugging Face cache",
                    cache + "/models--stabilityai--stable-diffusion-3.5-medium",
                    "huggingface-cli download stabilityai/stable-diffusion-3.5-medium");
  EXPECT_KILN_ERROR(io::resolve_model("black-forest-labs/FLUX.1-schnell@dev"),
                    "revision 'dev' is not in the cache", "refs/dev",
                    "huggingface-cli download black-forest-labs/FLUX.1-schnell --revision dev");
  const fs::path repo = fs::path(cache) / "models--black-forest-labs--FLUX.1-schnell";
  write_text((repo / "refs" / "broken").string(), "not-a-hash\n");
  EXPECT_KILN_ERROR(io::resolve_model("black-forest-labs/FLUX.1-schnell@broken"), "refs/broken",
                    "40-character commit hash");
  fs::remove_all(repo / "snapshots" / kMainHash);
  EXPECT_KILN_ERROR(io::resolve_model("black-forest-labs/FLUX.1-schnell"), "points to commit " + kMainHash,
                    "no snapshot");
  EXPECT_KILN_ERROR(io::resolve_model("black-forest-labs/FLUX.1-schnell@../../x"),
                    "no such file or directory");
  EXPECT_KILN_ERROR(io::resolve_model("black-forest-labs/FLUX.1-schnell", {.revision = "../x"}),
                    "invalid revision");
  EXPECT_FALSE(io::looks_like_repo_id("a/b/c"));
  EXPECT_FALSE(io::looks_like_repo_id("./model"));
  EXPECT_TRUE(io::looks_like_repo_id("gpt2"));
  EXPECT_TRUE(io::looks_like_repo_id("org/name@refs/pr/1"));
}

}  // namespace
}  // namespace kiln
