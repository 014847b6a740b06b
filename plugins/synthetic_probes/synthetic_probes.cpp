// The `synthetic_probes` data source: seeded network-latency measurement logs, the shape of data
// whose padding waste motivates packing. Document i of a split is a pure function of (seed, split,
// i), so reads are random-access and thread-safe, and no file is needed.
//
// A document is one probing session of a source host: a header row with the source host and its
// coordinates, then one row per probe: destination host, seconds since the session began, round-trip
// time in ms with one decimal. RTT = base + 2 * great-circle distance / (200 km/ms) * route factor
// + exponential jitter. The document is cut to a length drawn from a lognormal clipped to
// [min_length, max_length] (default: median 230, sigma 0.38: most documents 120-430 tokens, mean
// about 250, a thin tail to 1024).
//
// Vocabulary (16 + hosts tokens), and the text form prompts and samples use:
//   0-9 digits '0'-'9'   10 field separator ' '   11 end of row '\n'   12 decimal point '.'
//   13 minus sign '-'   14 header marker '#'   15 end of document "<eot>"   16+h host h "h<h>"
// A session reads "#h12 48 -3\nh40 17 63.5\nh7 25 88.1\n...".
#include <algorithm>
#include <cctype>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ablate/data.hpp"
#include "ablate/error.hpp"
#include "ablate/mix.hpp"
#include "ablate/plugin.hpp"

namespace {

constexpr int32_t kFieldSeparator = 10;
constexpr int32_t kEndOfRow = 11;
constexpr int32_t kDecimalPoint = 12;
constexpr int32_t kMinus = 13;
constexpr int32_t kHeader = 14;
constexpr int32_t kEndOfDocument = 15;
constexpr int32_t kFirstHost = 16;

constexpr double kPi = 3.14159265358979323846;
constexpr double kEarthRadiusKm = 6371.0;
constexpr double kFibreKmPerMs = 200.0;

// splitmix64: a small, fast, well-mixed generator; every document seeds its own.
class SplitMix {
 public:
  explicit SplitMix(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    const uint64_t z = ablate::splitmix64(state_);
    state_ += 0x9E3779B97F4A7C15ull;
    return z;
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  uint64_t below(uint64_t n) { return next() % n; }
  double normal() {  // Box-Muller (portable, unlike std::normal_distribution)
    const double u1 = 1.0 - uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
  }

 private:
  uint64_t state_;
};

uint64_t mix(uint64_t a, uint64_t b) { return ablate::splitmix64(a ^ (b * 0xD6E8FEB86659FD93ull)); }

struct Host {
  double lat_deg;
  double lon_deg;
  double base_ms;  // last-mile latency
};

void append_number(std::vector<int32_t>& out, int64_t value) {
  if (value < 0) {
    out.push_back(kMinus);
    value = -value;
  }
  char digits[24];
  int n = 0;
  do {
    digits[n++] = char(value % 10);
    value /= 10;
  } while (value > 0);
  while (n > 0) out.push_back(digits[--n]);
}

class SyntheticProbes final : public ablate::DataSource {
 public:
  explicit SyntheticProbes(const ablate::Params& own)
      : seed_(uint64_t(own.get_int("seed"))),
        train_docs_(uint64_t(own.get_int("documents"))),
        validation_docs_(uint64_t(own.get_int("validation_documents"))),
        median_(double(own.get_int("length_median"))),
        sigma_(own.get_float("length_sigma")),
        min_length_(int32_t(own.get_int("min_length"))),
        max_length_(int32_t(own.get_int("max_length"))) {
    if (min_length_ > max_length_) {
      ablate::throw_input_error(own.path(),
                                "min_length " + std::to_string(min_length_) + " is above max_length " + std::to_string(max_length_));
    }
    const auto hosts = std::size_t(own.get_int("hosts"));
    SplitMix g(mix(seed_, 0x486F737473ull));
    for (std::size_t h = 0; h < hosts; ++h) {
      // Uniform on the sphere between 60S and 70N, where measurement hosts are.
      const double lat =
          std::asin(std::sin(-60.0 * kPi / 180) + g.uniform() * (std::sin(70.0 * kPi / 180) - std::sin(-60.0 * kPi / 180)));
      hosts_.push_back({lat * 180 / kPi, -180.0 + 360.0 * g.uniform(), 0.5 + 4.5 * g.uniform()});
    }
  }

  int32_t vocab_size() const override { return kFirstHost + int32_t(hosts_.size()); }
  int32_t eot_token() const override { return kEndOfDocument; }
  uint64_t size(ablate::Split split) const override { return split == ablate::Split::train ? train_docs_ : validation_docs_; }

