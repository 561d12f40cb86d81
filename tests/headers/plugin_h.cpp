// plugin.h compiles on its own as C++17 with -Wall -Wextra -Wpedantic -Werror.
#include <switchyard/plugin.h>

int switchyard_header_check_h_cxx() { return SWITCHYARD_ABI_MAJOR; }
