/* plugin.h compiles on its own as C11 with -Wall -Wextra -Wpedantic -Werror. */
#include <switchyard/plugin.h>

int switchyard_header_check_c(void);
int switchyard_header_check_c(void) { return SWITCHYARD_ABI_MAJOR; }
