// The engine's CUDA kernels compiled as C++ for the CPU emulation of the
// CUDA execution model (emulation.h), for the tests that run them on
// machines without a GPU.
#include "backend/cuda/emulation/emulation.h"
// (after it: the kernels' files use what it defines)
#include "backend/cuda/attention.cu"
