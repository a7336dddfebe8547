#include "asgd_loop.h"
PROTO_DEFINE_ISA(avx2)
