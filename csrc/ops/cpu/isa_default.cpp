// The baseline-ISA build of the CPU kernels (any x86-64 / other CPU).
#define CPU_CAPABILITY DEFAULT
#include "isa_kernels_impl.h"
