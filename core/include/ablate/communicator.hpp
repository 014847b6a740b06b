// Communicator interface: collectives over the ranks of a data-parallel job. Buffers live on the
// device the communicator serves (host for `single` and `mpi`, GPU for `nccl`).
#pragma once

#include <cstdint>

#include "ablate/component.hpp"
#include "ablate/tensor.hpp"

namespace ablate {

enum class ReduceOp { sum, max };

class Communicator : public Component {
 public:
  ~Communicator() override;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual int local_rank() const = 0;
  virtual void all_reduce(TensorView buffer, ReduceOp op) = 0;
  virtual void broadcast(TensorView buffer, int root) = 0;
  virtual void barrier() = 0;
};

}  // namespace ablate