  void read(ablate::Split split, uint64_t doc, ablate::Document& out) const override {
    if (doc >= size(split)) {
      ablate::throw_runtime_error("synthetic_probes", "document " + std::to_string(doc) + " of the " + ablate::to_string(split) +
                                                          " split is out of range");
    }
    SplitMix g(mix(mix(seed_, split == ablate::Split::train ? 1 : 2), doc));
    const double drawn = median_ * std::exp(sigma_ * g.normal());
    const auto length = std::size_t(std::clamp(int64_t(std::llround(drawn)), int64_t(min_length_), int64_t(max_length_)));

    std::vector<int32_t>& t = out.tokens;
    t.clear();
    t.reserve(length + 32);
    const std::size_t source = g.below(hosts_.size());
    const Host& src = hosts_[source];
    t.push_back(kHeader);
    t.push_back(kFirstHost + int32_t(source));
    t.push_back(kFieldSeparator);
    append_number(t, std::lround(src.lat_deg));
    t.push_back(kFieldSeparator);
    append_number(t, std::lround(src.lon_deg));
    t.push_back(kEndOfRow);
    int64_t seconds = int64_t(g.below(60));
    while (t.size() < length) {
      std::size_t dest = g.below(hosts_.size() - 1);
      if (dest >= source) ++dest;  // never probe yourself
      const Host& dst = hosts_[dest];
      // Two draws, in this order (as operands of one expression their order would be the compiler's).
      const double path = 1.2 + 0.4 * g.uniform();
      const double queueing = -2.0 * std::log(1.0 - g.uniform());
      const double rtt = src.base_ms + dst.base_ms + 2.0 * distance_km(src, dst) / kFibreKmPerMs * path + queueing;
      t.push_back(kFirstHost + int32_t(dest));
      t.push_back(kFieldSeparator);
      append_number(t, seconds);
      t.push_back(kFieldSeparator);
      const int64_t tenths = std::llround(rtt * 10.0);
      append_number(t, tenths / 10);
      t.push_back(kDecimalPoint);
      t.push_back(int32_t(tenths % 10));
      t.push_back(kEndOfRow);
      seconds += 1 + int64_t(g.below(30));
    }
    t.resize(length);  // a capture that ended at its drawn length
    out.index = doc;
  }

  bool has_text() const override { return true; }
  std::string decode(const std::vector<int32_t>& tokens) const override {
    static const char kText[] = "0123456789 \n.-#";
    std::string out;
    for (int32_t t : tokens) {
      if (t >= 0 && t < kEndOfDocument) out += kText[t];
      else if (t == kEndOfDocument) out += "<eot>";
      else out += "h" + std::to_string(t - kFirstHost);
    }
    return out;
  }

  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> out;
    for (std::size_t i = 0; i < text.size();) {
      const char c = text[i];
      if (c >= '0' && c <= '9') out.push_back(c - '0');
      else if (c == ' ') out.push_back(kFieldSeparator);
      else if (c == '\n') out.push_back(kEndOfRow);
      else if (c == '.') out.push_back(kDecimalPoint);
      else if (c == '-') out.push_back(kMinus);
      else if (c == '#') out.push_back(kHeader);
      else if (text.compare(i, 5, "<eot>") == 0) {
        out.push_back(kEndOfDocument);
        i += 5;
        continue;
      } else if (c == 'h' && i + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[i + 1]))) {
        std::size_t j = i + 1;
        int64_t h = 0;
        while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j])) && h < 1000000) h = h * 10 + (text[j++] - '0');
        if (h >= int64_t(hosts_.size())) {
          ablate::throw_input_error("prompt", "host h" + std::to_string(h) + " does not exist (hosts h0..h" +
                                                  std::to_string(hosts_.size() - 1) + ")");
        }
        out.push_back(kFirstHost + int32_t(h));
        i = j;
        continue;
      } else {
        ablate::throw_input_error("prompt", std::string("character '") + c + "' at offset " + std::to_string(i) +
                                                " is not in the probe-log alphabet (digits, space, newline, . - # h<N> <eot>)");
      }
      ++i;
    }
    return out;
  }

  std::string describe() const override {
    return "synthetic_probes: " + std::to_string(train_docs_) + " train / " + std::to_string(validation_docs_) +
           " validation documents, " + std::to_string(hosts_.size()) + " hosts, vocab " + std::to_string(vocab_size());
  }

 private:
  static double distance_km(const Host& a, const Host& b) {
    const double la1 = a.lat_deg * kPi / 180, la2 = b.lat_deg * kPi / 180;
    const double dla = la2 - la1, dlo = (b.lon_deg - a.lon_deg) * kPi / 180;
    const double h = std::sin(dla / 2) * std::sin(dla / 2) + std::cos(la1) * std::cos(la2) * std::sin(dlo / 2) * std::sin(dlo / 2);
    return 2 * kEarthRadiusKm * std::asin(std::min(1.0, std::sqrt(h)));
  }

  uint64_t seed_;
  uint64_t train_docs_;
  uint64_t validation_docs_;
  double median_;
  double sigma_;
  int32_t min_length_;
  int32_t max_length_;
  std::vector<Host> hosts_;
};

void register_components(ablate::Registrar& r) {
  using namespace ablate::param;
  r.add({ablate::Kind::data_source,
         "synthetic_probes",
         "1.0.0",
         "seeded network-latency probe logs (hosts, coordinates, RTTs); no files, deterministic by (seed, index)",
         {
             integer("seed", 1234, "seed of the data set (independent of run.seed, which orders it)").at_least(0),
             integer("documents", 100000, "documents in the train split").within(1, 1e12),
             integer("validation_documents", 1000, "documents in the validation split").within(0, 1e12),
             integer("hosts", 64, "measurement hosts (vocabulary = 16 + hosts)").within(2, 65000),
             integer("length_median", 230, "median document length in tokens (lognormal)").within(1, 16777216),
             floating("length_sigma", 0.38, "sigma of the log of the document length").within(0.0, 3.0),
             integer("min_length", 16, "shortest document (lengths are clipped)").within(1, 16777216),
             integer("max_length", 1024, "longest document (lengths are clipped)").within(1, 16777216),
         },
         [](const ablate::ComponentArgs& args) { return std::make_unique<SyntheticProbes>(args.own); },
         "",
         {}});
}

}  // namespace

ABLATE_PLUGIN("synthetic_probes", "1.0.0", register_components)
