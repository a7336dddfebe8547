# Hints that let find_package(Torch) configure against a pip-installed torch
# wheel, CUDA builds included, without extra -D flags. Include it before
# find_package(Torch); it only sets what the user has not set.
#
#  - CUDA_TOOLKIT_ROOT_DIR: $CUDA_HOME, $CUDA_PATH or /usr/local/cuda (the
#    toolkit that holds nvcc); CMAKE_CUDA_COMPILER likewise.
#  - CUDA_nvrtc_LIBRARY: the wheel's own site-packages/nvidia/cu*/lib/
#    libnvrtc.so.* (or nvidia/cuda_nvrtc/lib), when the toolkit has none.

# Find the torch package directory: from Torch_DIR, or the prefixes given.
set(_torchext_torch_cfg "")
if(Torch_DIR AND EXISTS "${Torch_DIR}/TorchConfig.cmake")
  set(_torchext_torch_cfg "${Torch_DIR}")
else()
  set(_torchext_prefixes ${CMAKE_PREFIX_PATH} $ENV{CMAKE_PREFIX_PATH} ${TORCHEXT_EXTRA_TORCH_HINTS})
  foreach(_p IN LISTS _torchext_prefixes)
    foreach(_sub "Torch" "share/cmake/Torch" "torch/share/cmake/Torch")
      if(NOT _torchext_torch_cfg AND EXISTS "${_p}/${_sub}/TorchConfig.cmake")
        get_filename_component(_torchext_torch_cfg "${_p}/${_sub}" ABSOLUTE)
      endif()
    endforeach()
  endforeach()
endif()

if(_torchext_torch_cfg)
  # <site-packages>/torch/share/cmake/Torch -> <site-packages>/torch
  get_filename_component(_torchext_torch_root "${_torchext_torch_cfg}/../../.." ABSOLUTE)
  set(_torchext_cuda_build FALSE)
  if(EXISTS "${_torchext_torch_root}/lib/libtorch_cuda.so")
    set(_torchext_cuda_build TRUE)
  endif()
  if(_torchext_cuda_build)
    if(NOT CUDA_TOOLKIT_ROOT_DIR)
      foreach(_c "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}" "/usr/local/cuda")
        if(NOT CUDA_TOOLKIT_ROOT_DIR AND _c AND EXISTS "${_c}/bin/nvcc")
          set(CUDA_TOOLKIT_ROOT_DIR "${_c}" CACHE PATH "CUDA toolkit (set by torchext)")
        endif()
      endforeach()
    endif()
    if(CUDA_TOOLKIT_ROOT_DIR AND NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX}
       AND EXISTS "${CUDA_TOOLKIT_ROOT_DIR}/bin/nvcc")
      set(CMAKE_CUDA_COMPILER "${CUDA_TOOLKIT_ROOT_DIR}/bin/nvcc" CACHE FILEPATH "nvcc (set by torchext)")
    endif()
    if(NOT CUDA_nvrtc_LIBRARY)
      get_filename_component(_torchext_site "${_torchext_torch_root}/.." ABSOLUTE)
      file(GLOB _torchext_nvrtc
        "${CUDA_TOOLKIT_ROOT_DIR}/lib64/libnvrtc.so"
        "${_torchext_site}/nvidia/cu*/lib/libnvrtc.so*"
        "${_torchext_site}/nvidia/cuda_nvrtc/lib/libnvrtc.so*")
      list(FILTER _torchext_nvrtc EXCLUDE REGEX "nvrtc-builtins|nvrtc\\.alt")
      if(_torchext_nvrtc)
        list(GET _torchext_nvrtc 0 _torchext_nvrtc)
        set(CUDA_nvrtc_LIBRARY "${_torchext_nvrtc}" CACHE FILEPATH "libnvrtc (set by torchext)")
      endif()
    endif()
  endif()
endif()
unset(_torchext_prefixes)
