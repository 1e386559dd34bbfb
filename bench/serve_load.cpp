// The load generator of tools/serve_bench.py in C++: C clients over loopback, each sending its streamed
// requests one after another, recording when each token's server-sent event arrives.
//
//   loom_bench_serve_load HOST PORT BODIES CLIENTS REQUESTS_PER_CLIENT
//
// BODIES: a file of CLIENTS * REQUESTS_PER_CLIENT lines, each a JSON body for POST /v1/completions; client
// k sends lines k * REQUESTS_PER_CLIENT .. (k + 1) * REQUESTS_PER_CLIENT - 1 in order, a new connection
// each. Prints one JSON line for the level, {"wall_s", "cpu_s"} (cpu_s: this process's user + system CPU
// time), then one per request, {"client", "start", "times", "done"}: seconds since the level began, `times`
// the arrival of each event whose choice has no finish_reason yet (one a token, for loom's server and
// llama.cpp's alike, while the client keeps up; loom's last may carry only text it held back, a character
// split across tokens, which a model's English replies hardly end on), `done` whether the stream ended with
// data: [DONE]. The script computes the statistics; this program only sends and times.
//
// Why not Python: the servers and the clients share the machine's cores, and Python's clients (a thread
// each, urllib, json.loads per event) took about 45 µs of CPU a token, ~7% of one core at 16 clients on
// 2 cores, time the servers then lacked; these take a few µs (one recv and a scan a token).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "loom_bench_serve_load: %s\n", why.c_str());
  std::exit(1);
}

struct Request {
  int client = 0;
  double start = 0;
  std::vector<double> times;
  bool done = false;  // its stream ended with data: [DONE]
};

// The HTTP response's body as it arrives: the status line and headers first, then either a chunked body
// (decoded here) or a plain one; each decoded byte goes to `on_body`.
class ResponseReader {
 public:
  template <class OnBody>
  void feed(const char* p, size_t n, OnBody&& on_body) {
    if (!headers_done_) {
      head_.append(p, n);
      const size_t end = head_.find("\r\n\r\n");
      if (end == std::string::npos) return;
      headers_done_ = true;
      status_line_ = head_.substr(0, head_.find("\r\n"));
      ok_ = status_line_.compare(0, 12, "HTTP/1.1 200") == 0 || status_line_.compare(0, 12, "HTTP/1.0 200") == 0;
      std::string lower = head_.substr(0, end);
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      chunked_ = lower.find("transfer-encoding: chunked") != std::string::npos;
      const std::string rest = head_.substr(end + 4);
      head_.clear();
      body(rest.data(), rest.size(), on_body);
      return;
    }
    body(p, n, on_body);
  }

  // Whether the status line said 200 (once the headers are in), and the line itself.
  bool ok() const { return ok_; }
  const std::string& status_line() const { return status_line_; }

 private:
  template <class OnBody>
  void body(const char* p, size_t n, OnBody&& on_body) {
    if (!chunked_) {
      on_body(p, n);
      return;
    }
    for (size_t i = 0; i < n;) {
      if (left_ > 0) {  // inside a chunk's data
        const size_t take = std::min(left_, n - i);
        on_body(p + i, take);
        i += take;
        left_ -= take;
        if (left_ == 0) skip_crlf_ = 2;
      } else if (skip_crlf_ > 0) {
        --skip_crlf_;
        ++i;
      } else {  // a chunk-size line
        size_line_ += p[i++];
        if (size_line_.size() >= 2 && size_line_.compare(size_line_.size() - 2, 2, "\r\n") == 0) {
          left_ = std::strtoul(size_line_.c_str(), nullptr, 16);
          size_line_.clear();
          if (left_ == 0) skip_crlf_ = 2;  // the last chunk
        }
      }
    }
  }

  bool headers_done_ = false, chunked_ = false, ok_ = false;
  std::string head_, size_line_, status_line_;
  size_t left_ = 0;
  int skip_crlf_ = 0;
};

