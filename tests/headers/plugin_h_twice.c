/* plugin.h included twice in one translation unit compiles (its C helpers are guarded
 * too, not only the ABI). */
#include <switchyard/plugin.h>
#include <switchyard/plugin.h>

int main(void) {
    char buffer[8];
    switchyard_error error = {buffer, sizeof buffer};
    switchyard_error_printf(&error, "%d", SWITCHYARD_ABI_MAJOR);
    return buffer[0] == '1' ? 0 : 1;
}
