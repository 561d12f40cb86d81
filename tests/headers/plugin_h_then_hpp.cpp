// plugin.h, then plugin.hpp (which includes plugin.h again), in one translation unit.
#include <switchyard/plugin.h>
#include <switchyard/plugin.hpp>

int main() { return SWITCHYARD_ABI_MAJOR == 1 ? 0 : 1; }
