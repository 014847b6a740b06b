// The example norm against references, in float64: its forward against the formula written out
// per element, and its backward (input and parameter gradients, overwrite and accumulate) against
// central finite differences of its own forward. Exit 0 when every check holds.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "scalenorm.hpp"

namespace {

using ablate::DType;
using ablate::flat_view;

struct Problem {
  int64_t rows, in;
  std::vector<double> x, g, dy;
};

// sum(dy * y) for the given x and g: the scalar whose gradient backward computes.
double objective(const Problem& p, const std::vector<double>& x, double g, double eps) {
  double total = 0.0;
  for (int64_t r = 0; r < p.rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < p.in; ++i) ss += x[r * p.in + i] * x[r * p.in + i];
    const double rinv = 1.0 / std::sqrt(ss / double(p.in) + eps);
    for (int64_t i = 0; i < p.in; ++i) total += p.dy[r * p.in + i] * g * x[r * p.in + i] * rinv;
  }
  return total;
}

int failures = 0;
void expect(bool ok, const char* what, double got, double want) {
  if (!ok) {
    std::printf("FAIL %s: got %.17g, want %.17g\n", what, got, want);
    ++failures;
  }
}

void check(int64_t rows, int64_t in, double eps, std::mt19937_64& rng) {
  std::normal_distribution<double> n01(0.0, 1.0);
  Problem p{rows, in, std::vector<double>(std::size_t(rows * in)), {1.3}, std::vector<double>(std::size_t(rows * in))};
  for (double& v : p.x) v = n01(rng);
  for (double& v : p.dy) v = n01(rng);
  ablate::LayerSpec spec;
  spec.in = in;
  spec.eps = eps;
  scalenorm::ScaleNorm layer;
  std::vector<double> y(p.x.size()), saved(static_cast<std::size_t>(rows));
  ablate::LayerCall call;
  call.spec = &spec;
  call.rows = rows;
  call.x = flat_view(p.x.data(), DType::f64, rows * in);
  call.y = flat_view(y.data(), DType::f64, rows * in);
  call.params = flat_view(p.g.data(), DType::f64, 1);
  call.saved = flat_view(saved.data(), DType::f64, rows);
  layer.forward(call);
  for (int64_t r = 0; r < rows; ++r) {  // the formula, element by element
    double ss = 0.0;
    for (int64_t i = 0; i < in; ++i) ss += p.x[r * in + i] * p.x[r * in + i];
    for (int64_t i = 0; i < in; ++i) {
      const double want = p.g[0] * p.x[r * in + i] / std::sqrt(ss / double(in) + eps);
      const double got = y[std::size_t(r * in + i)];
      expect(std::abs(got - want) <= 1e-14 * (1.0 + std::abs(want)), "forward", got, want);
    }
  }
  // Backward writing d_x (over 99s), parameter gradients added to 0.25.
  std::vector<double> dx(p.x.size(), 99.0), grads{0.25};
  call.d_y = flat_view(p.dy.data(), DType::f64, rows * in);
  call.d_x = flat_view(dx.data(), DType::f64, rows * in);
  call.grads = flat_view(grads.data(), DType::f64, 1);
  call.input_grad = ablate::GradMode::overwrite;
  layer.backward(call);
  const double h = 1e-6;
  for (std::size_t k = 0; k < p.x.size(); ++k) {
    std::vector<double> xp = p.x, xm = p.x;
    xp[k] += h;
    xm[k] -= h;
    const double fd = (objective(p, xp, p.g[0], eps) - objective(p, xm, p.g[0], eps)) / (2 * h);
    expect(std::abs(dx[k] - fd) <= 1e-7 * (1.0 + std::abs(fd)), "d_x", dx[k], fd);
  }
  const double fd_g = (objective(p, p.x, p.g[0] + h, eps) - objective(p, p.x, p.g[0] - h, eps)) / (2 * h);
  const double dg = grads[0] - 0.25;
  expect(std::abs(dg - fd_g) <= 1e-7 * (1.0 + std::abs(fd_g)), "d_g", dg, fd_g);
  // GradMode::accumulate adds the same values to what d_x holds (0.5 here).
  std::vector<double> dx_acc(p.x.size(), 0.5);
  call.d_x = flat_view(dx_acc.data(), DType::f64, rows * in);
  call.input_grad = ablate::GradMode::accumulate;
  layer.backward(call);
  for (std::size_t k = 0; k < dx.size(); ++k) expect(dx_acc[k] == 0.5 + dx[k], "d_x accumulated", dx_acc[k], 0.5 + dx[k]);
}

}  // namespace

int main() {
  std::mt19937_64 rng(11);
  check(1, 1, 1e-6, rng);
  check(3, 7, 1e-5, rng);
  check(5, 64, 1e-6, rng);
  if (failures == 0) std::printf("scalenorm: forward and gradients match the references\n");
  return failures == 0 ? 0 : 1;
}
