// Helpers shared by the C++ tests: reference files written by
// make_reference.py (TORCHEXT_REF_DIR), and tolerant comparisons.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torchext/optim/asgd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

namespace torchext_test {

// A reference entry's key with its index ("p" 3 -> "p3").
inline std::string idx(const std::string& key, size_t i) { return key + std::to_string(i); }

// A C++ ASGD's state of `p`, and its group g's options.
inline const torchext::optim::ASGDParamState& state_of(const torchext::optim::ASGD& opt,
                                                       const torch::Tensor& p) {
  return static_cast<const torchext::optim::ASGDParamState&>(
      *opt.state().at(p.unsafeGetTensorImpl()));
}
inline const torchext::optim::ASGDOptions& options_of(const torchext::optim::ASGD& opt,
                                                      size_t g) {
  return static_cast<const torchext::optim::ASGDOptions&>(opt.param_groups()[g].options());
}

inline std::string ref_dir() {
  const char* d = std::getenv("TORCHEXT_REF_DIR");
  return d != nullptr ? std::string(d) : std::string(TORCHEXT_DEFAULT_REF_DIR);
}

inline std::string ref_path(const std::string& name) { return ref_dir() + "/" + name; }

inline bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

// A torch.save'd dict[str, Tensor], read through torch::pickle_load.
inline std::map<std::string, torch::Tensor> load_ref(const std::string& name) {
  const std::string path = ref_path(name);
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in.good(), "missing reference file ", path,
              " (run cpp_tests/make_reference.py, or scripts/cpp_tests.sh)");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto dict = torch::pickle_load(bytes).toGenericDict();
  std::map<std::string, torch::Tensor> out;
  for (const auto& kv : dict) out[kv.key().toStringRef()] = kv.value().toTensor();
  return out;
}

inline const torch::Tensor& R(const std::map<std::string, torch::Tensor>& m,
                               const std::string& key) {
  auto it = m.find(key);
  TORCH_CHECK(it != m.end(), "reference has no key '", key, "'");
  return it->second;
}

// fp32 after 100+ steps: ~1e-6 relative.
inline ::testing::AssertionResult close(const torch::Tensor& got, const torch::Tensor& want,
                                        double rtol = 1e-6, double atol = 1e-7) {
  if (got.sizes() != want.sizes()) {
    return ::testing::AssertionFailure() << "shape " << got.sizes() << " != " << want.sizes();
  }
  const auto g = got.detach().to(torch::kCPU, torch::kDouble);
  const auto w = want.detach().to(torch::kCPU, torch::kDouble);
  const auto err = (g - w).abs();
  const auto bound = atol + rtol * w.abs();
  if (((err <= bound) | (g == w)).all().item<bool>()) return ::testing::AssertionSuccess();  // inf == inf
  return ::testing::AssertionFailure()
         << "max abs err " << err.max().item<double>() << ", max rel err "
         << (err / w.abs().clamp_min(1e-30)).max().item<double>() << "\n got " << g.flatten()
         << "\n want " << w.flatten();
}

}  // namespace torchext_test

// Expects `stmt` to throw c10::Error whose message contains `substr`.
#define EXPECT_THROW_MSG(stmt, substr)                                              \
  do {                                                                              \
    try {                                                                           \
      stmt;                                                                         \
      ADD_FAILURE() << "no exception from " #stmt;                                  \
    } catch (const c10::Error& e) {                                                 \
      EXPECT_NE(std::string(e.what_without_backtrace()).find(substr), std::string::npos) \
          << e.what_without_backtrace();                                            \
    }                                                                               \
  } while (0)
