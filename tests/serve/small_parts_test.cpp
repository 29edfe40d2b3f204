// The small parts of kiln serve: base64 for b64_json and uploaded images, the API key check, loopback hosts,
// metrics text, and the watch that sees a client leave.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "cli/serve/api_key.h"
#include "cli/serve/base64.h"
#include "cli/serve/connection_watch.h"
#include "cli/serve/metrics.h"

namespace kiln::serve {
namespace {

TEST(Base64, EncodesTheVectorsOfRfc4648) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("foob"), "Zm9vYg==");
  EXPECT_EQ(base64_encode("fooba"), "Zm9vYmE=");
  EXPECT_EQ(base64_encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(base64_encode(std::string("\x89PNG\r\n\x1a\n\xff\x00", 10)), "iVBORw0KGgr/AA==");
}

TEST(Base64, DecodesWhatItEncodesPaddedOrNotAndNothingElse) {
  for (const std::string bytes : {"", "f", "fo", "foo", "foob", "fooba", "foobar"}) {
    EXPECT_EQ(base64_decode(base64_encode(bytes)), bytes);
    std::string unpadded = base64_encode(bytes);
    while (!unpadded.empty() && unpadded.back() == '=') unpadded.pop_back();
    EXPECT_EQ(base64_decode(unpadded), bytes) << unpadded;
  }
  std::string all(256, '\0');
  for (int i = 0; i < 256; ++i) all[static_cast<size_t>(i)] = static_cast<char>(i);
  EXPECT_EQ(base64_decode(base64_encode(all)), all);
  for (const char* bad : {"Z", "Zm9v Yg==", "Zm9vYg===", "Zm9v\nYmFy", "Zm9-", "Zg=a", "=Zg=", "@@@@"})
    EXPECT_EQ(base64_decode(bad), std::nullopt) << bad;
}

TEST(ApiKey, AcceptsOnlyTheBearerOfTheKey) {
  EXPECT_TRUE(bearer_matches("Bearer s3cret", "s3cret"));
  EXPECT_TRUE(bearer_matches("bearer s3cret", "s3cret"));   // the scheme is case-insensitive
  EXPECT_FALSE(bearer_matches("Bearer S3cret", "s3cret"));  // the key is not
  EXPECT_FALSE(bearer_matches("Bearer s3cre", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer s3crets", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer ", "s3cret"));
  EXPECT_FALSE(bearer_matches("", "s3cret"));
  EXPECT_FALSE(bearer_matches("Basic czNjcmV0", "s3cret"));
  EXPECT_FALSE(bearer_matches("s3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches(std::string("Bearer s3cret\0", 14), "s3cret"));
}

TEST(ApiKey, KnowsLoopbackHosts) {
  for (const char* host : {"127.0.0.1", "127.1.2.3", "::1", "localhost"})
    EXPECT_TRUE(is_loopback_host(host)) << host;
  for (const char* host : {"0.0.0.0", "::", "192.168.1.2", "10.0.0.1", "example.com", ""})
    EXPECT_FALSE(is_loopback_host(host)) << host;
}

TEST(Metrics, RendersCountersHistogramsAndGauges) {
  Metrics m;
  m.job_submitted();
  m.job_submitted();
  m.job_refused_queue_full();
  Job::Snapshot ok{.status = JobStatus::Succeeded, .images = 2, .queue_seconds = 0.02, .run_seconds = 0.7};
  m.job_ended(ok);
  m.job_ended({.status = JobStatus::Failed, .queue_seconds = 0.001, .run_seconds = 0.1});
  m.step(0.00390625);  // exact in binary, so that the sum prints exactly
  m.step(0.25);
  m.step(400);
  m.http_answer(200);
  m.http_answer(200);
  m.http_answer(500);
  m.http_answer(503);
  const std::string text = m.render({.queue_length = 3, .running = 1, .models = 2, .models_loaded = 1});
  for (const char* line :
       {"kiln_queue_length 3\n",
        "kiln_jobs_running 1\n",
        "kiln_models 2\n",
        "kiln_models_loaded 1\n",
        "kiln_jobs_submitted_total 2\n",
        "kiln_jobs_refused_total 1\n",
        "kiln_jobs_total{status=\"succeeded\"} 1\n",
        "kiln_jobs_total{status=\"failed\"} 1\n",
        "kiln_jobs_total{status=\"cancelled\"} 0\n",
        "kiln_images_total 2\n",
        "# TYPE kiln_step_seconds histogram\n",
        "kiln_step_seconds_bucket{le=\"0.005\"} 1\n",
        "kiln_step_seconds_bucket{le=\"0.5\"} 2\n",
        "kiln_step_seconds_bucket{le=\"300\"} 2\n",
        "kiln_step_seconds_bucket{le=\"+Inf\"} 3\n",
        "kiln_step_seconds_sum 400.25390625\n",
        "kiln_step_seconds_count 3\n",
        "kiln_queue_wait_seconds_count 2\n",
        "kiln_http_responses_total{code=\"200\"} 2\n",
        "kiln_http_responses_total{code=\"503\"} 1\n",
        "kiln_errors_total 2\n",  // the failed job and the 500; a full queue's 503 is no error
        "kiln_resident_memory_bytes "})
    EXPECT_NE(text.find(line), std::string::npos) << "no line " << line << " in\n" << text;
  EXPECT_GT(resident_memory_bytes(), 1 << 20);
}

// A listening socket on a free loopback port, a client connected to it, and the server's end.
struct LoopbackConnection {
  int listener = -1, client = -1, server = -1;
  int server_port = 0, client_port = 0;
  LoopbackConnection() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    EXPECT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(listen(listener, 1), 0);
    getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
    server_port = ntohs(addr.sin_port);
    client = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), len), 0);
    server = accept(listener, nullptr, nullptr);
    sockaddr_in mine{};
    len = sizeof mine;
    getsockname(client, reinterpret_cast<sockaddr*>(&mine), &len);
    client_port = ntohs(mine.sin_port);
  }
  ~LoopbackConnection() {
    for (int fd : {listener, client, server})
      if (fd >= 0) close(fd);
  }
};

TEST(ConnectionWatch, SeesTheClientLeave) {
  LoopbackConnection c;
  const ConnectionWatch watch("127.0.0.1", c.client_port, c.server_port);
  ASSERT_TRUE(watch.found());
  EXPECT_FALSE(watch.closed());
  ASSERT_EQ(write(c.client, "GET / HTTP/1.1\r\n", 16), 16);  // data from the client is no close
  EXPECT_FALSE(watch.closed());
  close(c.client);
  c.client = -1;
  bool closed = false;
  for (int i = 0; i < 100 && !closed; ++i) {
    closed = watch.closed();
    if (!closed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(closed);
}

TEST(ConnectionWatch, NeverCancelsForAConnectionItCannotFind) {
  LoopbackConnection c;
  const ConnectionWatch wrong_port("127.0.0.1", c.client_port + 1, c.server_port);
  EXPECT_FALSE(wrong_port.found());
  EXPECT_FALSE(wrong_port.closed());
  const ConnectionWatch wrong_host("127.0.0.2", c.client_port, c.server_port);
  EXPECT_FALSE(wrong_host.found());
}

}  // namespace
}  // namespace kiln::serve
