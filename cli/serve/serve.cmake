# `kiln serve` (cli/serve/): the HTTP server, in a library of its own that only the kiln binary and its tests
# link (the flag fuzzer and the sanitizer builds do not compile it). Its request parser is a library apart,
# which the parser's fuzz target links without the server. HTTP: Debian's libcpp-httplib-dev, a compiled
# library whose pkg-config file carries the definitions its header must be read with. The request parsers
# (Kiln's and AUTOMATIC1111's bodies, an edit's form) are that library.
find_package(PkgConfig REQUIRED)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)

set(KILN_SERVE_PARAMS_SOURCES ${PROJECT_SOURCE_DIR}/cli/serve/generation_params.cpp
    ${PROJECT_SOURCE_DIR}/cli/serve/a1111_params.cpp ${PROJECT_SOURCE_DIR}/cli/serve/edit_form.cpp
    ${PROJECT_SOURCE_DIR}/cli/serve/base64.cpp)
add_library(kiln_serve_params STATIC ${KILN_SERVE_PARAMS_SOURCES})
kiln_warnings(kiln_serve_params ${KILN_COLD_CODE_OPTIONS})
target_include_directories(kiln_serve_params PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(kiln_serve_params PUBLIC kiln PRIVATE nlohmann_json::nlohmann_json)

# The web page, compiled in: each file of cli/serve/web/ becomes a byte array (embed_web.cmake).
file(GLOB KILN_SERVE_WEB CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/cli/serve/web/*)
set(KILN_SERVE_WEB_INC ${CMAKE_CURRENT_BINARY_DIR}/serve_web/serve_web_assets.inc)
add_custom_command(OUTPUT ${KILN_SERVE_WEB_INC}
                   COMMAND ${CMAKE_COMMAND} -DOUTPUT=${KILN_SERVE_WEB_INC} "-DINPUTS=${KILN_SERVE_WEB}"
                           -P ${PROJECT_SOURCE_DIR}/cli/serve/embed_web.cmake
                   DEPENDS ${KILN_SERVE_WEB} ${PROJECT_SOURCE_DIR}/cli/serve/embed_web.cmake
                   COMMENT "Embedding the web page of kiln serve" VERBATIM)

file(GLOB KILN_SERVE_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/cli/serve/*.cpp)
list(REMOVE_ITEM KILN_SERVE_SOURCES ${KILN_SERVE_PARAMS_SOURCES})
add_library(kiln_serve STATIC ${KILN_SERVE_SOURCES} ${KILN_SERVE_WEB_INC})
kiln_warnings(kiln_serve ${KILN_COLD_CODE_OPTIONS})
target_include_directories(kiln_serve PRIVATE ${CMAKE_CURRENT_BINARY_DIR}/serve_web)
target_link_libraries(kiln_serve PUBLIC kiln_serve_params kiln_cli_commands PkgConfig::HTTPLIB
                                        nlohmann_json::nlohmann_json)
