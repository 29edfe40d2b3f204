// Turning what a user types ("black-forest-labs/FLUX.1-schnell", "org/name@v1.0", "./my-model") into a
// folder on disk. Hugging Face repo ids are looked up in the local Hugging Face cache, never downloaded:
//   <cache>/models--<org>--<name>/refs/<revision>   a text file holding a commit hash
//   <cache>/models--<org>--<name>/snapshots/<hash>/ the files (symlinks into ../../blobs/, followed as usual)
// where <cache> is $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub.
#pragma once

#include <string>

namespace kiln::io {

struct ResolveOptions {
  std::string revision;   // branch, tag or commit hash; "" means main (or the @rev in the reference)
  std::string cache_dir;  // overrides the environment when set
};

struct ResolvedModel {
  std::string path;      // the folder to read: the local directory or the cache snapshot
  std::string repo_id;   // "org/name" when found in the cache; empty for a local directory
  std::string revision;  // the revision asked for ("main", a tag, a hash); empty for a local directory
  std::string commit;    // the snapshot's commit hash; empty for a local directory
  bool from_cache() const { return !repo_id.empty(); }
};

// The Hugging Face hub cache folder this process would use (it need not exist).
std::string hf_hub_cache_dir();

// True when `ref` has the shape of a repo id, "org/name" or "name", optionally followed by "@revision".
bool looks_like_repo_id(const std::string& ref);

// A local directory wins when it exists; otherwise `ref` must look like a repo id and be in the cache.
// Throws kiln::Error saying where it looked: a path that is not a directory, a repo that is not cached (with
// the `huggingface-cli download` command that fetches it), a missing ref or snapshot.
ResolvedModel resolve_model(const std::string& ref, const ResolveOptions& options = {});

}  // namespace kiln::io
