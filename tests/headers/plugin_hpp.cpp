// plugin.hpp compiles on its own as C++17 with -Wall -Wextra -Wpedantic -Werror.
#include <switchyard/plugin.hpp>

int switchyard_header_check_hpp() { return static_cast<int>(switchyard::inputs::cache); }
