// plugin.hpp included from two translation units links: every function is inline.
#include <switchyard/plugin.hpp>

int two_tu_b();

int main() {
    switchyard_error error{nullptr, 0};
    int32_t status = switchyard::detail::guard(&error, nullptr, [] { throw switchyard::Error("x"); });
    return (status == SWITCHYARD_STATUS_ERROR && two_tu_b() == SWITCHYARD_STATUS_PANIC) ? 0 : 1;
}
