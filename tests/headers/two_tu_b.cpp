#include <switchyard/plugin.hpp>

int two_tu_b() {
    switchyard_error error{nullptr, 0};
    bool poisoned = false;
    int32_t status = switchyard::detail::guard(&error, &poisoned, [] { throw std::runtime_error("y"); });
    return poisoned ? status : -1;
}
