// The web page (cli/serve/web/), compiled into the binary by embed_web.cmake so that `kiln serve` needs no
// files beside it.
#include <cstddef>
#include <string_view>

#include "cli/serve/routes.h"

namespace kiln::serve {

namespace {

struct WebAsset {
  const char* path;  // "/index.html"
  const unsigned char* bytes;
  size_t size;
};

#include "serve_web_assets.inc"  // kWebAssets[], generated

const char* content_type(std::string_view path) {
  if (path.ends_with(".html")) return "text/html; charset=utf-8";
  if (path.ends_with(".js")) return "text/javascript; charset=utf-8";
  if (path.ends_with(".css")) return "text/css; charset=utf-8";
  if (path.ends_with(".svg")) return "image/svg+xml";
  return "application/octet-stream";
}

}  // namespace

bool is_page_path(const std::string& path) {
  if (path == "/") return true;
  for (const WebAsset& asset : kWebAssets)
    if (path == asset.path) return true;
  return false;
}

void add_page_routes(httplib::Server& server) {
  for (const WebAsset& asset : kWebAssets) {
    const std::string path = asset.path;
    const auto handler = [asset](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-cache");  // a new kiln serves its own page at once
      res.set_content(reinterpret_cast<const char*>(asset.bytes), asset.size, content_type(asset.path));
    };
    server.Get(path, handler);
    if (path == "/index.html") server.Get("/", handler);
  }
}

}  // namespace kiln::serve
