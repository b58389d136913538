# Sources of the libraries that the fuzz project (fuzz/CMakeLists.txt) also
# builds, instrumented, from the same lists.
set(FLEET_PROTO_SOURCES ${CMAKE_CURRENT_LIST_DIR}/codec.cc
  ${CMAKE_CURRENT_LIST_DIR}/msgpack_read.cc)
set(FLEET_PROM_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/prom_text.cc
  ${CMAKE_CURRENT_LIST_DIR}/prom_api.cc
  ${CMAKE_CURRENT_LIST_DIR}/http_client.cc)
