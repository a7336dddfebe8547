// Keeps the library loadable on glibc 2.28, the oldest glibc torch's own
// wheels support (manylinux_2_28), though it is built against a newer one.
// Only three symbols of this machine's glibc are newer than 2.28 (checked by
// tests/package/test_wheel.py and scripts/build_wheels.sh):
//
// - pow@GLIBC_2.29: glibc 2.29 gave pow (with exp, log...) a new symbol
//   version, dropping the SVID error wrapper; the results are the same
//   function's. setup.py links with -Wl,--wrap=pow, so every call lands in
//   __wrap_pow below, which calls the 2.2.5 version.
// - hypot@GLIBC_2.35 (tensor_norms' complex magnitudes): the same story in
//   glibc 2.35, the same fix (-Wl,--wrap=hypot, __wrap_hypot).
// - __libc_single_threaded (2.32): libstdc++'s headers read it to skip
//   atomics while a process has one thread. A definition of our own, always
//   0 ("threads may exist"), makes them always use atomics: correct, and
//   nothing to resolve in glibc.
#if defined(__linux__)
#include <features.h>  // defines __GLIBC__
#endif
#if defined(__x86_64__) && defined(__GLIBC__)

extern "C" {

double torchext_pow_glibc_2_2_5(double x, double y);
__asm__(".symver torchext_pow_glibc_2_2_5,pow@GLIBC_2.2.5");

__attribute__((visibility("hidden"))) double __wrap_pow(double x, double y) {
  return torchext_pow_glibc_2_2_5(x, y);
}

double torchext_hypot_glibc_2_2_5(double x, double y);
__asm__(".symver torchext_hypot_glibc_2_2_5,hypot@GLIBC_2.2.5");

__attribute__((visibility("hidden"))) double __wrap_hypot(double x, double y) {
  return torchext_hypot_glibc_2_2_5(x, y);
}

__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;

}  // extern "C"

#endif
