# `cmake --install`: the library, its public headers, the `kiln` command and a CMake config package, so that
# a project elsewhere builds against it with
#   find_package(Kiln REQUIRED)
#   target_link_libraries(app PRIVATE Kiln::kiln)
# (examples/cpp is such a project). Kiln is a static library: the config finds the libraries it links to
# (OpenMP, MPI, libpng, nlohmann_json; oneDNN by path) so that Kiln::kiln brings them along.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(KILN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Kiln)
install(TARGETS kiln EXPORT KilnTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/kiln DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS kiln_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT KilnTargets NAMESPACE Kiln:: DESTINATION ${KILN_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/KilnConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/KilnConfig.cmake INSTALL_DESTINATION ${KILN_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/KilnConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/KilnConfig.cmake ${PROJECT_BINARY_DIR}/KilnConfigVersion.cmake
        DESTINATION ${KILN_CMAKE_DIR})
