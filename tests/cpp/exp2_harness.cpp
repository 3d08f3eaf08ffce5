// Test harness for csrc/exp2_poly.cuh: evaluates fa4::exp2_poly<2..5> on given inputs so that
// tests/api/test_exp2_poly.py can compare with float64 exp2 and with the torch model, bit for bit.
//
//   exp2_harness IN OUT       IN: raw float32 values (native byte order); OUT: the results of
//                             degrees 2, 3, 4, 5 one after the other (4 x n float32)
//   exp2_harness -t X...      for each X (strtof syntax: 1.5, -0x1p-3, nan, -inf), one line:
//                             bits of X, then bits of the result of each degree, in hex
//
// Built with g++ (host code). Built with nvcc as CUDA (-x cu), it also has
//   exp2_harness -d IN OUT    the same as IN OUT, computed by a kernel on GPU 0
// which tests the device-only code path (the __fadd_rd floor) against the host one.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "exp2_poly.cuh"

namespace {

constexpr int kMinDegree = 2;
constexpr int kMaxDegree = 5;
constexpr int kNumDegrees = kMaxDegree - kMinDegree + 1;

uint32_t bits_of(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u;
}

// out[(d - kMinDegree) * n + i] = exp2_poly<d>(x[i]) for every degree d.
void eval_host(const std::vector<float>& x, std::vector<float>& out) {
  const size_t n = x.size();
  out.resize(kNumDegrees * n);
  for (size_t i = 0; i < n; ++i) {
    out[0 * n + i] = fa4::exp2_poly<2>(x[i]);
    out[1 * n + i] = fa4::exp2_poly<3>(x[i]);
    out[2 * n + i] = fa4::exp2_poly<4>(x[i]);
    out[3 * n + i] = fa4::exp2_poly<5>(x[i]);
  }
}

#ifdef __CUDACC__
template <int Degree>
__global__ void exp2_kernel(const float* x, float* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    out[i] = fa4::exp2_poly<Degree>(x[i]);
  }
}

bool cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

bool eval_device(const std::vector<float>& x, std::vector<float>& out) {
  const size_t n = x.size();
  out.resize(kNumDegrees * n);
  float* d_x = nullptr;
  float* d_out = nullptr;
  if (!cuda_ok(cudaMalloc(&d_x, n * sizeof(float)), "cudaMalloc") ||
      !cuda_ok(cudaMalloc(&d_out, out.size() * sizeof(float)), "cudaMalloc") ||
      !cuda_ok(cudaMemcpy(d_x, x.data(), n * sizeof(float), cudaMemcpyHostToDevice), "copy in")) {
    return false;
  }
  const int threads = 256;
  const int blocks = 1024;  // grid-stride loop: any n
  exp2_kernel<2><<<blocks, threads>>>(d_x, d_out + 0 * n, n);
  exp2_kernel<3><<<blocks, threads>>>(d_x, d_out + 1 * n, n);
  exp2_kernel<4><<<blocks, threads>>>(d_x, d_out + 2 * n, n);
  exp2_kernel<5><<<blocks, threads>>>(d_x, d_out + 3 * n, n);
  const bool ok =
      cuda_ok(cudaGetLastError(), "launch") &&
      cuda_ok(cudaMemcpy(out.data(), d_out, out.size() * sizeof(float), cudaMemcpyDeviceToHost),
              "copy out");
  cudaFree(d_x);
  cudaFree(d_out);
  return ok;
}
#endif

bool read_floats(const char* path, std::vector<float>& x) {
  FILE* f = std::fopen(path, "rb");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot open %s: %s\n", path, std::strerror(errno));
    return false;
  }
  float buf[4096];
  size_t got;
  while ((got = std::fread(buf, sizeof(float), 4096, f)) > 0) x.insert(x.end(), buf, buf + got);
  const bool ok = std::ferror(f) == 0;
  std::fclose(f);
  return ok;
}

bool write_floats(const char* path, const std::vector<float>& v) {
  FILE* f = std::fopen(path, "wb");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot open %s: %s\n", path, std::strerror(errno));
    return false;
  }
  const bool ok = std::fwrite(v.data(), sizeof(float), v.size(), f) == v.size();
  return std::fclose(f) == 0 && ok;
}

int usage() {
  std::fprintf(stderr, "usage: exp2_harness IN OUT | -t X... | -d IN OUT (CUDA build)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "-t") == 0) {
    std::vector<float> x;
    for (int a = 2; a < argc; ++a) {
      char* end = nullptr;
      x.push_back(std::strtof(argv[a], &end));
      if (end == argv[a] || *end != '\0') return usage();
    }
    std::vector<float> out;
    eval_host(x, out);
    for (size_t i = 0; i < x.size(); ++i) {
      std::printf("%08x", bits_of(x[i]));
      for (int d = 0; d < kNumDegrees; ++d) std::printf(" %08x", bits_of(out[d * x.size() + i]));
      std::printf("\n");
    }
    return 0;
  }
  const bool device = argc == 4 && std::strcmp(argv[1], "-d") == 0;
  if (argc != 3 && !device) return usage();
  const char* in_path = argv[argc - 2];
  const char* out_path = argv[argc - 1];
  std::vector<float> x;
  std::vector<float> out;
  if (!read_floats(in_path, x)) return 1;
  if (device) {
#ifdef __CUDACC__
    if (!eval_device(x, out)) return 1;
#else
    std::fprintf(stderr, "-d needs a CUDA build (nvcc -x cu)\n");
    return 2;
#endif
  } else {
    eval_host(x, out);
  }
  return write_floats(out_path, out) ? 0 : 1;
}
