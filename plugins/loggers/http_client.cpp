// The sinks' HTTP client (see http_client.hpp), on Boost.Beast: asynchronous operations on a
// tcp_stream whose expiry bounds each one, run to completion on the client's own io_context.
#include "http_client.hpp"

#include <cctype>
#include <chrono>
#include <cmath>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "ablate/version.hpp"

namespace ablate::loggers {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

constexpr std::uint64_t kMaxResponseBytes = std::uint64_t(64) << 20;

bool starts_with_nocase(std::string_view text, std::string_view prefix) {
  if (text.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(text[i])) != prefix[i]) return false;
  }
  return true;
}

bool all_digits(std::string_view s) {
  if (s.empty() || s.size() > 5) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

std::optional<HttpUrl> parse_http_url(std::string_view uri, std::string& why) {
  if (starts_with_nocase(uri, "https://")) {
    why = "https is not supported (this logger speaks plain HTTP, without TLS): give the server's http:// address, or "
          "reach an https server through a local tunnel or proxy that listens on http";
    return std::nullopt;
  }
  if (!starts_with_nocase(uri, "http://")) {
    why = "is not an http:// address";
    return std::nullopt;
  }
  const std::string_view rest = uri.substr(7);
  if (rest.find_first_of("?#") != std::string_view::npos) {
    why = "has a query or fragment; give the server's address only (http://host:port, or http://host:port/path)";
    return std::nullopt;
  }
  if (rest.find_first_of(" \t\r\n") != std::string_view::npos) {
    why = "contains white space";
    return std::nullopt;
  }
  const std::size_t slash = rest.find('/');
  const std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  if (authority.find('@') != std::string_view::npos) {
    why = "carries user information (user@host), which is not supported";
    return std::nullopt;
  }
  HttpUrl url;
  std::string_view port;
  bool port_given = false;
  if (!authority.empty() && authority.front() == '[') {
    const std::size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      why = "has an IPv6 address without its closing ']'";
      return std::nullopt;
    }
    url.host = std::string(authority.substr(1, close - 1));
    const std::string_view after = authority.substr(close + 1);
    if (!after.empty() && after.front() != ':') {
      why = "has text after the IPv6 address that is not a port";
      return std::nullopt;
    }
    if (!after.empty()) {
      port = after.substr(1);
      port_given = true;
    }
  } else {
    const std::size_t colon = authority.find(':');
    url.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = authority.substr(colon + 1);
      port_given = true;
    }
  }
  if (url.host.empty()) {
    why = "names no host";
    return std::nullopt;
  }
  if (port_given && port.empty()) {
    why = "has an empty port";
    return std::nullopt;
  }
  if (!port.empty() && (!all_digits(port) || std::stoi(std::string(port)) < 1 || std::stoi(std::string(port)) > 65535)) {
    why = "has a port that is not a number in [1, 65535]";
    return std::nullopt;
  }
  url.port = port.empty() ? "80" : std::string(port);
  url.prefix = std::string(path);
  url.text = "http://" + std::string(authority) + url.prefix;
  return url;
}

std::string url_encode(std::string_view text, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/')) {
      out += c;
    } else {
      out += '%';
      out += hex[u >> 4];
      out += hex[u & 15];
    }
  }
  return out;
}

struct HttpClient::Impl {
  HttpUrl url;
  double timeout_s = 10;
  std::chrono::milliseconds timeout{10000};
  asio::io_context ioc;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;

  void run() {
    ioc.restart();
    ioc.run();
  }

  std::string describe(const char* what, const error_code& ec) const {
    if (ec == beast::error::timeout) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", timeout_s);
      return std::string(what) + ": no answer within " + buf + " s";
    }
    return std::string(what) + ": " + ec.message();
  }

  void close() {
    if (stream) {
      error_code ignored;
      stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
      stream->socket().close(ignored);
    }
    stream.reset();
    buffer.clear();
  }

  void connect() {
    tcp::resolver resolver(ioc);
    error_code ec;
    const tcp::resolver::results_type endpoints = resolver.resolve(url.host, url.port, ec);
    if (ec) throw HttpTransportError("cannot resolve the host '" + url.host + "': " + ec.message());
    stream.emplace(ioc);
    stream->expires_after(timeout);
    stream->async_connect(endpoints, [&](const error_code& e, const tcp::endpoint&) { ec = e; });
    run();
    if (ec) {
      close();
      throw HttpTransportError(describe("cannot connect", ec));
    }
    buffer.clear();
  }

  HttpResponse exchange(http::request<http::string_body>& req) {
    for (int attempt = 0;; ++attempt) {
      const bool reused = stream.has_value();
      if (!reused) connect();
      error_code ec;
      stream->expires_after(timeout);
      http::async_write(*stream, req, [&](const error_code& e, std::size_t) { ec = e; });
      run();
      http::response_parser<http::string_body> parser;
      parser.body_limit(kMaxResponseBytes);
      if (!ec) {
        stream->expires_after(timeout);
        http::async_read(*stream, buffer, parser, [&](const error_code& e, std::size_t) { ec = e; });
        run();
      }
      if (ec) {
        close();
        // A kept-alive connection the server closed while idle fails before any answer: once more.
        if (reused && attempt == 0 && !parser.got_some() && ec != beast::error::timeout) continue;
        throw HttpTransportError(describe("request failed", ec));
      }
      http::response<http::string_body> res = parser.release();
      HttpResponse out{int(res.result_int()), std::move(res.body())};
      if (!res.keep_alive()) close();
      return out;
    }
  }
};

HttpClient::HttpClient(HttpUrl url, double timeout_s) : impl_(std::make_unique<Impl>()) {
  impl_->url = std::move(url);
  impl_->timeout_s = timeout_s;
  impl_->timeout = std::chrono::milliseconds(int64_t(std::ceil(timeout_s * 1000)));
}

HttpClient::~HttpClient() { impl_->close(); }

const HttpUrl& HttpClient::url() const noexcept { return impl_->url; }
double HttpClient::timeout_s() const noexcept { return impl_->timeout_s; }

HttpResponse HttpClient::request(std::string_view method, const std::string& target, const std::string& body,
                                 std::string_view content_type) {
  const http::verb verb = http::string_to_verb(beast::string_view(method.data(), method.size()));
  http::request<http::string_body> req{verb, impl_->url.prefix + target, 11};
  const bool v6 = impl_->url.host.find(':') != std::string::npos;
  req.set(http::field::host, (v6 ? "[" + impl_->url.host + "]" : impl_->url.host) + ":" + impl_->url.port);
  req.set(http::field::user_agent, std::string("ablate/") + ABLATE_VERSION_STRING);
  req.set(http::field::accept, "application/json");
  if (verb != http::verb::get) {
    req.set(http::field::content_type, beast::string_view(content_type.data(), content_type.size()));
    req.body() = body;
  }
  req.keep_alive(true);
  req.prepare_payload();
  return impl_->exchange(req);
}

}  // namespace ablate::loggers
