// A small HTTP/1.1 client for the sinks that send a run to a server (mlflow): plain http, one
// kept-alive connection, and every step of a request (resolving the host, connecting, sending,
// reading the answer) bounded by a timeout, so an unreachable server costs seconds, not a hang.
#pragma once

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ablate::loggers {

// An http:// address: "http://host[:port][/path]".
struct HttpUrl {
  std::string host;    // an IPv6 address without its brackets
  std::string port;    // "80" when the address names none
  std::string prefix;  // the path without a trailing '/': "" for the server's root, "/mlflow" behind a proxy
  std::string text;    // the address as given, without a trailing '/'
};

// The address, or nullopt with `why` saying what is wrong with it (https, another scheme, a query,
// user information, a bad port).
std::optional<HttpUrl> parse_http_url(std::string_view uri, std::string& why);

// The server could not be reached or did not answer in time; what() says which.
class HttpTransportError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct HttpResponse {
  int status = 0;
  std::string body;
};

class HttpClient {
 public:
  HttpClient(HttpUrl url, double timeout_s);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Sends `method` (GET, POST, PUT) to the url's prefix + `target` and returns the answer, whatever
  // its status. A connection the server closed while it was idle is reopened once. Throws
  // HttpTransportError when the server cannot be reached or does not answer within the timeout.
  HttpResponse request(std::string_view method, const std::string& target, const std::string& body = "",
                       std::string_view content_type = "application/json");

  const HttpUrl& url() const noexcept;
  double timeout_s() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Percent-encodes everything but letters, digits and "-._~" (and '/' when `keep_slash`): a query
// value, or a path whose segments are kept.
std::string url_encode(std::string_view text, bool keep_slash);

}  // namespace ablate::loggers
