# torchext's CMake config as shipped in the Python package: an IMPORTED
# target on the very library Python loads (torchext/_C*.so), so C++ code
# built against it shares the binary (and the ops) with `import torchext`.
#
#   cmake -DCMAKE_PREFIX_PATH="$(python -c 'import torchext;print(torchext.cmake_prefix_path)');$(python -c 'import torch;print(torch.utils.cmake_prefix_path)')" ...
#   find_package(torchext REQUIRED)
#   target_link_libraries(app PRIVATE torchext::torchext)
#
# Layout: <pkg>/share/cmake/torchext/ (this file), <pkg>/_C*.so,
# <pkg>/include/torchext/*.h (a wheel) or <pkg>/../csrc/include (a source
# tree built in place with `pip install -e .`).
if(TARGET torchext::torchext)
  return()
endif()
get_filename_component(_torchext_pkg "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)

include(CMakeFindDependencyMacro)
if(NOT TARGET torch)
  # A pip install puts torch next to torchext in site-packages.
  set(TORCHEXT_EXTRA_TORCH_HINTS "${_torchext_pkg}/../torch/share/cmake")
  include("${CMAKE_CURRENT_LIST_DIR}/torchextTorchHints.cmake")
  if(NOT Torch_DIR AND EXISTS "${_torchext_pkg}/../torch/share/cmake/Torch/TorchConfig.cmake")
    set(Torch_DIR "${_torchext_pkg}/../torch/share/cmake/Torch")
  endif()
  find_dependency(Torch)
endif()

file(GLOB _torchext_lib "${_torchext_pkg}/_C*.so" "${_torchext_pkg}/_C*.dylib")
if(NOT _torchext_lib)
  set(torchext_FOUND FALSE)
  set(torchext_NOT_FOUND_MESSAGE
      "torchext's compiled library is missing from ${_torchext_pkg}: build it first "
      "(pip install --no-build-isolation -e .)")
  return()
endif()
list(GET _torchext_lib 0 _torchext_lib)

set(_torchext_inc "")
foreach(_d "${_torchext_pkg}/include" "${_torchext_pkg}/../csrc/include")
  if(NOT _torchext_inc AND EXISTS "${_d}/torchext/torchext.h")
    get_filename_component(_torchext_inc "${_d}" ABSOLUTE)
  endif()
endforeach()
if(NOT _torchext_inc)
  set(torchext_FOUND FALSE)
  set(torchext_NOT_FOUND_MESSAGE "torchext's C++ headers (torchext/torchext.h) are missing "
      "from ${_torchext_pkg}/include")
  return()
endif()

# The library must be the one built for this torch (torchext/_build_info.py).
if(EXISTS "${_torchext_pkg}/_build_info.py" AND DEFINED Torch_VERSION)
  file(STRINGS "${_torchext_pkg}/_build_info.py" _torchext_tv REGEX "^TORCH_VERSION")
  string(REGEX REPLACE "^TORCH_VERSION = '([^'+]*).*" "\\1" _torchext_tv "${_torchext_tv}")
  if(_torchext_tv AND NOT _torchext_tv VERSION_EQUAL Torch_VERSION)
    message(WARNING "torchext in ${_torchext_pkg} was built against torch ${_torchext_tv}, "
                    "but CMake found torch ${Torch_VERSION}")
  endif()
endif()

add_library(torchext::torchext SHARED IMPORTED)
set_target_properties(torchext::torchext PROPERTIES
  IMPORTED_LOCATION "${_torchext_lib}"
  INTERFACE_INCLUDE_DIRECTORIES "${_torchext_inc}"
  INTERFACE_LINK_LIBRARIES "${TORCH_LIBRARIES}"
  # Loading the library registers the ops: keep it under --as-needed too.
  INTERFACE_LINK_OPTIONS "LINKER:--no-as-needed"
  INTERFACE_COMPILE_FEATURES cxx_std_20)
if(NOT APPLE)
  # _C.abi3.so has no SONAME: the path given at link time is recorded, and
  # the rpath lets the program find it at run time.
  get_filename_component(_torchext_libdir "${_torchext_lib}" DIRECTORY)
  set_property(TARGET torchext::torchext APPEND PROPERTY INTERFACE_LINK_OPTIONS
               "LINKER:-rpath,${_torchext_libdir}")
endif()
set(torchext_LIBRARY "${_torchext_lib}")
set(torchext_INCLUDE_DIR "${_torchext_inc}")
set(torchext_LIBRARIES torchext::torchext)
set(torchext_FOUND TRUE)