// Whether an event's JSON has a choice still open: "finish_reason" followed by null.
bool token_event(const std::string& event) {
  if (event.compare(0, 6, "data: ") != 0 || event.compare(6, 6, "[DONE]") == 0) return false;
  const size_t at = event.find("\"finish_reason\"");
  if (at == std::string::npos) return false;
  size_t i = at + 15;
  while (i < event.size() && (event[i] == ' ' || event[i] == ':')) ++i;
  return event.compare(i, 4, "null") == 0;
}

void one_request(const sockaddr_in& addr, const std::string& host_header, const std::string& body, Clock::time_point t0,
                 Request& out) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) fail(std::string("socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  out.start = std::chrono::duration<double>(Clock::now() - t0).count();
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    fail(std::string("connect to ") + host_header + ": " + std::strerror(errno));
  }
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: " + host_header +
                              "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) fail(std::string("send: ") + std::strerror(errno));
    sent += static_cast<size_t>(n);
  }
  ResponseReader reader;
  std::string events;  // decoded body not yet split into events
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0) fail(std::string("recv: ") + std::strerror(errno));
    if (n == 0) break;
    const double now = std::chrono::duration<double>(Clock::now() - t0).count();
    reader.feed(buffer, static_cast<size_t>(n), [&](const char* p, size_t len) { events.append(p, len); });
    if (!reader.ok()) continue;  // an error's body, read to the end (the server closes) and named below
    size_t from = 0;
    for (size_t end; (end = events.find("\n\n", from)) != std::string::npos; from = end + 2) {
      const std::string event = events.substr(from, end - from);
      if (token_event(event)) out.times.push_back(now);
      if (event == "data: [DONE]") out.done = true;
    }
    events.erase(0, from);
  }
  ::close(fd);
  if (!reader.ok()) {
    fail("the server answered " + (reader.status_line().empty() ? std::string("no status line") : reader.status_line()) +
         ": " + events.substr(0, 300));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) fail("usage: loom_bench_serve_load HOST PORT BODIES CLIENTS REQUESTS_PER_CLIENT");
  const std::string host = argv[1];
  const int port = std::atoi(argv[2]);
  const int clients = std::atoi(argv[4]), per_client = std::atoi(argv[5]);
  if (port <= 0 || port > 65535) fail(std::string("PORT ") + argv[2] + " is not a port number");
  if (clients < 1 || clients > 4096) fail(std::string("CLIENTS ") + argv[4] + " must be in [1, 4096]");
  if (per_client < 1) fail(std::string("REQUESTS_PER_CLIENT ") + argv[5] + " must be at least 1");
  std::ifstream file(argv[3]);
  if (!file) fail(std::string("cannot read BODIES ") + argv[3]);
  std::vector<std::string> bodies;
  for (std::string line; std::getline(file, line);) {
    if (!line.empty()) bodies.push_back(line);
  }
  if (bodies.size() != static_cast<size_t>(clients) * static_cast<size_t>(per_client)) {
    fail(std::string("BODIES ") + argv[3] + " has " + std::to_string(bodies.size()) + " lines, expected " +
         std::to_string(clients * per_client) + " (CLIENTS x REQUESTS_PER_CLIENT)");
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) fail("HOST " + host + " is not an IPv4 address");
  const std::string host_header = host + ":" + std::to_string(port);

  std::vector<Request> requests(bodies.size());
  const Clock::time_point t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int k = 0; k < clients; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < per_client; ++i) {
        Request& r = requests[static_cast<size_t>(k * per_client + i)];
        r.client = k;
        one_request(addr, host_header, bodies[static_cast<size_t>(k * per_client + i)], t0, r);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const double cpu = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                     1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
  std::printf("{\"wall_s\": %.6f, \"cpu_s\": %.6f}\n", wall, cpu);
  for (const Request& r : requests) {
    std::printf("{\"client\": %d, \"start\": %.6f, \"times\": [", r.client, r.start);
    for (size_t i = 0; i < r.times.size(); ++i) std::printf(i ? ", %.6f" : "%.6f", r.times[i]);
    std::printf("], \"done\": %s}\n", r.done ? "true" : "false");
  }
  return 0;
}
