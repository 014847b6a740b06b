// cub::DeviceRadixSort for kernels compiled by the interpreter: a stable sort on the host with
// cub's key order (the key's bits [begin_bit, end_bit) after cub's twiddle: a signed integer's
// sign bit flipped, so negative keys come first), the values carried along. The size query
// (temp storage null) asks for one byte, as a real query never answers zero. On a capturing stream
// the sort is recorded into the graph.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <type_traits>
#include <vector>

namespace cub {

struct DeviceRadixSort {
  template <class K, class V>
  static cudaError_t SortPairs(void* temp, std::size_t& temp_bytes, const K* keys_in, K* keys_out, const V* values_in, V* values_out,
                               int n, int begin_bit = 0, int end_bit = int(sizeof(K) * 8), cudaStream_t stream = nullptr) {
    static_assert(std::is_integral_v<K>, "the interpreter's radix sort takes integer keys");
    if (temp == nullptr) {
      temp_bytes = 1;
      return cudaSuccess;
    }
    if (n < 0 || begin_bit < 0 || end_bit > int(sizeof(K) * 8) || begin_bit >= end_bit) return cudaErrorInvalidValue;
    const auto sort = [=] {
      const ablate::emu::DeviceAccess access;  // the sort reads and writes device memory
      using U = std::make_unsigned_t<K>;
      const U flip = std::is_signed_v<K> ? U(U(1) << (sizeof(K) * 8 - 1)) : U(0);
      const int width = end_bit - begin_bit;
      const U mask = width >= int(sizeof(K) * 8) ? U(~U(0)) : U((U(1) << width) - 1);
      auto digit = [&](K key) { return U(U(U(key) ^ flip) >> begin_bit) & mask; };
      std::vector<int> order(static_cast<std::size_t>(n));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return digit(keys_in[a]) < digit(keys_in[b]); });
      std::vector<K> k(static_cast<std::size_t>(n));
      std::vector<V> v(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) {
        k[std::size_t(i)] = keys_in[order[std::size_t(i)]];
        v[std::size_t(i)] = values_in[order[std::size_t(i)]];
      }
      std::copy(k.begin(), k.end(), keys_out);
      std::copy(v.begin(), v.end(), values_out);
      ablate::emu::check_device_allocations("cub::DeviceRadixSort::SortPairs");
    };
    // On a capturing stream the sort is a node of the graph (cub's kernels are captured), run when
    // the graph runs.
    if (ablate::emu::detail::capturing(stream)) {
      ablate::emu::detail::capture_work(stream, sort);
      return cudaSuccess;
    }
    sort();
    return cudaSuccess;
  }
};

}  // namespace cub
