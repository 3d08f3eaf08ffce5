// Evaluates the kernels' softcap_tanh (csrc/common/softmax.cuh, Note [softcap tanh]) and plain
// tanhf on the GPU, for tests/gpu/test_softcap_tanh.py: reads n float32 from argv[1], writes 2n
// float32 to argv[2] (softcap_tanh of each, then tanhf of each). Built with the kernels'
// --use_fast_math. tests/sass/test_sass_softcap_tanh.py reads its SASS.
#include <cstdio>
#include <vector>

#include "common/softmax.cuh"

__global__ void eval(const float* x, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    out[i] = fa4::softcap_tanh(x[i]);
    out[n + i] = tanhf(x[i]);
  }
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* in = std::fopen(argv[1], "rb");
  if (in == nullptr) return 2;
  std::vector<float> x;
  float v;
  while (std::fread(&v, sizeof v, 1, in) == 1) x.push_back(v);
  std::fclose(in);
  const int n = int(x.size());
  float *dx = nullptr, *dout = nullptr;
  if (cudaMalloc(&dx, n * sizeof(float)) != cudaSuccess) return 3;
  if (cudaMalloc(&dout, 2 * n * sizeof(float)) != cudaSuccess) return 3;
  cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  eval<<<(n + 255) / 256, 256>>>(dx, dout, n);
  std::vector<float> out(2 * n);
  if (cudaMemcpy(out.data(), dout, 2 * n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
    return 4;
  }
  FILE* o = std::fopen(argv[2], "wb");
  if (o == nullptr) return 2;
  std::fwrite(out.data(), sizeof(float), out.size(), o);
  std::fclose(o);
  return 0;
}
