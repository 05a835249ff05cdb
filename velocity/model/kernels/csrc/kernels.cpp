// The CPU kernels' one translation unit (velocity/model/kernels/cpu_kernels.py builds it): each kernel's
// file in turn, and their Python bindings. wrap_pybind_function: a failed TORCH_CHECK is a
// RuntimeError with its message.
#include "sort_rows.cpp"
#include "paged_decode.cpp"
#include "layer_rows.cpp"
#include "int8_gemm.cpp"
#include "f32_gemm.cpp"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("sort_rows", torch::wrap_pybind_function(sort_rows));
  m.def("built_with_openmp", torch::wrap_pybind_function(built_with_openmp));
  m.def("paged_decode", torch::wrap_pybind_function(paged_decode));
  m.def("add_norm_scale", torch::wrap_pybind_function(add_norm_scale));
  m.def("rope_attend_scale", torch::wrap_pybind_function(rope_attend_scale));
  m.def("silu_mul_scale", torch::wrap_pybind_function(silu_mul_scale));
  m.def("int8_gemm_bits", torch::wrap_pybind_function(int8_gemm_bits));
  m.def("int8_pack", torch::wrap_pybind_function(int8_pack));
  m.def("int8_gemm", torch::wrap_pybind_function(int8_gemm));
  m.def("int8_gemm_amx", torch::wrap_pybind_function(int8_gemm_amx));
  m.def("int8_linear", torch::wrap_pybind_function(int8_linear));
  m.def("f32_gemm_lanes", torch::wrap_pybind_function(f32_gemm_lanes));
  m.def("f32_gemm", torch::wrap_pybind_function(f32_gemm));
}
