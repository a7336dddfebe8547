"""``python -m torchext info``: the build, and whether it covers this machine."""
import re

import torch


def parse_arch(entry):
    """'8.6', '9.0a', '9.0+PTX', '10.0f' -> (major, minor, suffix, ptx)."""
    m = re.fullmatch(r"(\d+)\.(\d+)([af]?)(\+PTX)?", entry.strip())
    if not m:
        return None
    return int(m[1]), int(m[2]), m[3], bool(m[4])


def arch_coverage(archs, capability):
    """How the built archs (TORCH_CUDA_ARCH_LIST entries) serve a GPU of
    compute capability (major, minor): (covered, explanation).

    CUDA's rules: a cubin for sm_XY runs on the same major X with minor >= Y
    (an arch-specific 'a' cubin only on exactly XY, an 'f' one on the family
    X); PTX for compute_XY is compiled by the driver for any GPU >= XY."""
    major, minor = capability
    parsed = [(a, parse_arch(a)) for a in archs]
    for entry, p in parsed:
        if p is None:
            continue
        ma, mi, suffix, _ = p
        exact = (ma, mi) == (major, minor)
        same_family = ma == major and mi <= minor
        if exact or (same_family and suffix != "a"):
            return True, f"covered by the {entry} build (native code)"
    for entry, p in parsed:
        if p and p[3] and (p[0], p[1]) <= (major, minor):
            return True, (f"covered by the {entry} PTX, compiled by the driver at first use "
                          f"(slower start; native code: rebuild with "
                          f"TORCH_CUDA_ARCH_LIST={major}.{minor})")
    return False, (f"NOT covered: rebuild for it with TORCH_CUDA_ARCH_LIST={major}.{minor} "
                   "pip install --no-build-isolation -e .")


def info_text():
    import torchext
    b = torchext.build_info
    lines = [
        f"torchext {b['version']}",
        f"  built against torch {b['torch_version']} (running {torch.__version__})",
        f"  CPU kernels: yes; ISA in use: {torchext.cpu_isa()} "
        "(picked at run time like ATen's; ATEN_CPU_CAPABILITY=avx2|default to lower it)",
    ]
    if b["cuda"]:
        lines.append(f"  CUDA kernels: yes, CUDA {b['cuda_version']}, archs "
                     f"{' '.join(b['cuda_archs'])}")
    else:
        lines.append("  CUDA kernels: no (CPU-only build)")
    if not torch.cuda.is_available():
        why = "torch is a CPU-only build" if torch.version.cuda is None else \
            "torch.cuda.is_available() is False"
        lines.append(f"GPU: none ({why})")
    else:
        for i in range(torch.cuda.device_count()):
            cc = torch.cuda.get_device_capability(i)
            head = f"GPU {i}: {torch.cuda.get_device_name(i)}, compute capability {cc[0]}.{cc[1]}"
            if not b["cuda"]:
                lines.append(f"{head}: NOT covered, no CUDA kernels built: rebuild with "
                             f"TORCHEXT_CUDA=1 TORCH_CUDA_ARCH_LIST={cc[0]}.{cc[1]} "
                             "pip install --no-build-isolation -e .")
            else:
                lines.append(f"{head}: {arch_coverage(b['cuda_archs'], cc)[1]}")
    lines += [
        f"library: {torchext.library_path}",
        f"cmake_prefix_path: {torchext.cmake_prefix_path}",
        "  (C++: cmake -DCMAKE_PREFIX_PATH=\"<that>;$(python -c 'import torch;"
        "print(torch.utils.cmake_prefix_path)')\", then find_package(torchext))",
    ]
    return "\n".join(lines)
