# `cmake --install BUILD [--prefix P]`: the programs, and the C++ SDK as a
# CMake package, so that a project does
#
#   find_package(fleet REQUIRED)      # with P on CMAKE_PREFIX_PATH
#   target_link_libraries(app PRIVATE fleet::client)   # or fleet::worker
#
# The SDK's headers are include/fleet/*.h alone. Its libraries are static;
# the package also exports the internal libraries they link (fleet::proto,
# fleet::common, fleet::metrics: no headers of theirs are installed) and
# finds, through fleetConfig.cmake, the Debian packages those use.
include(CMakePackageConfigHelpers)

install(TARGETS fleet-broker fleet-worker fleet-submit fleet-ctl fleet-autoscaler
  fleet-autoscaler-sim RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set_target_properties(fleet_proto PROPERTIES EXPORT_NAME proto)
set_target_properties(fleet_common PROPERTIES EXPORT_NAME common)
set_target_properties(fleet_metrics PROPERTIES EXPORT_NAME metrics)
install(TARGETS fleet_client fleet_worker_lib fleet_proto fleet_common fleet_metrics
  EXPORT fleetTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/fleet
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(FLEET_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/fleet)
install(EXPORT fleetTargets NAMESPACE fleet:: DESTINATION ${FLEET_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/fleetConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/fleetConfig.cmake INSTALL_DESTINATION ${FLEET_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/fleetConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/fleetConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/fleetConfigVersion.cmake DESTINATION ${FLEET_CMAKE_DIR})
